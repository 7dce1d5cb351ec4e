"""NoveltyBench in ``distmatch-eval report``: the runs' ``distinct`` / ``utility`` (lm-eval ``distmatch_noveltybench_*``
results or ``distmatch-eval novelty`` JSONs) beside GEM's diversity metrics of the same samples, the published rows,
and a scatter plot (distinct against utility, one point per run and subset: up and to the right is better)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eval_tasks import published as P
from eval_tasks.report.labels import NOVELTY_METRICS
from eval_tasks.report.markdown import bold, table
from eval_tasks.report.plots import pyplot, save_figure

__all__ = ["COLUMNS", "novelty_plot", "novelty_section"]

#: the columns: NoveltyBench's numbers, then GEM's diversity of the same samples (0-100)
COLUMNS = dict(
    zip(NOVELTY_METRICS, ("distinct (1-K)", "utility (0-10)", "N-gram div.", "Self-BLEU div."), strict=True)
)


def _benchmark(label: str) -> str:
    return label.rstrip("'")


def novelty_section(
    runs: list[Any], pub: bool, model_filter: str | None, used: set[tuple[str, str]]
) -> list[str]:
    entries = [(r, label, e) for r in runs for label, e in r.novelty.items()]
    if not entries:
        return []
    lines = [
        "## NoveltyBench (distinct and utility of K samples per prompt)",
        "",
    ]
    rows = []
    for r, label, e in entries:
        setting = e.get("setting") or {}
        comparable = "yes" if setting.get("comparable") else str(setting.get("note") or "not comparable")
        rows.append([bold(r.name), label, *[e["metrics"].get(m) for m in COLUMNS], comparable])
    if pub:
        benchmarks = dict.fromkeys(_benchmark(label) for _, label, _ in entries)
        benchmarks.setdefault("noveltybench_leaderboard")
        for key in benchmarks:
            if key not in P.benchmarks():
                continue
            for p in P.published_rows(key, model_filter):
                rows.append([p["label"], key, *[p["values"].get(m) for m in COLUMNS], "published"])
                used.add((p["paper"], p["table"]))
    lines += table(["run", "prompts", *COLUMNS.values(), "comparable with the published numbers"], rows)
    lines += [
        "",
        "distinct: classes of functionally equivalent responses among the K samples (higher = more diverse); utility: "
        "the patience-0.8 mean of the reward bins (1-10) of the responses that open a class (higher = diverse and "
        "good). N-gram / Self-BLEU diversity: GEM's metrics of the same samples (0-100). Only runs with NoveltyBench's "
        "classifier, reward model, K = 10 and its whole prompt set are comparable with the published rows; the "
        "leaderboard does not say over which prompts its means are.",
        "",
    ]
    return lines


def novelty_plot(runs: list[Any], out: Path, pub: bool = True) -> Path | None:
    """distinct (x) against utility (y): one marker per run and subset, the published rows in grey."""
    points = [
        (r.name, label, e["metrics"].get("distinct"), e["metrics"].get("utility"))
        for r in runs
        for label, e in r.novelty.items()
    ]
    points = [p for p in points if p[2] is not None and p[3] is not None]
    if not points:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    if pub:
        for p in P.published_rows("noveltybench_leaderboard"):
            x, y = p["values"].get("distinct"), p["values"].get("utility")
            if x is not None and y is not None:
                ax.scatter([x], [y], color="0.7", marker="o", s=22)
                ax.annotate(
                    p["method"], (x, y), fontsize=6, color="0.45", xytext=(3, 2), textcoords="offset points"
                )
    markers = {"noveltybench_curated": "s", "noveltybench_wildchat": "^"}
    colours = {name: f"C{i % 10}" for i, name in enumerate(dict.fromkeys(p[0] for p in points))}
    for name, label, x, y in points:
        ax.scatter(
            [x],
            [y],
            marker=markers.get(_benchmark(label), "D"),
            s=48,
            color=colours[name],
            label=f"{name} · {label}",
        )
    ax.set_xlabel("distinct (classes among K samples)")
    ax.set_ylabel("utility (0-10)")
    ax.set_title("NoveltyBench: up and to the right = more distinct, better answers")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return save_figure(plt, fig, out / "novelty.png")
