"""The documented offline Axolotl run (README.md, docs/axolotl.md) runs as written: build the tiny model and data,
then `axolotl train examples/axolotl/tiny-cpu.yaml --launcher python`.

Each page's commands run one after the other in a scratch folder that holds a copy of the repository files they name
(the YAML's relative paths then land there, not in the checkout), with this venv's binaries for `.venv-axolotl/bin/`
(so .venv-axolotl-latest runs them too) and this checkout first on PYTHONPATH. A page whose commands are the same as
an earlier page's is not run twice. Real runs, no mocks: about a minute and a half on a loaded 2-core CPU.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.doc_commands import DocCommand, by_page, commands_of, ids
from tests.helpers.env import OFFLINE_ENV, REPO_ROOT

pytest.importorskip("axolotl")

pytestmark = pytest.mark.slow

COMMANDS = commands_of("axolotl")
UNMARKED = [c for c in COMMANDS if not c.needs]


def _argv(command: DocCommand) -> list[str]:
    argv = command.program_argv
    program = Path(sys.executable).parent / argv[0]
    if command.venv_bin is None and not program.exists():
        return argv  # from PATH
    return [str(program), *argv[1:]]


def _run_page(commands: list[DocCommand], root: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    for command in commands:  # the repository files the commands name, at the same relative paths
        for word in command.program_argv[1:]:
            if (REPO_ROOT / word).is_file():
                (root / word).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO_ROOT / word, root / word)
    env = {**os.environ, **OFFLINE_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    done = {}
    for command in commands:
        done[command.text] = subprocess.run(
            _argv(command),
            cwd=root,
            env={**env, **command.env},
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done[command.text].returncode:
            break
    return done


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str], tuple[Path, subprocess.CompletedProcess[str]]]:
    """(page, command text) -> (the page's scratch folder, the finished process)."""
    results: dict[tuple[str, str], tuple[Path, subprocess.CompletedProcess[str]]] = {}
    seen: dict[tuple[str, ...], str] = {}
    for page, commands in by_page(UNMARKED).items():
        texts = tuple(c.text for c in commands)
        if texts in seen:  # the same sequence as an earlier page: its results stand for this page's too
            results.update({(page, t): results[(seen[texts], t)] for t in texts})
            continue
        seen[texts] = page
        root = tmp_path_factory.mktemp("axolotl_documented")
        for text, process in _run_page(commands, root).items():
            results[(page, text)] = (root, process)
    return results


def test_every_command_runs_here() -> None:
    """The offline example needs nothing this machine lacks: none of its commands is marked."""
    assert COMMANDS and COMMANDS == UNMARKED, [c.where for c in COMMANDS if c.needs]
    assert any("axolotl train" in " ".join(c.program_argv) for c in COMMANDS), ids(COMMANDS)


@pytest.mark.parametrize("command", UNMARKED, ids=ids(UNMARKED))
def test_documented_axolotl_command_runs(command: DocCommand, runs) -> None:
    assert (command.page, command.text) in runs, (
        f"{command.where}: not run: an earlier command of the page failed"
    )
    root, done = runs[(command.page, command.text)]
    output = done.stdout + done.stderr
    assert done.returncode == 0, (
        f"{command.where}: `{command.text}` exited {done.returncode}:\n{output[-4000:]}"
    )
    argv = command.program_argv
    if argv[:3] == ["python", "-m", "trl_ext.testing"]:
        folder = root / argv[3]
        built = [folder / "model" / "config.json", folder / "data" / "train.jsonl"]
        assert all(path.is_file() for path in built), output[-2000:]
    else:  # axolotl train <config>: the objective is logged next to plain CE and the adapter is saved
        import yaml

        config = yaml.safe_load((root / argv[2]).read_text())
        assert "'ce':" in output and "'entropy':" in output, output[-3000:]
        saved = root / config["output_dir"]
        assert list(saved.glob("adapter_model.*")), sorted(p.name for p in saved.iterdir())
        if config.get("use_tensorboard"):  # the example's tracker got the distmatch metrics of every step
            scalars = _tensorboard_scalars(saved)
            for name in ("loss", "ce", "entropy", "mean_token_accuracy"):
                values = scalars.get(f"train/{name}", [])
                assert len(values) == config["max_steps"], (name, sorted(scalars))
                assert all(math.isfinite(v) for v in values), (name, values)


def _tensorboard_scalars(folder: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = sorted(folder.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {folder}"
    scalars: dict[str, list[float]] = {}
    for event_file in events:
        accumulator = EventAccumulator(str(event_file))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend(e.value for e in accumulator.Scalars(tag))
    return scalars
