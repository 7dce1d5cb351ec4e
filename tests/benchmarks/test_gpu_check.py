"""The GPU kit and check (tools/gpu_kit.py, tools/gpu_check.sh; docs/benchmarks.md "The GPU check") on the CPU.

`make gpu-kit` needs PyPI, so here: its plan (what is carried beside the image), its wheels and its size check.
The check itself runs as a CPU dry run (`--device cpu`, tiny shapes) with a one-wheel kit whose `.pth` file proves
that the install plan's target folder is what every child process of every step imports from.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers.doc_commands import DocCommand, commands_of, ids
from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module

COMMANDS = commands_of("gpu-check")


def _tool(name: str) -> ModuleType:
    return load_module(f"distmatch_tool_{name}", REPO_ROOT / "tools" / f"{name}.py")


# ---------------------------------------------------------------------------------------------------------------
# make gpu-kit


def test_kit_carries_what_the_image_lacks_or_holds_at_another_version() -> None:
    kit = _tool("gpu_kit")
    image = {"torch": "2.11.0+image", "transformers": "5.17.0", "numpy": "2.5.5", "fsspec": "2026.9.0",
             "huggingface-hub": "1.33.0"}  # fmt: skip
    full = {
        **image,
        "triton": "3.6.0+image",
        "nvidia-cublas-cu13": "13.0",
        "cuda-bindings": "13.0",
        "trl": "1.16.0",
        "fsspec": "2026.8.0",  # datasets asks for another version than the image's: carried, it shadows the image's
    }
    want = {
        "fsspec": "2026.8.0",
        "huggingface-hub": "1.33.0",
        "trl": "1.16.0",
    }  # the hub client: always carried
    assert kit.kit_plan(image, full) == want


def test_stub_wheel_is_a_wheel_pip_reads(tmp_path: Path) -> None:
    kit = _tool("gpu_kit")
    wheel = kit.write_wheel(tmp_path, "torch", "2.11.0+image", {"a.py": "x = 1\n"}, requires=("jinja2",))
    assert wheel.name == "torch-2.11.0+image-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("torch-2.11.0+image.dist-info/METADATA").decode()
        record = zf.read("torch-2.11.0+image.dist-info/RECORD").decode()
    assert "Version: 2.11.0+image" in meta and "Requires-Dist: jinja2" in meta
    assert record.startswith("a.py,sha256=")


def test_size_check_fails_with_one_clear_line(tmp_path: Path) -> None:
    kit = _tool("gpu_kit")
    (tmp_path / "big-1.0-py3-none-any.whl").write_bytes(b"\0" * 2**20)
    ok, line = kit.size_check(tmp_path, REPO_ROOT, limit_mib=48)
    assert ok and line.startswith("gpu-kit size: wheels 1.0 MiB + working tree ") and line.endswith(": fits")
    ok, line = kit.size_check(tmp_path, REPO_ROOT, limit_mib=1)
    assert not ok and "limit 1 MiB (carry limit 64 MiB): TOO BIG" in line


# ---------------------------------------------------------------------------------------------------------------
# tools/gpu_check.py pieces


def test_tokens_per_second_count_only_the_steps_after_warmup() -> None:
    worker = _tool("gpu_check_worker")
    record = {"step_end_s": [10.0, 11.0, 12.0, 14.0], "step_tokens": [100, 300, 500, 900], "peak_mib": 5.0,
              "losses": [2.0, 1.5], "trainer_class": "DistMatchSFTTrainer"}  # fmt: skip
    got = worker.train_summary(record, warmup=1)
    assert got["tokens_per_s"] == pytest.approx(600 / 3) and got["timed_steps"] == 2
    assert got["s_per_step"] == pytest.approx(1.5) and (got["loss_first"], got["loss_last"]) == (2.0, 1.5)
    with pytest.raises(ValueError, match="too few"):
        worker.train_summary({**record, "step_end_s": [1.0], "step_tokens": [5]}, warmup=1)


def test_summary_table_has_every_part_and_the_ratios() -> None:
    check = _tool("gpu_check")
    run = {"tokens_per_s": 1000.0, "peak_mib": 2000.0, "s_per_step": 0.5, "loss_first": 3.0, "loss_last": 2.0,
           "trainer_class": "SFTTrainer", "speed_x_trl": 1.0, "memory_x_trl": 1.0}  # fmt: skip
    ours = {**run, "trainer_class": "DistMatchSFTTrainer", "speed_x_trl": 1.2, "memory_x_trl": 0.9,
            "first_step_after_s": 21.5}  # fmt: skip
    cut = {**ours, "partial": "timeout after 9 of 20 steps"}
    result = {
        "mode": "full on cuda",
        "environment": {
            "date": "2026-11-27 06:00 UTC",
            "device_name": "NVIDIA H100",
            "torch": "2.11.0",
            "python": "3.12.3",
        },  # fmt: skip
        "records": [{"step": "triton", "status": "ok", "rc": 0, "seconds": 12.0}],
        "triton": {
            "counts": {"tests": 59, "failures": 0, "errors": 0, "skipped": 0, "passed": 59},
            "verdict": "pass",
        },
        "train": {
            "runs": {"trl": run, "gem_ls": ours, "ce": cut, "emo": {"error": "timeout"}},
            "steps": 20,
            "warmup_steps": 3,
            "batch_size": 4,
            "seq_len": 2048,
            "model": {"hidden_size": 2048, "num_hidden_layers": 4, "vocab_size": 128256, "params": 7.8e8},
        },  # fmt: skip
    }
    text = check.summary_markdown(result)
    # The process table says how the process ended, never `ok` (whether its work succeeded is the part's verdict).
    assert "NVIDIA H100; torch 2.11.0" in text and "| triton | exit 0 | 12.0 |  |" in text
    assert "| triton | pass | 59 passed, 0 failed, 0 errors, 0 skipped, of 59 tests |" in text
    assert "| bench | not run | |" in text
    assert (
        "| gem_ls | DistMatchSFTTrainer | 1000 | 1.20 | 2000 | 0.90 | 0.500 | 3.000 -> 2.000 | 21.5 |" in text
    )
    assert "| ce | DistMatchSFTTrainer (timeout after 9 of 20 steps) | 1000 |" in text
    assert "| emo | error: timeout |" in text


def test_a_run_stopped_by_its_time_limit_keeps_its_measured_steps(tmp_path: Path) -> None:
    check = _tool("gpu_check")
    probe = tmp_path / "run.probe.json"
    record = {"step_end_s": [10.0, 11.0, 12.0, 14.0], "step_tokens": [100, 300, 500, 900], "peak_mib": 5.0,
              "losses": [2.0, 1.5], "trainer_class": "DistMatchSFTTrainer", "finished": False}  # fmt: skip
    probe.write_text(json.dumps(record))
    got = check.run_result("gem_ls", "timeout", probe, warmup=1, steps=20)
    assert got["partial"] == "timeout after 4 of 20 steps" and got["tokens_per_s"] == pytest.approx(200)
    assert check.run_result("gem_ls", "ok", probe.with_name("x"), 1, 20) == {"error": "no probe record"}
    assert check.run_result("gem_ls", "failed", probe, 1, 20) == {"error": "failed"}
    assert check.run_result("trl", "ok", probe, 1, 20) == {
        "error": "trained by DistMatchSFTTrainer, not SFTTrainer"
    }
    probe.write_text(json.dumps({**record, "finished": True}))
    assert "partial" not in check.run_result("gem_ls", "ok", probe, 1, 20)
    # Either sign of a cut run is enough: killed after training ended, or exited 0 before the probe saw the end.
    assert check.run_result("gem_ls", "timeout", probe, 1, 20)["partial"] == "timeout after 4 of 20 steps"
    probe.write_text(json.dumps(record))
    assert check.run_result("gem_ls", "ok", probe, 1, 20)["partial"] == "ok after 4 of 20 steps"
    probe.write_text(json.dumps({**record, "step_end_s": [1.0], "step_tokens": [5]}))
    assert check.run_result("gem_ls", "timeout", probe, 1, 20) == {
        "error": "timeout: 1 steps recorded: too few to time"
    }


def test_train_verdict_puts_failed_runs_before_cut_ones() -> None:
    check = _tool("gpu_check")
    ok, cut, failed = (
        {"tokens_per_s": 1.0},
        {"tokens_per_s": 1.0, "partial": "timeout after 9 of 20 steps"},
        {"error": "x"},
    )
    assert check.train_verdict({"a": ok, "b": ok}) == "ok"
    assert check.train_verdict({"a": ok, "b": cut}) == "partial"
    assert check.train_verdict({"a": failed, "b": cut}) == "errors"
    assert check.train_verdict({"a": cut, "b": failed}) == "errors"
    assert check.train_verdict({}) == "errors"


def test_run_limit_sets_each_training_runs_limit() -> None:
    check = _tool("gpu_check")
    assert check.step_limits(check.parse_args([]))["train_run"] == check.LIMITS["train_run"]
    limits = check.step_limits(check.parse_args(["--run-limit", "90"]))
    assert limits["train_run"] == 90 and limits["build"] == check.LIMITS["build"]
    assert check.step_limits(check.parse_args(["--device", "cpu", "--run-limit", "7"]))["train_run"] == 7


def test_probe_record_is_on_disk_after_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run cut by its limit keeps what it measured: the record is rewritten at each step's end, and 'first step
    after s' is the first step's (later steps leave it alone)."""
    import torch

    worker = _tool("gpu_check_worker")
    probe = tmp_path / "run.probe.json"
    monkeypatch.setenv(worker.PROBE_ENV, str(probe))
    monkeypatch.setenv(worker.LAUNCHED_ENV, repr(time.time() - 100.0))

    class Host:  # the two methods the probe wraps, and the callback list of a transformers Trainer
        def __init__(self) -> None:
            self.callbacks: list = []

        def add_callback(self, callback) -> None:
            self.callbacks.append(callback)

        def training_step(self, model, inputs):
            return 0.0

    worker._patch_trainer(Host)
    host = Host()
    (callback,) = host.callbacks
    host.training_step(None, {"input_ids": torch.ones(1, 8, dtype=torch.long)})
    callback.on_step_end(None, None, None)
    first = json.loads(probe.read_text())
    assert first["step_tokens"] == [8] and not first["finished"] and first["trainer_class"] == "Host"
    assert 100 <= first["first_step_after_s"] < 200 and first["peak_mib"] > 0
    time.sleep(0.05)
    host.training_step(
        None, {"input_ids": torch.ones(1, 8), "attention_mask": torch.tensor([[1] * 5 + [0] * 3])}
    )
    callback.on_step_end(None, None, None)
    second = json.loads(probe.read_text())
    assert second["step_tokens"] == [8, 13] and not second["finished"]
    assert second["first_step_after_s"] == first["first_step_after_s"]
    callback.on_train_end(None, None, None)
    assert json.loads(probe.read_text())["finished"]


