"""The GPU check's summary (tools/gpu_check_summary.py, tools/gpu_check_verdicts.py): the counts, verdicts, tables and
outcome, from the requirement (docs/benchmarks.md "The summary") and from results as the steps' tools write them
(pytest's junit XML, the benchmarks' reports)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module


def _module(name: str) -> ModuleType:
    """A module of the GPU check, imported as tools/gpu_check.py imports it (tools/ on sys.path)."""
    load_module("distmatch_tool_gpu_check", REPO_ROOT / "tools" / "gpu_check.py")
    return importlib.import_module(name)


def _environment() -> dict[str, str]:
    return {"date": "2026-11-29 04:25 UTC", "device_name": "cpu", "torch": "2.13.0+cpu", "python": "3.11.7"}


def test_summary_table_has_every_part_and_the_ratios() -> None:
    summary, table = _module("gpu_check_summary"), _module("gpu_check_table")
    run = {
        "tokens_per_s": 1000.0,
        "peak_mib": 2000.0,
        "s_per_step": 0.5,
        "loss_first": 3.0,
        "loss_last": 2.0,
        "trainer_class": "SFTTrainer",
        "speed_ratio": 1.0,
        "memory_ratio": 1.0,
    }
    ours = {
        **run,
        "trainer_class": "DistMatchSFTTrainer",
        "speed_ratio": 1.2,
        "memory_ratio": 0.9,
        "first_step_after_s": 21.5,
    }
    cut = {**ours, "partial": "timeout after 9 of 20 steps"}
    environment = {
        "date": "2026-11-27 06:00 UTC",
        "device_name": "NVIDIA H100",
        "torch": "2.11.0",
        "python": "3.12.3",
    }
    model = {"hidden_size": 2048, "num_hidden_layers": 4, "vocab_size": 128256, "params": 7.8e8}
    result = {
        "mode": "full on cuda",
        "environment": environment,
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
            "model": model,
        },
    }
    text = summary.summary_markdown(result, table.STEPS)
    # The process table says how the process ended, never `ok` (whether its work succeeded is the part's verdict).
    assert "NVIDIA H100; torch 2.11.0" in text and "| triton | exit 0 | 12.0 |  |" in text
    assert "| triton | pass | 59 passed, 0 failed, 0 errors, 0 skipped, of 59 tests |" in text
    assert "| bench | not run | |" in text
    assert (
        "| gem_ls | DistMatchSFTTrainer | 1000 | 1.20 | 2000 | 0.90 | 0.500 | 3.000 -> 2.000 | 21.5 |" in text
    )
    assert "| ce | DistMatchSFTTrainer (timeout after 9 of 20 steps) | 1000 |" in text
    assert "| emo | error: timeout |" in text


# pytest's junit XML as `pytest --junitxml` writes it: one suite, its counts as attributes, a `<skipped>` with the
# skip reason as `message`. A test that passed but errored at tear-down is counted once as passed and once as an
# error (pytest's own summary: "N passed, ..., 1 error"); `tests` counts both.
JUNIT_CASE = '<testcase classname="tests.losses.test_triton" name="{name}" time="0.010"{body}'
JUNIT_SKIP = (
    '><skipped type="pytest.skip" message="{why}">tests/losses/test_triton.py:97: {why}</skipped></testcase>'
)
JUNIT_TEARDOWN = (
    '><error message="failed on teardown with &quot;launched ptxas&quot;">launched</error></testcase>'
)
JUNIT_FAILURE = (
    '><failure message="AssertionError: max |diff| 0.0129">assert 0.0129 &lt; 0.001</failure></testcase>'
)
JUNIT_SUITE = (
    '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" '
    'errors="{errors}" failures="{failures}" skipped="{skipped}" tests="{tests}" time="1.381" '
    'timestamp="2026-11-29T04:18:45+00:00" hostname="vm">{cases}</testsuite></testsuites>'
)
NO_TRITON = "Triton is not installed in this venv (it is in .venv-axolotl)"
NEEDS_GPU = "real shapes in bf16 need a GPU"


def _junit(path: Path, passed: int, skips: dict[str, int], failed: int = 0, teardown_errors: int = 0) -> Path:
    cases = [JUNIT_CASE.format(name=f"test_ok[{i}]", body=" />") for i in range(passed - teardown_errors)]
    cases += [
        JUNIT_CASE.format(name=f"test_teardown[{i}]", body=JUNIT_TEARDOWN) for i in range(teardown_errors)
    ]
    cases += [JUNIT_CASE.format(name=f"test_bad[{i}]", body=JUNIT_FAILURE) for i in range(failed)]
    for why, n in skips.items():
        skip = JUNIT_SKIP.format(why=why)
        cases += [JUNIT_CASE.format(name=f"test_skip[{why[:5]}{i}]", body=skip) for i in range(n)]
    skipped = sum(skips.values())
    tests = passed + failed + skipped + teardown_errors
    path.write_text(
        JUNIT_SUITE.format(
            errors=teardown_errors, failures=failed, skipped=skipped, tests=tests, cases="".join(cases)
        )
    )
    return path


def test_triton_counts_and_verdict_follow_the_documented_rule(tmp_path: Path) -> None:
    """Counts as pytest reports them; `pass` only when no test that should run on this device skipped (on the CPU a
    test whose skip reason says it needs a GPU is not one of those), else `partial: P passed, S skipped`."""
    verdicts, summary = _module("gpu_check_verdicts"), _module("gpu_check_summary")
    # The probe's case: the CPU dry run in .venv (no Triton), 85 tests of which 79 skipped.
    xml = _junit(tmp_path / "venv.xml", passed=6, skips={NO_TRITON: 75, NEEDS_GPU: 4})
    counts, skips = verdicts.junit_counts(xml), verdicts.junit_skips(xml)
    assert counts == {"tests": 85, "failures": 0, "errors": 0, "skipped": 79, "passed": 6}
    assert skips == {NO_TRITON: 75, NEEDS_GPU: 4}
    for device in ("cpu", "cuda"):
        assert verdicts.triton_verdict("ok", counts, skips, device) == "partial: 6 passed, 79 skipped"
    part = {"counts": counts, "skips": skips, "verdict": "partial: 6 passed, 79 skipped"}
    assert summary.triton_note(part) == (
        f"6 passed, 0 failed, 0 errors, 79 skipped, of 85 tests; skipped: 75 {NO_TRITON}; 4 {NEEDS_GPU}"
    )
    # Triton's interpreter on the CPU: only the GPU-only tests skip, which is a pass there and partial on a GPU.
    xml = _junit(tmp_path / "interp.xml", passed=81, skips={NEEDS_GPU: 4})
    counts, skips = verdicts.junit_counts(xml), verdicts.junit_skips(xml)
    assert counts["passed"] == 81 and counts["skipped"] == 4
    assert verdicts.triton_verdict("ok", counts, skips, "cpu") == "pass"
    assert verdicts.triton_verdict("ok", counts, skips, "cuda") == "partial: 81 passed, 4 skipped"
    # Everything skipped for a GPU reason on the CPU: nothing was tested, not a pass.
    xml = _junit(tmp_path / "none.xml", passed=0, skips={NEEDS_GPU: 4})
    counts, skips = verdicts.junit_counts(xml), verdicts.junit_skips(xml)
    assert verdicts.triton_verdict("ok", counts, skips, "cpu") == "partial: 0 passed, 4 skipped"
    # The GPU session's first run: failures, and passing tests that errored at tear-down.
    xml = _junit(tmp_path / "gpu.xml", passed=54, skips={NEEDS_GPU: 1}, failed=2, teardown_errors=3)
    counts = verdicts.junit_counts(xml)
    assert counts == {"tests": 60, "failures": 2, "errors": 3, "skipped": 1, "passed": 54}
    assert verdicts.triton_verdict("failed", counts, verdicts.junit_skips(xml), "cuda") == "FAIL"
    # An error alone (a tear-down) is no pass either, whatever pytest's exit status was read as.
    xml = _junit(tmp_path / "teardown.xml", passed=5, skips={}, teardown_errors=1)
    counts = verdicts.junit_counts(xml)
    assert counts == {"tests": 6, "failures": 0, "errors": 1, "skipped": 0, "passed": 5}
    assert verdicts.triton_verdict("ok", counts, {}, "cuda") == "FAIL"
    assert verdicts.triton_verdict("timeout", {}, {}, "cuda") == "timeout"
    assert verdicts.triton_verdict("ok", {}, {}, "cuda") == "no results"  # no XML: never a pass
    missing = tmp_path / "missing.xml"
    assert verdicts.junit_counts(missing) == {} and verdicts.junit_skips(missing) == {}


def test_a_benchmark_with_an_error_row_is_not_ok(tmp_path: Path) -> None:
    """bench_losses.py exits 0 unless every row errored: a step whose rows hold any error reads `errors: E of R rows`,
    and the check's outcome counts it as failed (exit status 1). Only a report written by this run counts."""
    verdicts, summary, table = (
        _module("gpu_check_verdicts"),
        _module("gpu_check_summary"),
        _module("gpu_check_table"),
    )
    rows = [
        {"shape": "tiny", "loss": "ce", "path": "hf_ce", "extra_mib": 12.55, "time_s": 0.0151},
        {"shape": "tiny", "loss": "ce", "path": "fused", "error": "RuntimeError: CUDA out of memory"},
    ]
    (tmp_path / "bench_losses-2026.json").write_text(json.dumps({"meta": {}, "results": rows}))
    (tmp_path / "bench_losses-2026.md").write_text("## Results\n")
    found = verdicts.read_benchmark_report(tmp_path, "results", since=0.0)
    assert found == {"rows": 2, "errors": 1, "report": "## Results\n"}
    assert verdicts.read_benchmark_report(tmp_path, "results", since=4e9) == {
        "rows": 0,
        "errors": 0,
        "report": "",
    }
    assert verdicts.benchmark_verdict("ok", 2, 1) == "errors: 1 of 2 rows"
    assert verdicts.benchmark_verdict("ok", 2, 2) == "errors: 2 of 2 rows"
    assert verdicts.benchmark_verdict("ok", 1, 0) == "ok"
    assert verdicts.benchmark_verdict("ok", 0, 0) == "no rows"
    assert verdicts.benchmark_verdict("timeout", 1, 0) == "timeout"
    (step,) = [step for step in table.STEPS if step.name == "bench"]  # the verdict as the table reads it
    part = {"status": "ok", **found}
    assert step.verdict(part, "cuda") == "errors: 1 of 2 rows"
    result = {
        "records": [{"step": "bench", "status": "ok", "rc": 0}],
        "bench": {**part, "verdict": "errors: 1 of 2 rows"},
    }
    failed, partial = summary.outcome(result, table.STEPS)
    assert failed == ["bench (errors: 1 of 2 rows)"] and partial == []


