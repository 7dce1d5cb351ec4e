"""Resuming through the command line (`trl_ext/resume.py`, the checks in `trl_ext/cli.py`, the TRL hook): a run
records its loss in every checkpoint, a resume without `--loss` continues with it, another loss is refused unless
`--allow_loss_change`.

Real processes, offline, the tiny model built in code: `trl sft --loss emo --save_steps 1 --max_steps 1` once, then
each test resumes from its `checkpoint-1` into its own output folder. The wheel venv is the one of
test_trl_sft.py (`wheel_venv` fixture, tests/conftest.py). Runs in `.venv` (TRL 1.16) and `.venv-axolotl` (TRL 1.9):
the `trl_cli` marker (set on tests/trl/cli/).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import WheelVenv, tail, tiny_sft_args
from tests.helpers.tiny_model import build_tiny_llama, write_sft_jsonl
from tests.helpers.warm_cli import WarmCli

pytestmark = pytest.mark.slow

ADOPTED = "without a loss: training continues with the recorded loss=emo"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, wheel_venv: WheelVenv, warm_cli: WarmCli) -> dict[str, Path]:
    """The tiny model and data, and `checkpoint`: checkpoint-1 of `trl sft --loss emo --max_steps 1`."""
    base = tmp_path_factory.mktemp("resume")
    (base / "data").mkdir()
    write_sft_jsonl(base / "data" / "train.jsonl", n=16)
    tiny = {"model": build_tiny_llama(base / "model"), "data": base / "data"}
    first = base / "first"
    out = warm_cli.run([wheel_venv.trl, "sft", "--loss", "emo", *tiny_sft_args(tiny, first, 1)], base)
    assert out.returncode == 0, tail(out)
    return {**tiny, "checkpoint": first / "checkpoint-1", "first": first}


def _record(folder: Path) -> dict:
    return json.loads((folder / "distmatch.json").read_text())


def _last_log(output_dir: Path) -> dict:
    """The step-2 training log of the resumed run (its checkpoint-2's trainer_state.json)."""
    state = json.loads((output_dir / "checkpoint-2" / "trainer_state.json").read_text())
    (entry,) = [e for e in state["log_history"] if e.get("step") == 2 and "loss" in e]
    return entry


def _steps_trained(out: subprocess.CompletedProcess) -> int:
    """The training logs the run printed: 1 when it resumed at step 1 of 2 (2 from scratch)."""
    return out.stdout.count("{'loss': ")


def _one_line_error(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, tail(out)
    assert "Traceback" not in out.stderr, tail(out)
    errors = [line for line in out.stderr.splitlines() if "error: " in line]
    assert len(errors) == 1, tail(out)
    return errors[0]


def test_the_run_records_its_loss_in_every_checkpoint_and_the_output(tiny):
    from trl_ext.options import OPTION_DEFAULTS

    for folder in (tiny["checkpoint"], tiny["first"]):
        record = _record(folder)
        assert (record["loss"], record["framework"]) == ("emo", "trl"), record
        assert record["options"] == OPTION_DEFAULTS  # every option, defaults filled in
        assert record["distmatch_version"]
    card = (tiny["first"] / "README.md").read_text()  # TRL's model card names the objective
    assert "- distmatch-loss-emo" in card and "- distmatch\n" in card


@pytest.mark.parametrize("command", ["trl", "distmatch-trl"])
def test_resume_without_loss_continues_with_the_recorded_loss(wheel_venv, warm_cli, tiny, tmp_path, command):
    """No `--loss`: `trl sft` alone would train TRL's cross-entropy; the hook sees the checkpoint's record."""
    program = wheel_venv.trl if command == "trl" else wheel_venv.distmatch_trl
    resume = ["--resume_from_checkpoint", str(tiny["checkpoint"])]
    out = warm_cli.run([program, "sft", *resume, *tiny_sft_args(tiny, tmp_path / "out", 2)], tmp_path)
    assert out.returncode == 0, tail(out)
    said = [line for line in (out.stdout + out.stderr).splitlines() if ADOPTED in line]
    assert len(said) == 1 and str(tiny["checkpoint"] / "distmatch.json") in said[0], tail(out)
    assert _steps_trained(out) == 1, tail(out)  # resumed (TRL 1.9's script alone would start from scratch)
    step2 = _last_log(tmp_path / "out")
    assert {"demd", "ce"} <= step2.keys(), step2  # EMO trained step 2
    assert _record(tmp_path / "out" / "checkpoint-2")["loss"] == "emo"


@pytest.mark.parametrize("command", ["trl", "distmatch-trl"])
def test_resume_with_another_loss_is_refused(wheel_venv, warm_cli, tiny, tmp_path, command):
    program = wheel_venv.trl if command == "trl" else wheel_venv.distmatch_trl
    resume = ["--resume_from_checkpoint", str(tiny["checkpoint"])]
    out = warm_cli.run(
        [program, "sft", "--loss", "gem_ls", *resume, *tiny_sft_args(tiny, tmp_path / "out", 2)], tmp_path
    )
    line = _one_line_error(out)
    assert "trained with loss=emo" in line and "asks for loss=gem_ls" in line, line
    assert str(tiny["checkpoint"] / "distmatch.json") in line and "allow_loss_change" in line, line
    assert not (tmp_path / "out").exists()  # refused while parsing: nothing loaded, nothing trained


def test_resume_with_other_options_is_refused(wheel_venv, warm_cli, tiny, tmp_path):
    resume = ["--resume_from_checkpoint", str(tiny["checkpoint"])]
    flags = ["--loss", "emo", "--emo_weighting", "emo2", *resume]
    line = _one_line_error(
        warm_cli.run([wheel_venv.trl, "sft", *flags, *tiny_sft_args(tiny, tmp_path / "o", 2)], tmp_path)
    )
    assert "emo_weighting='emo1'" in line and "emo_weighting='emo2'" in line, line


def test_resume_with_allow_loss_change_trains_the_new_loss(wheel_venv, warm_cli, tiny, tmp_path):
    resume = ["--resume_from_checkpoint", str(tiny["checkpoint"]), "--allow_loss_change"]
    out = warm_cli.run(
        [wheel_venv.trl, "sft", "--loss", "gem_ls", *resume, *tiny_sft_args(tiny, tmp_path / "out", 2)],
        tmp_path,
    )
    assert out.returncode == 0, tail(out)
    assert "with loss=gem_ls (gem_beta=0.7) as asked (allow_loss_change)" in out.stderr, tail(out)
    assert _steps_trained(out) == 1, tail(out)
    step2 = _last_log(tmp_path / "out")
    assert "demd" not in step2 and abs(step2["loss"] - step2["ce"]) > 1.0, step2  # GEM's objective, not EMO's
    assert _record(tmp_path / "out" / "checkpoint-2")["loss"] == "gem_ls"
