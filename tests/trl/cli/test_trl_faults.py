"""Faults around a real `trl sft` run (the reliability rows of docs/refusals.md): a second run into the folder
another run is writing, `kill -9` then resume, and a disk that fills up while a checkpoint is saved.

Real processes from the wheel venv (as in test_trl_sft.py), the tiny Llama built in code, offline. The runs that
are killed, refused or fill the disk start cold; the resumes, whose claim is the checkpoint, are forked from the warm
interpreter (tests/helpers/warm_cli.py). The disk-full case mounts a small tmpfs in a private mount namespace
(`unshare -m`, root only: skipped with the reason otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cli import cli_env, run_cli, tail, tiny_sft_args
from tests.helpers.tiny_model import build_tiny_llama, write_sft_jsonl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tiny")
    (base / "data").mkdir()
    write_sft_jsonl(base / "data" / "train.jsonl", n=48)
    return {"model": build_tiny_llama(base / "model"), "data": base / "data"}


def _args(tiny: dict[str, Path], out: Path, max_steps: int, *extra: str) -> list[str]:
    return ["--loss", "gem_ls", *tiny_sft_args(tiny, out, max_steps, *extra)]


def _complete_checkpoints(out: Path) -> list[Path]:
    found = [c for c in out.glob("checkpoint-*") if (c / "trainer_state.json").is_file()]
    return sorted(found, key=lambda c: int(c.name.split("-")[1]))


def _wait_for(predicate, timeout: float, what: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the first run ended (rc={process.returncode}) before {what}\n{err[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_second_run_into_a_busy_folder_is_refused_and_kill9_then_resume_continues(
    wheel_venv, warm_cli, tiny, tmp_path
):
    """Two identical runs started into `out` 0.3 s apart: one is refused in one line by its launcher (exit 2, no
    traceback) and the other trains (a checkpoint per step); a third run into `out` is refused the same way while it
    runs; the survivor is killed with SIGKILL; a resume from its newest complete checkpoint in the same folder (the
    kernel released the lock) trains to its last step."""
    out = tmp_path / "out"
    refusal = (
        f"error: output_dir={str(out)!r} is being written by another training run; give this run another "
        "`output_dir` (two runs in one folder would overwrite each other's checkpoints), or wait for it to end."
    )

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [str(wheel_venv.trl), "sft", *_args(tiny, out, 100000, "--save_total_limit", "3")],
            cwd=tmp_path,
            env=cli_env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    runs = [start()]
    time.sleep(0.3)
    runs.append(start())
    try:
        deadline = time.monotonic() + 300
        while all(r.poll() is None for r in runs):
            assert time.monotonic() < deadline, "neither run ended: the second was not refused"
            time.sleep(0.1)
        (refused,) = [r for r in runs if r.poll() is not None]
        (first,) = [r for r in runs if r is not refused]
        _, err = refused.communicate()
        assert refused.returncode == 2 and "Traceback" not in err, err[-4000:]
        assert [line for line in err.splitlines() if line.startswith("error: ")] == [refusal], err[-4000:]
        _wait_for(lambda: len(_complete_checkpoints(out)) >= 2, 300, "two checkpoints", first)
        second = run_cli([wheel_venv.trl, "sft", *_args(tiny, out, 1)], tmp_path)
        assert second.returncode == 2, tail(second)
        assert "Traceback" not in second.stderr, tail(second)
        errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
        assert errors == [refusal], tail(second)
        assert first.poll() is None  # the survivor is unaffected
    finally:
        for r in runs:
            if r.poll() is None:
                os.killpg(r.pid, signal.SIGKILL)
            if not r.stderr.closed:
                r.communicate()
    assert first.returncode == -signal.SIGKILL
    newest = _complete_checkpoints(out)[-1]
    step = json.loads((newest / "trainer_state.json").read_text())["global_step"]
    resumed = warm_cli.run(
        [wheel_venv.trl, "sft", *_args(tiny, out, step + 2, "--resume_from_checkpoint", str(newest))],
        tmp_path,
    )
    assert resumed.returncode == 0, tail(resumed)
    state = json.loads((_complete_checkpoints(out)[-1] / "trainer_state.json").read_text())
    assert state["global_step"] == step + 2
    losses = [entry for entry in state["log_history"] if "loss" in entry]
    assert losses and all("ce" in entry for entry in losses)  # the distmatch trainer's metrics


def _can_mount_tmpfs(tmp_path: Path) -> str | None:
    if shutil.which("unshare") is None:
        return "no `unshare`"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return (
        None
        if probe.returncode == 0
        else f"cannot mount a tmpfs in a mount namespace: {probe.stderr.strip()}"
    )


def test_disk_full_while_saving_keeps_the_last_complete_checkpoint(wheel_venv, warm_cli, tiny, tmp_path):
    """The output folder is an 800 KiB tmpfs: checkpoint-1 (~530 KiB) fits, checkpoint-2 does not. The run stops
    with a non-zero status and one message naming the removed half-written checkpoint and the one to resume from.
    Resuming from it elsewhere trains on."""
    reason = _can_mount_tmpfs(tmp_path)
    if reason:
        pytest.skip(reason)
    out = tmp_path / "out"
    out.mkdir()
    keep = tmp_path / "kept"  # the tmpfs vanishes with its namespace: copy what is on it before leaving
    command = " ".join(
        [f"mount -t tmpfs -o size=800k tmpfs {out} &&", str(wheel_venv.trl), "sft", *_args(tiny, out, 4)]
    )
    command += f"; rc=$?; cp -r {out} {keep}; exit $rc"
    full = run_cli(["unshare", "-m", "sh", "-c", command], tmp_path)
    assert full.returncode == 1, tail(full)
    message = next(
        line for line in full.stderr.splitlines() if "distmatch: no space left on the device" in line
    )
    assert f"while saving {out / 'checkpoint-2'} (removed: it was incomplete)" in message, message
    assert f"resume from {out / 'checkpoint-1'}" in message, message
    assert sorted(p.name for p in keep.glob("checkpoint-*")) == ["checkpoint-1"]  # no half-written checkpoint
    assert (keep / "checkpoint-1" / "trainer_state.json").is_file()
    resumed = warm_cli.run(
        [
            wheel_venv.trl,
            "sft",
            *_args(tiny, tmp_path / "again", 2, "--resume_from_checkpoint", str(keep / "checkpoint-1")),
        ],
        tmp_path,
    )
    assert resumed.returncode == 0, tail(resumed)
    state = json.loads((tmp_path / "again" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
