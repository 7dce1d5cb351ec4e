"""How the GPU check reads what its steps left behind: pytest's junit XML, the benchmarks' rows, the training
probe's records, and each part's verdict from them (docs/benchmarks.md "The summary": `ok` / `pass` only when all
of a part's work succeeded)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_check_plan import Run
from gpu_check_runner import training_probe

# A skip whose reason says the test needs a GPU: expected on the CPU (that test does not run there).
GPU_ONLY_SKIP = re.compile(r"\b(needs?|requires?) (a )?(GPU|CUDA)\b", re.IGNORECASE)


def junit_counts(path: Path) -> dict[str, int]:
    """pytest's counts from its junit XML: tests, failures, errors, skipped, and passed (the rest)."""
    if not path.is_file():
        return {}
    suite = ET.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def junit_skips(path: Path) -> dict[str, int]:
    """How many tests skipped for each reason (pytest's skip message), most first."""
    if not path.is_file():
        return {}
    cases = ET.parse(path).getroot().iter("testcase")
    skips = [skip for case in cases for skip in case.findall("skipped")]
    reasons = Counter(skip.get("message") or (skip.text or "").strip() or "no reason given" for skip in skips)
    return dict(reasons.most_common())


def triton_verdict(status: str, counts: dict[str, int], skips: dict[str, int], device: str) -> str:
    """`pass` only when pytest ended ok, nothing failed or errored, a test passed and no test skipped that should run
    on this device: on a GPU every skip counts, on the CPU all but those whose reason says they need a GPU. Else
    `partial: P passed, S skipped`; `FAIL` when pytest failed, `timeout` when it was cut, `no results` without XML."""
    if status != "ok":
        return "FAIL" if status == "failed" else status
    if not counts:
        return "no results"
    if counts["failures"] or counts["errors"]:
        return "FAIL"
    on_gpu = device.startswith("cuda")
    gpu_only = 0 if on_gpu else sum(n for why, n in skips.items() if GPU_ONLY_SKIP.search(why))
    if counts["passed"] > 0 and counts["skipped"] == gpu_only:
        return "pass"
    return f"partial: {counts['passed']} passed, {counts['skipped']} skipped"


def read_benchmark_report(out: Path, key: str, since: float) -> dict[str, Any]:
    """What a benchmark script wrote into `out` at `since` (`time.time()`) or later (`out` may hold an earlier run's
    reports): its report's row count (the rows under `key` of its `.json`), how many of them hold an error, and its
    markdown table."""
    reports = sorted(p for p in out.glob("*.json") if p.stat().st_mtime >= since - 1)
    if not reports:
        return {"rows": 0, "errors": 0, "report": ""}
    rows = json.loads(reports[-1].read_text()).get(key, [])
    errors = len([row for row in rows if "error" in row])
    return {"rows": len(rows), "errors": errors, "report": reports[-1].with_suffix(".md").read_text()}


def benchmark_verdict(status: str, rows: int, errors: int) -> str:
    """A benchmark script's verdict from its process's status and its report's `rows`, `errors` of them holding an
    error: `ok` only when the script ended ok and wrote rows, none of them an error; else the process's status, or
    `errors: E of R rows`, or `no rows`."""
    if status != "ok":
        return status
    if errors:
        return f"errors: {errors} of {rows} rows"
    return "ok" if rows else "no rows"


def parity_verdict(status: str, parity: dict[str, Any]) -> str:
    """`pass` / `FAIL` against the parity check's tolerance, `not measured` without its result, or the process's
    status."""
    if status != "ok":
        return status
    return "pass" if parity.get("ok") else "FAIL" if "ok" in parity else "not measured"


def install_verdict(plan: dict[str, Any]) -> str:
    """`ok` when the kit installed; why nothing was installed (`no kit: ...`, `not installed: ...`); or the install
    process's status with pip's reason (`failed: pip refused the kit (...)`)."""
    record = plan.get("record")
    if record is None:
        return plan["skip"]
    status, note = record["status"], record.get("note")
    return "ok" if status == "ok" else f"{status}: {note}" if note else status