def test_every_low_memory_run_trains_its_loss_with_the_low_memory_settings() -> None:
    check = _tool("gpu_check")
    tiles = {"DISTMATCH_GRAD_WEIGHT_ACCUM": "tiles", "DISTMATCH_CHUNK_MEMORY_MB": "60"}
    assert check.TILES_ENV == {**check.LOW_MEMORY_ENV, **tiles}
    low = []
    for suffix, env in (("_lowmem", check.LOW_MEMORY_ENV), ("_tiles", check.TILES_ENV)):
        runs = [run for run in check.TRAIN_RUNS if run.endswith(suffix)]
        assert runs == [f"gem_ls{suffix}", f"emo{suffix}"]
        for run in runs:
            assert check.TRAIN_RUNS[run] == ("--loss", run.removesuffix(suffix))
            assert check.TRAIN_RUN_ENV[run] == env
        low += runs
    assert not set(check.TRAIN_RUN_ENV) - set(low)


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_documented_gpu_check_command_is_accepted(command: DocCommand) -> None:
    """Every `tools/gpu_check.sh ...` of the docs passes the driver's parser (the script hands it its arguments)."""
    check = _tool("gpu_check")
    argv = command.program_argv
    assert argv[0].endswith("tools/gpu_check.sh"), command.where
    check.parse_args(argv[1:])


