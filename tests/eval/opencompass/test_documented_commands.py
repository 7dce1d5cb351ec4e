"""Every `opencompass ...` command of README.md and docs/ is accepted by OpenCompass 0.5.4 and builds its config.

Each documented command goes through OpenCompass's own `parse_args` and `get_config_from_arg` (what `opencompass`
does before it partitions and runs anything), with `$(python -m eval_tasks.opencompass_configs)` replaced by what
that command prints: the `--datasets` and `--summarizer` names must resolve to our config files, the model to the
documented path, and every summary group must only name datasets the command evaluates (or other groups). Running
them needs a GPU-sized model and the Hub's data sets (each says so: `# needs: ...`); a real OpenCompass run on a tiny
model and fixture data is test_configs.py's `oc_run`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

from tests.helpers.doc_commands import DocCommand, commands_of, ids, substitutions
from tests.helpers.env import REPO_ROOT

pytest.importorskip("opencompass")

COMMANDS = commands_of("opencompass")


def _expand(command: DocCommand) -> list[str]:
    """The command's words with each `$(python -m ...)` replaced by its output (this interpreter, this checkout)."""
    text = command.text
    for inner in substitutions(text):
        argv = shlex.split(inner)
        assert argv[0] == "python", f"{command.where}: `$({inner})`"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        printed = subprocess.run(
            [sys.executable, *argv[1:]], capture_output=True, text=True, check=True, env=env, cwd=REPO_ROOT
        ).stdout.strip()
        text = text.replace(f"$({inner})", printed)
    return shlex.split(text)


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_documented_opencompass_command_builds_its_config(command: DocCommand, monkeypatch) -> None:
    from opencompass.cli.main import parse_args
    from opencompass.utils.run import get_config_from_arg

    argv = _expand(command)
    assert argv[0] == "opencompass", command.text
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setattr(sys, "argv", argv)
    try:
        args = parse_args()
    except SystemExit as err:
        pytest.fail(f"{command.where}: `{command.text}` is refused by OpenCompass's parser (exit {err.code})")
    cfg = get_config_from_arg(args)
    abbrs = {d["abbr"] for d in cfg["datasets"]}
    assert abbrs and all(a.startswith("distmatch_") for a in abbrs), (command.where, sorted(abbrs)[:5])
    ((model,),) = [cfg["models"]]
    assert model["path"] == args.hf_path and args.hf_type == "base", (command.where, model)
    groups = cfg["summarizer"]["summary_groups"]
    names = {g["name"] for g in groups}
    for group in groups:
        unknown = [s for s in group["subsets"] if s not in abbrs | names]
        assert not unknown, (
            f"{command.where}: summary group {group['name']} names {unknown[:5]}, not evaluated"
        )
    assert set(cfg["summarizer"]["dataset_abbrs"]) <= abbrs | names, command.where
