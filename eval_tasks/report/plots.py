"""The report's PNG plots (matplotlib, Agg backend): grouped bars per task / metric / probe token, training curves,
first-k curves of the best-of-n / voting benchmarks (GEM Figure 2's shape), and the perplexity-vs-diversity scatter
of the demo."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from distmatch.optional import require
from eval_tasks import published as P
from eval_tasks.report.collect import CURVE_FAMILIES, RunData
from eval_tasks.report.labels import DIVERSITY_METRICS, METRIC_TITLES, NLU_ORDER, NLU_SHORT, probe_tokens

__all__ = [
    "accuracy_plot",
    "diversity_plot",
    "first_k_plot",
    "first_k_series",
    "grouped_bars",
    "nexttoken_plot",
    "pyplot",
    "quality_diversity_plot",
    "save_figure",
    "training_plot",
]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or an ImportError naming the extra."""
    matplotlib = require("matplotlib", extra="eval", feature="distmatch-eval report plots")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt: Any, fig: Any, path: Path) -> Path:
    """Lay out, write (PNG, 110 dpi) and close a figure; returns its path."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def grouped_bars(
    ax: Any, groups: list[str], series: dict[str, list[float | None]], ylabel: str, value_format: str = "%.1f"
) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ys = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(xs, ys, width=width, label=name)
        for bar, v in zip(bars, values):
            if v is None:
                bar.set_alpha(0.0)
        if len(groups) * n <= 24:
            labels = [value_format % v if v is not None else "" for v in values]
            ax.bar_label(bars, labels=labels, fontsize=7, padding=1)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(
        groups, rotation=30 if len(groups) > 4 else 0, ha="right" if len(groups) > 4 else "center"
    )
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def accuracy_plot(runs: list[RunData], out: Path) -> Path | None:
    entries: list[tuple[str, str, str]] = []
    for r in runs:
        for task, metrics in r.lm_eval.items():
            b = P.benchmark_for_task(task)
            wanted = (
                P.benchmarks()[b]["metrics"] if b else (["acc"] if "acc" in metrics else sorted(metrics)[:1])
            )
            for m in wanted:
                label = (
                    NLU_SHORT.get(b or "", task.removeprefix("distmatch_"))
                    if m == "acc"
                    else f"{task.removeprefix('distmatch_')}\n{METRIC_TITLES.get(m, m)}"
                )
                if m in metrics and (label, task, m) not in entries:
                    entries.append((label, task, m))
    if not entries:
        return None
    order = {task: i for i, task in enumerate(P.benchmarks()[b]["lm_eval_tasks"][0] for b in NLU_ORDER)}
    entries.sort(key=lambda e: (order.get(e[1], 99), e[1], e[2]))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(entries) + 2), 4.2))
    series = {r.name: [r.lm_eval.get(t, {}).get(m) for _, t, m in entries] for r in runs if r.lm_eval}
    grouped_bars(ax, [e[0] for e in entries], series, "score (%)")
    ax.set_title("Accuracy per task (lm-eval)")
    ax.legend(fontsize=8)
    return save_figure(plt, fig, out / "accuracy.png")


def diversity_plot(runs: list[RunData], out: Path) -> Path | None:
    labels: list[str] = []
    for r in runs:
        labels += [b for b in r.diversity if b not in labels]
    metrics = [
        m for m in DIVERSITY_METRICS if any(m in e["metrics"] for r in runs for e in r.diversity.values())
    ]
    if not metrics:
        return None
    plt = pyplot()
    width = max(3.6, 1.2 * len(labels) + 1.5)
    fig, axes = plt.subplots(1, len(metrics), figsize=(width * len(metrics) + 1, 4.2), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        series = {
            r.name: [r.diversity.get(b, {}).get("metrics", {}).get(m) for b in labels]
            for r in runs
            if r.diversity
        }
        grouped_bars(ax, ["\n".join(textwrap.wrap(b, 18)) for b in labels], series, "0-100")
        ax.set_title(METRIC_TITLES.get(m, m))
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Diversity per metric (higher = more diverse)")
    return save_figure(plt, fig, out / "diversity.png")


def nexttoken_plot(runs: list[RunData], out: Path, max_tokens: int = 8) -> Path | None:
    prompts: list[str] = []
    dists: dict[tuple[str, str], dict[str, Any]] = {}
    for r in runs:
        for entry in r.nexttoken:
            for d in entry.get("probes") or []:
                if d["prompt"] not in prompts:
                    prompts.append(d["prompt"])
                dists[(r.name, d["prompt"])] = d
    if not prompts:
        return None
    names = [r.name for r in runs if any((r.name, p) in dists for p in prompts)]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(prompts), figsize=(4.6 * len(prompts) + 0.5, 4.4), squeeze=False)
    for ax, prompt in zip(axes[0], prompts):
        best: dict[Any, float] = {}
        labels: dict[Any, str] = {}
        for name in names:
            d = dists.get((name, prompt))
            for key, label, p in probe_tokens(d) if d else ():
                best[key] = max(best.get(key, 0.0), p)
                labels[key] = label
        keys = sorted(best, key=lambda k: -best[k])[:max_tokens]
        series = {}
        for name in names:
            d = dists.get((name, prompt))
            probs = {key: p for key, _, p in probe_tokens(d)} if d else {}
            # None = not among this run's listed top tokens (no bar)
            series[f"{name} (H={d['entropy']:.2f})" if d else name] = [probs.get(k) for k in keys]
        grouped_bars(ax, [labels[k] for k in keys], series, "probability", value_format="%.2g")
        top = max((v for values in series.values() for v in values if v is not None), default=1.0)
        ax.set_ylim(0, min(1.0, 1.25 * top) or 1.0)
        ax.set_title("\n".join(textwrap.wrap(prompt, 38)), fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Next-token distributions (first response token, cf. GEM figure 6)")
    return save_figure(plt, fig, out / "next_token.png")


def training_plot(runs: list[RunData], out: Path) -> Path | None:
    with_logs = [r for r in runs if r.training and any("loss" in h for h in r.training["log_history"])]
    if not with_logs:
        return None
    keys = [
        k
        for k in ("loss", "entropy", "eval_loss")
        if any(k in h for r in with_logs for h in r.training["log_history"])
    ]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys) + 0.5, 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for r in with_logs:
            pts = [(h.get("step", i), h[key]) for i, h in enumerate(r.training["log_history"]) if key in h]
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    marker="o" if len(pts) < 30 else None,
                    label=r.name,
                )
        ax.set_xlabel("step")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return save_figure(plt, fig, out / "training.png")


def quality_diversity_plot(
    rows: Sequence[Mapping[str, Any]],
    out: Path,
    *,
    x: str = "ppl",
    filename: str = "summary.png",
    titles: Mapping[str, str] | None = None,
) -> Path | None:
    """Held-out perplexity (x) against each diversity metric (y), one point per run: the quality/diversity view.

    `rows`: one per run with ``run``, the x value under `x` and the diversity metrics (keys of
    :data:`DIVERSITY_METRICS`), each with its standard error over prompts under ``<key>_se`` (error bars).
    `titles`: metric -> axis title (default: the report's :data:`METRIC_TITLES`).
    """
    titles = {**METRIC_TITLES, **(titles or {})}
    keys = [k for k in DIVERSITY_METRICS if any(k in r for r in rows)]
    if not keys:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(4.4 * len(keys) + 0.4, 3.9), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for i, row in enumerate(r for r in rows if key in r):
            se = row.get(f"{key}_se")
            ax.errorbar(
                row[x],
                row[key],
                yerr=None if se is None or math.isnan(se) else se,
                fmt="o",
                color=f"C{i}",
                capsize=3,
                label=row["run"],
            )
            ax.annotate(row["run"], (row[x], row[key]), textcoords="offset points", xytext=(5, 4), fontsize=8)
        ax.set_xlabel("held-out perplexity (lower = fits references)")
        ax.set_ylabel(f"{titles.get(key, key)} (0-100, ± s.e. over prompts)")
        ax.set_title(titles.get(key, key))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Held-out perplexity vs diversity of K samples per prompt")
    return save_figure(plt, fig, out / filename)


FIRST_K_TITLES = {
    "gsm8k": "GSM8K",
    "math": "MATH",
    "alpacaeval_bon": "AlpacaEval",
    "mv": "majority voting MV@k (%)",
    "bon": "coverage BON@k (%)",
    "reward_bon": "Reward BON@k",
    "win_rate_bon": "Win Rate BON@k (%)",
    "humaneval": "HumanEval",
    "mbpp_plus": "MBPP+",
    "pass": "pass@k (%)",
}
#: the plotted benchmarks: those of the curve files, and the code tasks' pass@k (lm-eval results only)
PLOT_FAMILIES = {**CURVE_FAMILIES, "humaneval": ("pass",), "mbpp_plus": ("pass",)}


def _points(values: Mapping[str, float], family: str) -> list[list[float]]:
    pts = []
    for key, value in values.items():
        fam, _, k = key.rpartition("@")
        if fam == family and k.isdigit():
            pts.append([int(k), float(value)])
    return sorted(pts)


def first_k_series(
    runs: list[RunData], *, published: bool = True, model_filter: str | None = None
) -> dict[str, dict[str, dict[str, dict[str, list[list[float]]]]]]:
    """The data of the first-k (and pass@k) plots: benchmark -> metric family -> ``{"runs": {name: [[k, value], ...]},
    "published": {row label: [[k, value], ...]}}``, points sorted by k.

    A run's curve is its ``distmatch-eval voting`` / ``reward`` output, else the ``@k`` metrics of its lm-eval task
    of that benchmark (HumanEval / MBPP+: pass@k); the published rows (GEM Tables 4-9) are filtered by
    `model_filter` like the tables.
    """
    out: dict[str, dict[str, dict[str, dict[str, list[list[float]]]]]] = {}
    for benchmark, families in PLOT_FAMILIES.items():
        tasks = P.benchmarks()[benchmark]["lm_eval_tasks"]
        sources = {}
        for r in runs:
            if benchmark in r.curves:
                sources[r.name] = r.curves[benchmark]["curve"]
            else:
                task = next((t for t in tasks if t in r.lm_eval), None)
                if task is not None:
                    sources[r.name] = r.lm_eval[task]
        if not sources:
            continue
        rows = P.published_rows(benchmark, model_filter) if published else []
        panels = {}
        for family in families:
            mine = {name: pts for name, values in sources.items() if (pts := _points(values, family))}
            if mine:
                pub = {p["label"]: pts for p in rows if (pts := _points(p["values"], family))}
                panels[family] = {"runs": mine, "published": pub}
        if panels:
            out[benchmark] = panels
    return out


def first_k_plot(
    benchmark: str, panels: Mapping[str, Mapping[str, Mapping[str, list[list[float]]]]], out: Path
) -> tuple[Path, dict[str, dict[str, dict[str, list[list[float]]]]]]:
    """One PNG per benchmark (``first_k_<benchmark>.png``), a panel per metric family: the runs as solid lines,
    the published rows as dashed lines with markers, metric against k on a log2 axis (GEM Figure 2's shape).

    Returns the path and the plotted data read back from the figure's lines, in :func:`first_k_series`' shape.
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 0.6, 4.2), squeeze=False)
    drawn: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    for ax, (family, panel) in zip(axes[0], panels.items()):
        lines: dict[str, dict[str, Any]] = {"runs": {}, "published": {}}
        for i, (name, pts) in enumerate(panel["runs"].items()):
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            (lines["runs"][name],) = ax.plot(xs, ys, "-o", color=f"C{i}", lw=2, ms=4, label=name)
        offset = len(panel["runs"])
        for j, (label, pts) in enumerate(panel["published"].items()):
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            style = {"color": f"C{offset + j}", "lw": 1, "alpha": 0.75, "label": label}
            (lines["published"][label],) = ax.plot(xs, ys, "--x", **style)
        drawn[family] = {
            group: {
                label: [[float(x), float(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]
                for label, line in group_lines.items()
            }
            for group, group_lines in lines.items()
        }
        ks = sorted({int(p[0]) for group in drawn[family].values() for pts in group.values() for p in pts})
        ticks = [k for k in ks if k & (k - 1) == 0] or ks  # powers of two, as GEM's figure
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(k) for k in ticks])
        ax.set_xlabel("k samples per question (log2 scale)")
        ax.set_ylabel(FIRST_K_TITLES.get(family, family))
        ax.set_title(f"{FIRST_K_TITLES.get(benchmark, benchmark)}: {FIRST_K_TITLES.get(family, family)}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle("First-k curves (solid: runs; dashed: GEM's published points)")
    return save_figure(plt, fig, out / f"first_k_{benchmark}.png"), drawn
