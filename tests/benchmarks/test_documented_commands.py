"""Every benchmark command of docs/benchmarks.md is accepted by its script's own argument parser.

They run for minutes to hours on this CPU, or need a GPU (each says so: `# needs: ...`); the scripts themselves run
end to end at tiny settings in test_benchmarks.py. Here each documented command line goes through the script's
`parse_args` (the one its `main` calls), so a renamed flag, a dropped shape or loss, or a bad value fails.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.doc_commands import DocCommand, commands_of, ids
from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module

COMMANDS = commands_of("benchmarks")
BENCHMARKS = REPO_ROOT / "benchmarks"


def _script(path: Path) -> ModuleType:
    """The benchmark script as a module (its imports at the top are the standard library and `_harness`)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # the scripts import their `_harness` as a sibling
    return load_module(f"distmatch_documented_{path.stem}", path)


def test_every_benchmark_script_is_documented() -> None:
    documented = {Path(c.program_argv[1]).name for c in COMMANDS}
    scripts = {p.name for p in BENCHMARKS.glob("bench_*.py")}
    assert documented == scripts, (documented, scripts)


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_documented_benchmark_command_is_accepted(command: DocCommand) -> None:
    script = REPO_ROOT / command.program_argv[1]
    assert script.is_file(), f"{command.where}: no {script}"
    module = _script(script)
    try:
        args = module.parse_args(command.program_argv[2:])
    except SystemExit as err:
        pytest.fail(
            f"{command.where}: `{command.text}` is refused by {script.name}'s parser (exit {err.code})"
        )
    assert not getattr(args, "_worker", None)


def test_a_wrong_flag_is_refused() -> None:
    """The check above can fail: the parser exits on what it does not know."""
    module = _script(BENCHMARKS / "bench_losses.py")
    for argv in (["--shapes", "llama3-80b"], ["--no-such-flag"]):
        with pytest.raises(SystemExit):
            module.parse_args(argv)