# ---------------------------------------------------------------------------------------------------------------
# The summary's numbers, from the requirement (docs/benchmarks.md "The GPU check": how the summary is defined)

# pytest's junit XML as `pytest --junitxml` writes it: one suite, its counts as attributes, a `<skipped>` with the
# skip reason as `message`. A test that passed but errored at tear-down is counted once as passed and once as an
# error (pytest's own summary: "N passed, ..., 1 error"); `tests` counts both.
JUNIT_CASE = '<testcase classname="tests.losses.test_triton" name="{name}" time="0.010"{body}'
JUNIT_SKIP = (
    '><skipped type="pytest.skip" message="{why}">tests/losses/test_triton.py:97: {why}</skipped></testcase>'
)
NO_TRITON = "Triton is not installed in this venv (it is in .venv-axolotl)"
NEEDS_GPU = "real shapes in bf16 need a GPU"


def _junit(path: Path, passed: int, skips: dict[str, int], failed: int = 0, teardown_errors: int = 0) -> Path:
    cases = [JUNIT_CASE.format(name=f"test_ok[{i}]", body=" />") for i in range(passed - teardown_errors)]
    cases += [JUNIT_CASE.format(name=f"test_teardown[{i}]", body='><error message="failed on teardown with '
              '&quot;launched ptxas&quot;">launched</error></testcase>') for i in range(teardown_errors)]  # fmt: skip
    cases += [JUNIT_CASE.format(name=f"test_bad[{i}]", body='><failure message="AssertionError: max |diff| '
              '0.0129">assert 0.0129 &lt; 0.001</failure></testcase>') for i in range(failed)]  # fmt: skip
    for why, n in skips.items():
        cases += [
            JUNIT_CASE.format(name=f"test_skip[{why[:5]}{i}]", body=JUNIT_SKIP.format(why=why))
            for i in range(n)
        ]
    skipped = sum(skips.values())
    tests = passed + failed + skipped + teardown_errors
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" '
                    f'errors="{teardown_errors}" failures="{failed}" skipped="{skipped}" tests="{tests}" time="1.381" '
                    f'timestamp="2026-11-29T04:18:45+00:00" hostname="vm">{"".join(cases)}</testsuite></testsuites>')  # fmt: skip
    return path


