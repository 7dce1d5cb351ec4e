"""Every `trl sft` / `distmatch-trl sft` command shown in README.md and docs/ is accepted by our parser and checks.

The commands are read from the fenced shell blocks of the pages (line continuations joined, comments dropped) and
parsed exactly as `distmatch-trl sft` and the `trl sft` hook parse them (TRL's parser over `DistMatchSFTConfig`, then
`check_parsed`): a documented command that would be refused (an option of another loss, a loss with another
`loss_type`, ...) fails here. Model and data stay as written: parsing reads no weights, and a hub id is not fetched
(its vocabulary is then unknown); `--use_cpu` is added (this machine has no GPU). Training them needs GPUs and the hub; the tiny end-to-end runs are in
test_trl_sft.py.
"""

from __future__ import annotations

import re
import shlex

import pytest

from tests.helpers.env import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.M | re.S)
PROGRAMS = ("trl sft", "distmatch-trl sft")


def documented_sft_commands() -> list[tuple[str, str]]:
    """(page:line, command) for every `trl sft ...` / `distmatch-trl sft ...` line of a shell block."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in FENCE.finditer(text):
            first_line = text.count("\n", 0, block.start(1)) + 1
            pending: list[str] = []
            for number, line in enumerate(block.group(1).splitlines(), first_line):
                pending.append(line.rstrip())
                if pending[-1].endswith("\\"):
                    pending[-1] = pending[-1][:-1]
                    continue
                command = " ".join(shlex.split(" ".join(pending), comments=True))
                if command.startswith(tuple(program + " " for program in PROGRAMS)):
                    found.append((f"{page.relative_to(REPO_ROOT)}:{number - len(pending) + 1}", command))
                pending = []
    return found


COMMANDS = documented_sft_commands()


def test_the_pages_show_sft_commands() -> None:
    """The reader (and this test) would notice if the examples vanished or stopped being shell blocks."""
    assert any(where.startswith("README.md") for where, _ in COMMANDS), COMMANDS
    assert any(where.startswith("docs/trl.md") for where, _ in COMMANDS), COMMANDS


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_documented_command_is_accepted(where: str, command: str, monkeypatch) -> None:
    from trl_ext.cli import check_parsed, make_sft_parser

    monkeypatch.chdir(REPO_ROOT)  # `--config examples/...` as a reader in the repository runs it
    argv = shlex.split(command)
    program = next(p for p in PROGRAMS if command.startswith(p + " "))
    # + `--use_cpu`: transformers refuses the recipes' `bf16: true` on a machine without a GPU while parsing
    argv = [*argv[len(program.split()) :], "--use_cpu", "true"]
    parser = make_sft_parser(prog=program)
    try:
        parsed = parser.parse_args_and_config(
            argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except SystemExit as err:  # argparse's refusal
        pytest.fail(f"{where}: `{command}` is refused by the parser (exit {err.code})")
    check_parsed(parsed[:4])
    training = parsed[1]
    assert training.output_dir, where
