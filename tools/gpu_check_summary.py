"""The GPU check's summary (summary.md; docs/benchmarks.md "The summary"): how each step's process ended, each part's
verdict and details, then what each part reports (the training table, the benchmarks' own tables); and the outcome:
what failed and what was not fully run (the exit status and the lines on stderr)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpu_check_plan import BASELINE, Step

BASELINE_NOTE = f"(ratio to the `{BASELINE}` run)"
#: The verdicts of a part whose work all succeeded.
PASSING = ("ok", "pass")
#: The verdicts of a part not fully run (never a pass, not a failure either).
NOT_FULLY_RUN = ("partial", "not run", "no kit", "not installed")


def fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) >= 10**-digits or value == 0 else f"{value:.2e}"
    return "" if value is None else str(value)


def ratio(run: dict[str, Any], key: str) -> str:
    return fmt(run[key]) if key in run else "n/a"


def process_status(rec: dict[str, Any]) -> str:
    """What the step's process did: `exit 0` (not `ok`: whether its work succeeded is the part's verdict)."""
    if rec["status"] in ("ok", "failed"):
        return f"exit {rec.get('rc', '?')}"
    if rec["status"] == "timeout":
        return f"timeout ({rec.get('limit_s')} s)"
    return rec["status"]


# ---------------------------------------------------------------------------------------------------------------
# Each part's details column


def install_note(plan: dict[str, Any]) -> str:
    if plan.get("skip"):
        return "the steps use this environment's packages"
    return f"{len(plan.get('wheels', []))} wheels into {plan.get('site')}"


def triton_note(part: dict[str, Any]) -> str:
    c = part.get("counts") or {}
    if not c:
        return "no junit XML"
    text = f"{c['passed']} passed, {c['failures']} failed, {c['errors']} errors, {c['skipped']} skipped, of {c['tests']} tests"
    skips = part.get("skips") or {}
    return text + ("; skipped: " + "; ".join(f"{n} {why}" for why, n in skips.items()) if skips else "")


def rows_note(part: dict[str, Any]) -> str:
    return f"{part.get('rows', 0)} rows, {part.get('errors', 0)} with an error"


def parity_note(part: dict[str, Any]) -> str:
    if "ok" not in part:
        return ""
    return (
        f"loss rel. err. {fmt(part['loss_rel_err'])}, worst gradient rel. err. {fmt(part['grad_rel_err_max'])} "
        f"(tolerance {part['tolerance']})"
    )


def train_note(part: dict[str, Any]) -> str:
    runs = part.get("runs", {})
    measured = len([r for r in runs.values() if "tokens_per_s" in r])
    text = f"{measured} of {len(runs)} runs measured"
    goals = part.get("goals") or []
    if goals:
        met = len([g for g in goals if g["verdict"].startswith("met")])
        asked = len([g for g in goals if g["verdict"].startswith(("met", "not met"))])
        text += f"; goals met: {met} of {asked} measured ({len(goals)} runs with a goal)"
    not_run = [f"{run} ({r['not_run']})" for run, r in runs.items() if "not_run" in r]
    return text + (f"; not run: {', '.join(not_run)}" if not_run else "")


# ---------------------------------------------------------------------------------------------------------------
# What a part reports after the part table

TRAIN_HEADER = [
    "| run | trainer | tokens/s | x TRL default | peak MiB | x TRL default | s/step | loss first -> last "
    "| first step after s |",
    "|---|---|---:|---:|---:|---:|---:|---|---:|",
]


def train_row(run: str, r: dict[str, Any]) -> str:
    """A run's row of the training table; a ratio taken against a partial baseline run is marked `*`."""
    if "not_run" in r:
        return f"| {run} | not run ({r['not_run']}) | | | | | | | |"
    if "error" in r:
        return f"| {run} | error: {r['error']} | | | | | | | |"
    mark = "*" if r.get("ratio_note") else ""
    trainer = r["trainer_class"] + (f" ({r['partial']})" if r.get("partial") else "")
    losses = f"{fmt(r['loss_first'], 3)} -> {fmt(r['loss_last'], 3)}"
    return (
        f"| {run} | {trainer} | {r['tokens_per_s']:.0f} | {ratio(r, 'speed_ratio')}{mark} | {r['peak_mib']:.0f} | "
        f"{ratio(r, 'memory_ratio')}{mark} | {fmt(r['s_per_step'], 3)} | {losses} | "
        f"{fmt(r.get('first_step_after_s'), 1)} |"
    )


GOALS_HEADER = [
    "| run | against | tokens/s ratio | peak memory ratio | goal | verdict |",
    "|---|---|---:|---:|---|---|",
]