def test_triton_counts_and_verdict_follow_the_documented_rule(tmp_path: Path) -> None:
    """Counts as pytest reports them; `pass` only when no test that should run on this device skipped (on the CPU a
    test whose skip reason says it needs a GPU is not one of those), else `partial: P passed, S skipped`."""
    check = _tool("gpu_check")
    # The probe's case: the CPU dry run in .venv (no Triton), 85 tests of which 79 skipped.
    xml = _junit(tmp_path / "venv.xml", passed=6, skips={NO_TRITON: 75, NEEDS_GPU: 4})
    counts, skips = check.junit_counts(xml), check.junit_skips(xml)
    assert counts == {"tests": 85, "failures": 0, "errors": 0, "skipped": 79, "passed": 6}
    assert skips == {NO_TRITON: 75, NEEDS_GPU: 4}
    for device in ("cpu", "cuda"):
        assert check.triton_verdict("ok", counts, skips, device) == "partial: 6 passed, 79 skipped"
    part = {"counts": counts, "skips": skips, "verdict": "partial: 6 passed, 79 skipped"}
    assert check.triton_note(part) == (f"6 passed, 0 failed, 0 errors, 79 skipped, of 85 tests; skipped: 75 {NO_TRITON}"
                                       f"; 4 {NEEDS_GPU}")  # fmt: skip
    # Triton's interpreter on the CPU: only the GPU-only tests skip, which is a pass there and partial on a GPU.
    xml = _junit(tmp_path / "interp.xml", passed=81, skips={NEEDS_GPU: 4})
    counts, skips = check.junit_counts(xml), check.junit_skips(xml)
    assert counts["passed"] == 81 and counts["skipped"] == 4
    assert check.triton_verdict("ok", counts, skips, "cpu") == "pass"
    assert check.triton_verdict("ok", counts, skips, "cuda") == "partial: 81 passed, 4 skipped"
    # Everything skipped for a GPU reason on the CPU: nothing was tested, not a pass.
    xml = _junit(tmp_path / "none.xml", passed=0, skips={NEEDS_GPU: 4})
    counts, skips = check.junit_counts(xml), check.junit_skips(xml)
    assert check.triton_verdict("ok", counts, skips, "cpu") == "partial: 0 passed, 4 skipped"
    # The GPU session's first run: failures, and passing tests that errored at tear-down.
    xml = _junit(tmp_path / "gpu.xml", passed=54, skips={NEEDS_GPU: 1}, failed=2, teardown_errors=3)
    counts = check.junit_counts(xml)
    assert counts == {"tests": 60, "failures": 2, "errors": 3, "skipped": 1, "passed": 54}
    assert check.triton_verdict("failed", counts, check.junit_skips(xml), "cuda") == "FAIL"
    # An error alone (a tear-down) is no pass either, whatever pytest's exit status was read as.
    xml = _junit(tmp_path / "teardown.xml", passed=5, skips={}, teardown_errors=1)
    counts = check.junit_counts(xml)
    assert counts == {"tests": 6, "failures": 0, "errors": 1, "skipped": 0, "passed": 5}
    assert check.triton_verdict("ok", counts, {}, "cuda") == "FAIL"
    assert check.triton_verdict("timeout", {}, {}, "cuda") == "timeout"
    assert check.triton_verdict("ok", {}, {}, "cuda") == "no results"  # no XML: never a pass
    assert (
        check.junit_counts(tmp_path / "missing.xml") == {}
        and check.junit_skips(tmp_path / "missing.xml") == {}
    )


def _probe(path: Path, trainer: str, tokens: list[int], ends: list[float], peak: float, **extra: Any) -> Path:
    """A probe record as tools/gpu_check_worker.py writes it after each step (values from a real CPU run's)."""
    record = {"tokens": tokens[-1], "step_tokens": tokens, "step_end_s": ends, "losses": [8.33, 8.32, 8.31],
              "finished": True, "device": "cpu", "settings": {}, "trainer_ready_after_s": 7.8,
              "trainer_class": trainer, "first_step_after_s": 8.1, "peak_mib": peak, **extra}  # fmt: skip
    path.write_text(json.dumps(record))
    return path


def test_training_ratios_are_each_run_over_trls_default(tmp_path: Path) -> None:
    """x TRL default: a run's tokens/s over the `trl` run's, its peak MiB over the `trl` run's (both timed after the
    untimed first step), in summary.json and in the summary's training table."""
    check = _tool("gpu_check")
    # After the untimed first step, trl trains 128 tokens in 0.4 s (320 tokens/s) and gem_ls 256 tokens in 0.25 s
    # (1024 tokens/s); peaks 661 and 631 MiB.
    trl = _probe(tmp_path / "trl.json", "SFTTrainer", [100, 228, 356], [10.0, 10.2, 10.6], 661.0)
    ours = _probe(tmp_path / "ours.json", "DistMatchSFTTrainer", [100, 356, 612], [20.0, 20.3, 20.55], 631.0)
    runs = {
        "trl": check.run_result("trl", "ok", trl, 1, 3),
        "gem_ls": check.run_result("gem_ls", "ok", ours, 1, 3),
    }
    assert check.add_ratios(runs) == "ok"
    speed, memory = 1024 / 320, 631 / 661  # 3.2 and 0.9546
    assert runs["gem_ls"]["speed_x_trl"] == pytest.approx(speed, rel=1e-6)
    assert runs["gem_ls"]["memory_x_trl"] == pytest.approx(memory, rel=1e-6)
    assert runs["trl"]["speed_x_trl"] == runs["trl"]["memory_x_trl"] == 1.0
    assert "ratio_note" not in runs["gem_ls"]
    text = check.summary_markdown(_train_result(runs, "ok"))
    assert "| gem_ls | DistMatchSFTTrainer | 1024 | 3.20 | 631 | 0.95 | 0.250 |" in text
    assert "| trl | SFTTrainer | 320 | 1.00 | 661 | 1.00 | 0.400 |" in text
    assert "x TRL default (ratio" not in text  # no note under a table of full measurements

    # A baseline cut by its time limit: the ratios are taken but each is marked, with the reason under the table.
    _probe(trl, "SFTTrainer", [100, 228, 356], [10.0, 10.2, 10.6], 661.0, finished=False)
    runs["trl"] = check.run_result("trl", "timeout", trl, 1, 20)
    runs["gem_ls"] = check.run_result("gem_ls", "ok", ours, 1, 3)
    baseline = check.add_ratios(runs)
    assert baseline == "partial: timeout after 3 of 20 steps"
    assert runs["gem_ls"]["ratio_note"] == "against a partial trl run (timeout after 3 of 20 steps)"
    assert runs["gem_ls"]["speed_x_trl"] == pytest.approx(speed, rel=1e-6)
    text = check.summary_markdown(_train_result(runs, baseline))
    assert "| gem_ls | DistMatchSFTTrainer | 1024 | 3.20* | 631 | 0.95* |" in text
    assert (
        "\\* x TRL default (ratio to the `trl` run): against a partial run (timeout after 3 of 20 steps)"
        in text
    )

    # A failed baseline: no ratios at all, and the table says why.
    runs = {
        "trl": check.run_result("trl", "failed", trl, 1, 3),
        "gem_ls": check.run_result("gem_ls", "ok", ours, 1, 3),
    }
    baseline = check.add_ratios(runs)
    assert baseline == "trl failed: failed" and "speed_x_trl" not in runs["gem_ls"]
    text = check.summary_markdown(_train_result(runs, baseline))
    assert "| gem_ls | DistMatchSFTTrainer | 1024 | n/a | 631 | n/a |" in text
    assert "x TRL default (ratio to the `trl` run): none (trl failed: failed)" in text
    assert check.add_ratios({"gem_ls": check.run_result("gem_ls", "ok", ours, 1, 3)}) == "no trl run"


