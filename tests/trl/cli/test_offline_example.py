"""The offline example builder, `python -m trl_ext.testing DIR`, feeds `trl sft` on a CPU machine: the command it
prints (its data folder as `--dataset_name`, `--use_cpu`) trains as printed, through the wheel's activation hook."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import WheelVenv, run_cli, tail
from tests.helpers.env import REPO_ROOT
from tests.helpers.warm_cli import WarmCli


@pytest.mark.slow
def test_the_printed_trl_command_trains_on_cpu(wheel_venv: WheelVenv, tmp_path: Path) -> None:
    built = run_cli([wheel_venv.python, "-m", "trl_ext.testing", "tiny", "--examples", "32"], tmp_path)
    assert built.returncode == 0, tail(built)
    (printed,) = [line for line in built.stdout.splitlines() if line.startswith("trl sft ")]
    argv = shlex.split(printed.split("#")[0])
    assert argv[argv.index("--dataset_name") + 1] == "tiny/data" and "--use_cpu" in argv, printed
    assert (tmp_path / "tiny" / "data" / "train.jsonl").is_file()
    argv[argv.index("--max_steps") + 1] = "2"  # as printed, shorter
    out = run_cli([wheel_venv.trl, *argv[1:], "--report_to", "none", "--disable_tqdm", "true"], tmp_path)
    assert out.returncode == 0, tail(out)
    (state,) = (tmp_path / "tiny" / "out").glob("checkpoint-*/trainer_state.json")
    assert json.loads(state.read_text())["global_step"] == 2
    record = json.loads((state.parent / "distmatch.json").read_text())  # trained with the distmatch loss
    assert record["loss"] == "gem_ls", record
    # Run as README says, from the repository's root, all it writes (model, data, the run) is ignored by git.
    written = sorted(
        p.relative_to(tmp_path).as_posix() for p in (tmp_path / "tiny").rglob("*") if p.is_file()
    )
    check = subprocess.run(
        ["git", "check-ignore", "--no-index", "--verbose", "--non-matching", "--stdin"],
        cwd=REPO_ROOT,
        input="\n".join(written),
        capture_output=True,
        text=True,
        timeout=60,
    )
    not_ignored = [line.split("\t")[1] for line in check.stdout.splitlines() if line.startswith("::")]
    assert written and not not_ignored, not_ignored


@pytest.mark.slow
def test_a_data_file_as_dataset_name_is_refused_before_launch(
    wheel_venv: WheelVenv, warm_cli: WarmCli, tmp_path: Path
) -> None:
    built = warm_cli.run([wheel_venv.python, "-m", "trl_ext.testing", "tiny", "--examples", "8"], tmp_path)
    assert built.returncode == 0, tail(built)
    args = [
        "sft",
        "--loss",
        "gem_ls",
        "--model_name_or_path",
        "tiny/model",
        "--output_dir",
        "out",
        "--use_cpu",
    ]
    for program in (wheel_venv.trl, wheel_venv.distmatch_trl):
        out = warm_cli.run([program, *args, "--dataset_name", "tiny/data/train.jsonl"], tmp_path)
        lines = [line for line in out.stderr.splitlines() if "error: " in line]
        assert out.returncode == 2 and "Traceback" not in out.stderr, tail(out)
        assert len(lines) == 1 and "dataset_name='tiny/data/train.jsonl' is a file" in lines[0], tail(out)
        assert "Give the folder holding it (tiny/data" in lines[0], lines[0]
        assert not (tmp_path / "out").exists()  # nothing launched