def goals_report(
    goals: list[dict[str, Any]], title: str = "Goals (GPU goal 2: end to end; ratios within this command):"
) -> list[str]:
    """The goals table (GPU goal 2): each run with a goal, its ratios to the run it is measured against, the
    goal and its verdict (`gpu_check_verdicts.goal_rows`)."""
    if not goals:
        return []
    rows = [
        f"| {g['run']} | {g['vs']} | {ratio(g, 'speed_ratio')} | {ratio(g, 'memory_ratio')} | {g['goal']} | "
        f"{g['verdict']} |"
        for g in goals
    ]
    return ["", title, "", *GOALS_HEADER, *rows]


def train_report(part: dict[str, Any]) -> list[str]:
    """The training table: each run's tokens/s and peak memory, and both as ratios to the baseline run's; under it,
    why the ratios are marked or missing."""
    runs = part.get("runs")
    if not runs:
        return []
    model = part.get("model") or {}
    shape = (
        f"model d {model.get('hidden_size')}, {model.get('num_hidden_layers')} layers, vocabulary "
        f"{model.get('vocab_size')}, {model.get('params', 0) / 1e6:.0f} M parameters"
    )
    lines = [
        "",
        f"Training: `trl sft`, {part.get('steps')} steps ({part.get('warmup_steps')} untimed), batch "
        f"{part.get('batch_size')} x {part.get('seq_len')} tokens packed padding-free, {shape}",
        "",
        *TRAIN_HEADER,
        *(train_row(run, r) for run, r in runs.items()),
    ]
    baseline = part.get("baseline", "ok")
    if any(r.get("ratio_note") for r in runs.values()):
        why = baseline.removeprefix("partial: ")
        lines += ["", f"\\* x TRL default {BASELINE_NOTE}: against a partial run ({why})"]
    elif baseline != "ok":
        lines += ["", f"x TRL default {BASELINE_NOTE}: none ({baseline})"]
    return lines + goals_report(part.get("goals") or [])


def benchmark_report(title: str) -> Callable[[dict[str, Any]], list[str]]:
    """A benchmark script's own table (its report's markdown) under `title`."""

    def report(part: dict[str, Any]) -> list[str]:
        text = (part.get("report") or "").strip()
        return ["", f"{title}:", "", text] if text else []

    return report


# ---------------------------------------------------------------------------------------------------------------
# The summary and the outcome


def summary_markdown(result: dict[str, Any], table: Sequence[Step]) -> str:
    """summary.md: the environment, the process table, the part table (every part of `table`, `not run` when it has
    no result), then each part's report."""
    env = result["environment"]
    versions = (
        f"torch {env['torch']}, Triton {env.get('triton')}, transformers {env.get('transformers')}, TRL "
        f"{env.get('trl')}, Liger-Kernel {env.get('liger_kernel')}, CCE {env.get('cut_cross_entropy')}"
    )
    lines = [
        f"# GPU check {env['date']}",
        "",
        f"{env['device_name']}; {versions}; Python {env['python']}; mode {result['mode']}",
        "",
        "| step | process | seconds | note |",
        "|---|---|---:|---|",
    ]
    for rec in result["records"]:
        seconds = fmt(rec.get("seconds"), 1)
        lines.append(f"| {rec['step']} | {process_status(rec)} | {seconds} | {rec.get('note', '')} |")
    lines += ["", "| part | verdict | details |", "|---|---|---|"]
    parts = [step for step in table if step.note is not None]
    for step in parts:
        part = result.get(step.name)
        if part is None:
            if step.when != "always":
                lines.append(f"| {step.name} | not run | |")
            continue
        # A step not started (its preparation failed) has its verdict only, nothing to detail.
        details = step.note(part) if part.keys() - {"verdict"} else ""
        lines.append(f"| {step.name} | {part.get('verdict', '')} | {details} |")
    for step in parts:
        if step.report is not None and result.get(step.name):
            lines += step.report(result[step.name])
    return "\n".join(lines) + "\n"


def outcome(result: dict[str, Any], table: Sequence[Step]) -> tuple[list[str], list[str]]:
    """(what failed, what was not fully run): every step process not `ok` and every part whose verdict is neither a
    pass nor one of NOT_FULLY_RUN (a failure; a step named by both reads with its part's verdict), and the parts not
    fully run."""
    failed = {r["step"]: f"{r['step']} ({r['status']})" for r in result["records"] if r["status"] != "ok"}
    partial = []
    for step in table:
        verdict = (result.get(step.name) or {}).get("verdict")
        if verdict is None or verdict in PASSING:
            continue
        if not verdict.startswith(NOT_FULLY_RUN):
            failed[step.name] = f"{step.name} ({verdict})"
        elif step.name not in failed:
            partial.append(f"{step.name} ({verdict})")
    return list(failed.values()), partial