def _train_result(runs: dict[str, Any], baseline: str) -> dict[str, Any]:
    env = {"date": "2026-11-29 04:25 UTC", "device_name": "cpu", "torch": "2.13.0+cpu", "python": "3.11.7"}
    model = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 4096, "params": 1.2e6}
    train = {"runs": runs, "baseline": baseline, "steps": 3, "warmup_steps": 1, "batch_size": 1, "seq_len": 128,
             "model": model, "verdict": "ok"}  # fmt: skip
    return {"mode": "dry run, tiny shapes on cpu", "environment": env, "records": [], "train": train}


def test_a_benchmark_with_an_error_row_is_not_ok(tmp_path: Path) -> None:
    """bench_losses.py exits 0 unless every row errored: a step whose rows hold any error reads `errors: E of R rows`,
    and the check's outcome counts it as failed (exit status 1)."""
    check = _tool("gpu_check")
    rows = [{"shape": "tiny", "loss": "ce", "path": "hf_ce", "extra_mib": 12.55, "time_s": 0.0151},
            {"shape": "tiny", "loss": "ce", "path": "fused", "error": "RuntimeError: CUDA out of memory"}]  # fmt: skip
    assert check.benchmark_verdict("ok", rows) == "errors: 1 of 2 rows"
    assert check.benchmark_verdict("ok", rows[:1]) == "ok"
    assert check.benchmark_verdict("ok", []) == "no rows"
    assert check.benchmark_verdict("timeout", rows[:1]) == "timeout"
    result = {"records": [{"step": "bench", "status": "ok", "rc": 0}],
              "bench": {"rows": 2, "errors": 1, "verdict": check.benchmark_verdict("ok", rows)}}  # fmt: skip
    failed, partial = check.outcome(result)
    assert failed == ["bench (errors: 1 of 2 rows)"] and partial == []


def test_outcome_fails_on_failures_and_lists_what_was_not_fully_run() -> None:
    check = _tool("gpu_check")
    records = [{"step": "triton", "status": "ok"}, {"step": "train_trl", "status": "timeout"}]
    result = {"records": records, "install": {"verdict": "not installed: the kit is for another Python: 1 of ..."},
              "triton": {"verdict": "partial: 6 passed, 79 skipped"}, "parity": {"verdict": "pass"},
              "memory": {"verdict": "ok"}, "train": {"verdict": "partial: trl_liger not run (needs liger-kernel)"}}  # fmt: skip
    failed, partial = check.outcome(result)
    assert failed == ["train_trl (timeout)"]
    assert partial == ["install (not installed: the kit is for another Python: 1 of ...)",
                       "triton (partial: 6 passed, 79 skipped)",
                       "train (partial: trl_liger not run (needs liger-kernel))"]  # fmt: skip
    result = {"records": records[:1], "triton": {"verdict": "FAIL"}, "parity": {"verdict": "not measured"}}
    assert check.outcome(result) == (["triton (FAIL)", "parity (not measured)"], [])


def test_a_run_whose_package_is_missing_is_not_run_and_never_ok(tmp_path: Path) -> None:
    """`trl_liger` without Liger-Kernel: not started (no process), `not run (needs liger-kernel)`; the train step is
    `partial` beside measured runs, `not run` alone, and `errors` still wins."""
    check = _tool("gpu_check")
    args = check.parse_args(["--device", "cpu", "--runs", "trl_liger", "--out", str(tmp_path / "out"),
                             "--scratch", str(tmp_path / "scratch")])  # fmt: skip
    runner = check.Runner(args.out, dict(os.environ), 60)
    env = {"torch": "2.13.0+cpu", "trl": "1.16.0", "liger_kernel": None}
    train = check.step_train(args, runner, check.step_limits(args), tmp_path / "site", {}, env)
    assert train["runs"] == {"trl_liger": {"not_run": "needs liger-kernel"}} and runner.records == []
    assert train["baseline"] == "no trl run"
    assert check.train_part_verdict(train["runs"]) == "not run: trl_liger not run (needs liger-kernel)"
    measured = {"tokens_per_s": 320.0, "peak_mib": 661.0, "s_per_step": 0.4, "loss_first": 8.3, "loss_last": 8.2,
                "trainer_class": "SFTTrainer", "speed_x_trl": 1.0, "memory_x_trl": 1.0}  # fmt: skip
    runs = {"trl": measured, **train["runs"]}
    assert check.train_part_verdict(runs) == "partial: trl_liger not run (needs liger-kernel)"
    assert check.train_part_verdict({**runs, "ce": {"error": "failed"}}) == "errors"
    text = check.summary_markdown(_train_result(runs, "ok"))
    assert "| trl_liger | not run (needs liger-kernel) |" in text
    assert check.train_note({"runs": runs}) == "1 of 2 runs measured; not run: trl_liger (needs liger-kernel)"


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    check = _tool("gpu_check")
    assert check.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("error: "), (
        captured
    )
    return captured.err