def test_outcome_fails_on_failures_and_lists_what_was_not_fully_run() -> None:
    summary, table = _module("gpu_check_summary"), _module("gpu_check_table")
    records = [{"step": "triton", "status": "ok"}, {"step": "train_trl", "status": "timeout"}]
    result: dict[str, Any] = {
        "records": records,
        "install": {"verdict": "not installed: the kit is for another Python: 1 of ..."},
        "triton": {"verdict": "partial: 6 passed, 79 skipped"},
        "parity": {"verdict": "pass"},
        "memory": {"verdict": "ok"},
        "train": {"verdict": "partial: trl_liger not run (needs liger-kernel)"},
    }
    failed, partial = summary.outcome(result, table.STEPS)
    assert failed == ["train_trl (timeout)"]
    assert partial == [
        "install (not installed: the kit is for another Python: 1 of ...)",
        "train (partial: trl_liger not run (needs liger-kernel))",
        "triton (partial: 6 passed, 79 skipped)",
    ]
    result = {"records": records[:1], "triton": {"verdict": "FAIL"}, "parity": {"verdict": "not measured"}}
    assert summary.outcome(result, table.STEPS) == (["triton (FAIL)", "parity (not measured)"], [])
    # A step whose preparation failed was not started: a failure, beside the preparation's own.
    result = {
        "records": [{"step": "build", "status": "failed"}],
        "parity": {"verdict": "not started (build failed)"},
    }
    assert summary.outcome(result, table.STEPS) == (
        ["build (failed)", "parity (not started (build failed))"],
        [],
    )


def test_a_step_without_time_left_is_skipped_and_counts_as_failed(tmp_path: Path) -> None:
    runner, summary, table = (
        _module("gpu_check_runner"),
        _module("gpu_check_summary"),
        _module("gpu_check_table"),
    )
    # under 5 s left: nothing started
    rec = runner.Runner(tmp_path, {}, budget_s=3).run("triton", ["false"], 80)
    assert rec["status"] == "skipped" and not (tmp_path / "logs").exists()
    records = [
        rec,
        {"step": "memory", "status": "failed", "rc": 1, "seconds": 2.0},
        {"step": "bench", "status": "timeout", "rc": 124, "seconds": 150.2, "limit_s": 150},
    ]
    result = {"mode": "full on cuda", "environment": _environment(), "records": records}
    text = summary.summary_markdown(result, table.STEPS)
    assert "| triton | skipped | 0.0 | no time left in the budget |" in text
    assert "| memory | exit 1 | 2.0 |  |" in text and "| bench | timeout (150 s) | 150.2 |  |" in text
    failed, _ = summary.outcome({"records": records}, table.STEPS)
    assert failed == ["triton (skipped)", "memory (failed)", "bench (timeout)"]