def run_result(run: Run, status: str, probe: Path, warmup: int, steps: int) -> dict[str, Any]:
    """One training run's row from its probe record. A run stopped by its time limit keeps the steps it measured
    (the probe writes after each step), marked partial; a failed run, one without steps to time, or one trained by
    the wrong trainer (the `trl sft --loss` hook did not act) is an error row."""
    if status not in ("ok", "timeout") or not probe.is_file():
        return {"error": status if status != "ok" else "no probe record"}
    try:
        result = training_probe.summarise(json.loads(probe.read_text()), warmup)
    except ValueError as err:
        return {"error": f"{status}: {err}"}
    if result.get("trainer_class") != run.trainer:
        return {"error": f"trained by {result.get('trainer_class')}, not {run.trainer}"}
    if status != "ok" or not result["finished"]:
        result["partial"] = f"{status} after {result['steps_done']} of {steps} steps"
    return result


def train_verdict(runs: dict[str, dict[str, Any]]) -> str:
    """`errors` if any run failed (or none ran), else `partial` if any was cut by its limit, else `ok`."""
    if not runs or any("error" in r for r in runs.values()):
        return "errors"
    return "partial" if any(r.get("partial") for r in runs.values()) else "ok"


def train_part_verdict(runs: dict[str, dict[str, Any]]) -> str:
    """The train step's verdict: `train_verdict` over the runs that were started; runs not started (their package
    missing) make an `ok` step `partial` (never `ok`), and a step with no run started `not run`."""
    started = {run: r for run, r in runs.items() if "not_run" not in r}
    not_run = [f"{run} not run ({r['not_run']})" for run, r in runs.items() if "not_run" in r]
    if not not_run:
        return train_verdict(runs)
    if not started:
        return "not run: " + ", ".join(not_run)
    verdict = train_verdict(started)
    return verdict if verdict == "errors" else f"partial: {', '.join(not_run)}"


def goal_rows(runs: dict[str, dict[str, Any]], table: Mapping[str, Run]) -> list[dict[str, Any]]:
    """Each chosen run with a goal (`Run.goal`), against the run its goal names, from one command's runs: its
    tokens/s and peak MiB over that run's, and its verdict: `met` / `not met (...)` when both were measured,
    `reported` for a goal that asks nothing, else `not measured (...)` (either run missing, failed or not run). A
    ratio against a run cut by its time limit is marked `partial`."""
    rows = []
    for name, result in runs.items():
        goal = table[name].goal if name in table else None
        if goal is None:
            continue
        row: dict[str, Any] = {"run": name, "vs": goal.vs, "goal": goal.text()}
        base = runs.get(goal.vs)
        missing = [
            f"{which} {r.get('error') or r.get('not_run') or 'no tokens/s'}"
            if r is not None
            else f"no {which} run"
            for which, r in ((name, result), (goal.vs, base))
            if r is None or "tokens_per_s" not in r
        ]
        if missing:
            row["verdict"] = f"not measured ({'; '.join(missing)})"
            rows.append(row)
            continue
        assert base is not None
        speed = row["speed_ratio"] = result["tokens_per_s"] / base["tokens_per_s"]
        memory = row["memory_ratio"] = result["peak_mib"] / base["peak_mib"]
        short = []
        if goal.speed is not None and speed < goal.speed:
            short.append(f"tokens/s {speed:.2f}x < {goal.speed:g}x")
        if goal.memory is not None and memory > goal.memory:
            short.append(f"peak memory {memory:.2f}x > {goal.memory:g}x")
        verdict = "reported" if goal.speed is None and goal.memory is None else "met"
        row["verdict"] = f"not met ({', '.join(short)})" if short else verdict
        if result.get("partial") or base.get("partial"):
            row["verdict"] += " (partial runs)"
        rows.append(row)
    return rows