REFUSALS = [
    (["--budget", "nan"], "--budget nan: a positive number"),
    (["--budget", "inf"], "--budget inf: a positive number"),
    (["--budget", "0"], "--budget 0.0: a positive number"),
    (["--budget", "-5"], "--budget -5.0: a positive number"),
    (["--budget", "soon"], "--budget: invalid float value"),
    (["--run-limit", "nan"], "--run-limit nan: a positive number"),
    (["--train-steps", "1"], "--train-steps 1: at least 2"),
    (["--steps", ""], "--steps is empty: a comma list of triton,memory,parity,train,bench"),
    (["--steps", ","], "--steps is empty"),
    (["--steps", "train", "--runs", ""], "--runs is empty: a comma list of trl,"),
    (["--steps", "triton,nope"], "unknown step or run: nope (steps: triton,"),
    (["--runs", "trl,gem"], "unknown step or run: gem"),
    (["--device", "mps"], "--device 'mps': cuda, cuda:N (the GPU run) or cpu (the dry run) is accepted"),
    (["--out", "{file}/out"], "--out {file}/out: not a folder this user can write (Not a directory)"),
    (["--scratch", "{file}/s"], "--scratch {file}/s: not a folder this user can write"),
    (
        ["--kit", "{tmp}/no-kit"],
        "--kit {tmp}/no-kit: no such folder; the folder of `make gpu-kit`'s wheels",
    ),
    (["--kit", "{tmp}/empty"], "--kit {tmp}/empty: no *.whl in it"),
    (["--site", "{tmp}/home"], "--site {tmp}/home: not empty and not made by tools/gpu_check.py"),
]


@pytest.mark.parametrize(("extra", "named"), REFUSALS, ids=[" ".join(extra) for extra, _ in REFUSALS])
def test_bad_arguments_are_refused_in_one_line_before_any_work(
    extra: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kit = _tool("gpu_kit")
    kit.write_wheel(tmp_path / "kit", "probe-pkg", "1.0", {"probe_pkg.py": "X = 1\n"})
    (tmp_path / "empty").mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine\n")
    (tmp_path / "file").write_text("")
    out = tmp_path / "out"
    fill = {"tmp": str(tmp_path), "file": str(tmp_path / "file")}
    argv = ["--device", "cpu", "--steps", "triton", "--out", str(out), "--site", str(tmp_path / "site"),
            "--scratch", str(tmp_path / "scratch"), "--kit", str(tmp_path / "kit")]  # fmt: skip
    err = _refusal(argv + [word.format(**fill) for word in extra], capsys)
    assert named.format(**fill) in err
    assert not out.exists() or not list(out.iterdir())  # nothing ran, nothing written
    assert (tmp_path / "home" / "notes.txt").read_text() == "mine\n"


def test_a_kit_for_another_python_is_refused_on_the_gpu_and_left_uninstalled_on_the_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make gpu-kit` builds for the image's Python 3.12: on another Python pip refuses such wheels, and nothing of
    them may be unpacked (the probe found a half-unpacked kit shadowing the venv's huggingface_hub)."""
    check, kit = _tool("gpu_check"), _tool("gpu_kit")
    other = "cp312" if sys.version_info[:2] != (3, 12) else "cp311"
    wheels = tmp_path / "kit"
    pure = kit.write_wheel(wheels, "probe-pkg", "1.0", {"probe_pkg.py": "X = 1\n"})
    foreign = pure.with_name(f"compiled_pkg-1.0-{other}-{other}-manylinux_2_28_x86_64.whl")
    foreign.write_bytes(pure.read_bytes())
    assert check.wheels_not_for_this_python([pure, foreign]) == [foreign.name]
    args = check.parse_args(["--device", "cpu", "--kit", str(wheels)])
    found, skip = check.resolve_kit(args)
    assert found == wheels and skip.startswith(
        "not installed: the kit is for another Python: 1 of its 2 wheels"
    )
    assert foreign.name in skip
    argv = ["--kit", str(wheels), "--out", str(tmp_path / "out"), "--site", str(tmp_path / "site")]
    err = _refusal(argv, capsys)
    assert f"--kit {wheels}: 1 of its 2 wheels ({foreign.name}, ...) are not for Python" in err
    # Nothing to install: the install folder gets only the check's own files, never a wheel's.
    plan = check.install(wheels, tmp_path / "site", check.Runner(tmp_path, {}, 10), 10, skip)
    assert plan["verdict"] == skip and plan["wheels"] == []
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["sitecustomize.py"]


def test_without_the_default_kit_the_check_warns_and_says_so_in_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No `make gpu-kit` yet: not refused (the dry run uses the environment's packages), but warned before any work
    and never an `ok` install in the summary."""
    check = _tool("gpu_check")
    missing = tmp_path / "build" / "gpu-kit" / "wheels"
    monkeypatch.setattr(check, "DEFAULT_KIT", missing)
    args = check.parse_args(["--device", "cpu", "--out", str(tmp_path / "out"), "--site", str(tmp_path / "site"),
                             "--scratch", str(tmp_path / "scratch")])  # fmt: skip
    kit, skip = check.preflight(args)
    assert kit == missing and skip == f"no kit: {missing} is missing (`make gpu-kit`)"
    assert (
        capsys.readouterr().err == f"gpu_check: warning: {skip}; the steps use this environment's packages\n"
    )
    plan = check.install(kit, args.site, check.Runner(args.out, {}, 10), 10, skip)
    result = {"mode": "dry run", "environment": _train_result({}, "ok")["environment"], "records": [],
              "install": plan}  # fmt: skip
    text = check.summary_markdown(result)
    assert f"| install | {skip} | the steps use this environment's packages |" in text
    assert check.outcome(result) == ([], [f"install ({skip})"])


def test_a_step_without_time_left_is_skipped_and_counts_as_failed(tmp_path: Path) -> None:
    check = _tool("gpu_check")
    runner = check.Runner(tmp_path, {}, budget_s=3)  # under the 5 s a step needs: nothing is started
    rec = runner.run("triton", ["false"], 80)
    assert rec["status"] == "skipped" and not (tmp_path / "logs").exists()
    records = [rec, {"step": "memory", "status": "failed", "rc": 1, "seconds": 2.0},
               {"step": "bench", "status": "timeout", "rc": 124, "seconds": 150.2, "limit_s": 150}]  # fmt: skip
    env = _train_result({}, "ok")["environment"]
    text = check.summary_markdown({"mode": "full on cuda", "environment": env, "records": records})
    assert "| triton | skipped | 0.0 | no time left in the budget |" in text
    assert "| memory | exit 1 | 2.0 |  |" in text and "| bench | timeout (150 s) | 150.2 |  |" in text
    failed, _ = check.outcome({"records": records})
    assert failed == ["triton (skipped)", "memory (failed)", "bench (timeout)"]


def test_the_install_folder_is_emptied_when_the_check_made_it(tmp_path: Path) -> None:
    """An earlier run's kit never shadows this run's packages: a folder with the check's sitecustomize is emptied;
    any other non-empty folder is refused (test_bad_arguments_...)."""
    check = _tool("gpu_check")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(check.SITECUSTOMIZE.format(probe_env="X", tools="/t"))
    (site / "huggingface_hub").mkdir()
    (site / "huggingface_hub" / "__init__.py").write_text("import httpx\n")
    check.prepare_site(site)
    assert site.is_dir() and not list(site.iterdir()) and (tmp_path / "site-bin").is_dir()


# ---------------------------------------------------------------------------------------------------------------
# The CPU dry run


DRY_RUN = next(c for c in COMMANDS if "--device cpu" in c.text)


def _fresh_shell(**extra: str) -> dict[str, str]:
    """A new shell's environment: no PYTHON, no venv active or on PATH."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    return {**env, "PATH": "/usr/local/bin:/usr/bin:/bin", **extra}


def _with_out(argv: list[str], out: Path) -> list[str]:
    i = argv.index("--out")
    return [*argv[: i + 1], str(out), *argv[i + 2 :]]


@pytest.mark.slow  # real processes: `trl sft` launches, the parity trainer, pytest, the benchmarks, pip
def test_cpu_dry_run_runs_every_step_and_writes_the_summary(tmp_path: Path) -> None:
    """The documented dry run, as written, from a fresh shell (no PYTHON, no venv on PATH): it picks the repository's
    .venv, runs every step and the CPU's default runs, and exits 0. Its output folder is the test's; the install and
    scratch folders too (their defaults are shared /tmp folders), and its kit is one wheel whose `.pth` file proves
    that every step's processes import from the install folder. Then a kit pip refuses, and an interpreter
    without torch, in one line each."""
    check, kit = _tool("gpu_check"), _tool("gpu_kit")
    wheels = tmp_path / "kit"
    marks = tmp_path / "marks"
    marks.mkdir()
    module = "import os, pathlib\np = os.environ.get('GPU_CHECK_TEST_MARKS')\nif p:\n    pathlib.Path(p, str(os.getpid())).touch()\n"
    kit.write_wheel(wheels, "gpu-check-probe", "1.0", {"gpu_check_probe.py": module,
                                                      "gpu_check_probe.pth": "import gpu_check_probe\n"})  # fmt: skip
    out, site = tmp_path / "out", tmp_path / "site"
    isolated = ["--site", str(site), "--kit", str(wheels), "--scratch", str(tmp_path / "scratch")]
    assert DRY_RUN.program_argv[:3] == ["tools/gpu_check.sh", "--device", "cpu"], DRY_RUN.where
    done = subprocess.run(
        [*_with_out(DRY_RUN.program_argv, out), *isolated], cwd=REPO_ROOT,
        env=_fresh_shell(GPU_CHECK_TEST_MARKS=str(marks)), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "summary.json").read_text())
    assert result["environment"]["executable"] == str(REPO_ROOT / ".venv" / "bin" / "python")
    steps = [r["step"] for r in result["records"]]
    runs = list(check.CPU_DEFAULT_RUNS)
    assert runs == ["trl", "gem_ls"]
    assert steps == ["install", "triton", "memory", "build", "parity", *(f"train_{r}" for r in runs), "bench"]
    assert result["install"]["wheels"] == ["gpu_check_probe-1.0-py3-none-any.whl"]
    assert result["install"]["verdict"] == "ok"
    assert (site / "gpu_check_probe.py").is_file() and (site / "sitecustomize.py").is_file()
    # Every step's processes imported from the target folder: its .pth ran in each (the steps, the launch's child).
    assert len(list(marks.iterdir())) >= len(steps) + 2
    triton = result["triton"]
    counts = triton["counts"]
    assert counts["tests"] > 0 and counts["passed"] + counts["skipped"] == counts["tests"]
    assert triton["verdict"] == check.triton_verdict("ok", counts, triton["skips"], "cpu")
    if importlib.util.find_spec("triton") is None:  # .venv: the kernel tests skip, so the step is no pass
        assert triton["verdict"] == f"partial: {counts['passed']} passed, {counts['skipped']} skipped"
        assert any("Triton is not installed" in why for why in triton["skips"])
        assert f"triton ({triton['verdict']})" in done.stderr.splitlines()[-1]
    assert (
        result["bench"]["rows"] == 2 and result["bench"]["errors"] == 0 and result["bench"]["verdict"] == "ok"
    )
    assert result["memory"]["rows"] == 6 and result["memory"]["errors"] == 0  # 2 settings x ce, gem_ls, emo
    trained = result["train"]["runs"]
    assert (
        list(trained) == runs and result["train"]["verdict"] == "ok" and result["train"]["baseline"] == "ok"
    )
    assert trained["trl"]["trainer_class"] == "SFTTrainer" and trained["trl"]["speed_x_trl"] == 1.0
    run = trained["gem_ls"]
    assert run["trainer_class"] == "DistMatchSFTTrainer" and run["tokens_per_s"] > 0 and run["peak_mib"] > 0
    assert run["speed_x_trl"] == pytest.approx(run["tokens_per_s"] / trained["trl"]["tokens_per_s"])
    assert run["memory_x_trl"] == pytest.approx(run["peak_mib"] / trained["trl"]["peak_mib"])
    assert (
        run["finished"]
        and "partial" not in run
        and 0 < run["trainer_ready_after_s"] < run["first_step_after_s"]
    )
    assert result["parity"]["ok"] and result["parity"]["grad_rel_err_max"] < 1e-4
    assert not list(
        out.rglob("*.safetensors")
    )  # the model and the runs' output folders stay in the scratch folder
    summary = (out / "summary.md").read_text()
    assert summary == done.stdout
    assert "| parity | pass |" in summary and "| gem_ls | DistMatchSFTTrainer |" in summary
    assert "| bench | exit 0 |" in summary and "| bench | ok | 2 rows, 0 with an error |" in summary
    assert "## Results" in summary  # the loss benchmark's own table
    assert "| gem_ls | accum-weight (float32, weight, default) |" in summary  # the memory settings' table

    # A kit pip refuses (one wheel of it broken): pip's reason in one line, nothing unpacked (the earlier run's
    # install emptied, the good wheel not installed either), the steps run on the environment's packages, exit 1.
    kit.write_wheel(tmp_path / "bad-kit", "probe-pkg", "1.0", {"probe_pkg.py": "X = 1\n"})
    (tmp_path / "bad-kit" / "zz_broken-1.0-py3-none-any.whl").write_bytes(b"not a zip file")
    out2 = tmp_path / "out2"
    done = subprocess.run(
        ["tools/gpu_check.sh", "--device", "cpu", "--steps", "triton", "--out", str(out2), "--site", str(site),
         "--kit", str(tmp_path / "bad-kit"), "--scratch", str(tmp_path / "scratch")],
        cwd=REPO_ROOT, env=_fresh_shell(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    refused = [line for line in done.stderr.splitlines() if line.startswith("gpu_check: install:")]
    assert len(refused) == 1 and "ERROR: Wheel 'zz-broken' located at" in refused[0], done.stderr
    assert refused[0].startswith(
        f"gpu_check: install: pip refused the kit {tmp_path / 'bad-kit'} (ERROR: Wheel"
    )
    assert refused[0].endswith(
        "is invalid): nothing was installed, the steps use this environment's packages"
    )
    assert {p.name for p in site.iterdir()} - {"__pycache__"} == {"sitecustomize.py"}
    assert not list(site.rglob("*probe*"))
    result = json.loads((out2 / "summary.json").read_text())
    assert result["install"]["verdict"].startswith(
        "failed: pip refused the kit (ERROR: Wheel 'zz-broken' located"
    )
    assert result["triton"]["counts"]["tests"] == counts["tests"]  # the environment still imports
    assert done.stderr.splitlines()[-1].startswith(
        "gpu_check: failed: install (failed: pip refused the kit (ERROR"
    )
    assert "| install | exit 1 |" in done.stdout

    # An interpreter without torch (the system's python3 in a fresh shell): one line saying what to set.
    python3 = "/usr/bin/python3"
    bare = subprocess.run([python3, "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
                          capture_output=True, text=True)  # fmt: skip
    if bare.stdout.strip() == "True":
        done = subprocess.run(["tools/gpu_check.sh", "--device", "cpu", "--out", str(tmp_path / "out3")],
                              cwd=REPO_ROOT, env=_fresh_shell(PYTHON=python3), capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr == (f"error: this Python ({python3}) has no torch: set PYTHON to an interpreter with torch "
                               "(tools/gpu_check.sh uses the repository's .venv when PYTHON is unset, python3 "
                               "without one)\n")  # fmt: skip
        assert not (tmp_path / "out3").exists()
