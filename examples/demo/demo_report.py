"""The demo's report: the comparison table (stdout and `report.md`), the differences against CE (paired over prompts,
`eval_tasks.metrics.paired_differences`), samples, settings and timings, `summary.png` and the standard
`distmatch-eval report` of the runs in `eval_report/` — the markdown tables and plots from `eval_tasks.report`."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from demo_config import BASE_RUN, DemoConfig
from demo_sampling import SAMPLER
from demo_score import METRIC_SHORT

from eval_tasks.metrics import paired_differences
from eval_tasks.metrics.names import DIVERSITY_METRICS
from eval_tasks.report.markdown import fmt, table
from eval_tasks.samples import read_jsonl, write_json

COLUMNS = (
    ("run", "run"),
    ("ce", "held-out CE"),
    ("ppl", "perplexity"),
    ("entropy", "entropy"),
    ("top1", "top-1 prob"),
    *METRIC_SHORT.items(),
    ("words", "words/sample"),
    ("train_ce", "train CE (last)"),
    ("train_s", "train s"),
)


def table_rows(
    results: Sequence[Mapping[str, Any]], training: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per run: numbers only (None where a run has no value, e.g. training columns of the base model)."""
    rows = []
    for r in results:
        t = training.get(r["name"])
        rows.append(
            {
                "run": r["name"],
                "ce": r["stats"]["mean_nll"],
                "ppl": r["stats"]["perplexity"],
                "entropy": r["stats"]["mean_entropy"],
                "top1": r["stats"]["mean_top1_prob"],
                **{k: v[0] for k, v in r["diversity"].items()},
                **{f"{k}_se": v[1] for k, v in r["diversity"].items()},
                "words": r["mean_words"],
                "empty": r["empty_samples"],
                "train_ce": t["last"].get("ce") if t else None,
                "train_s": t["train_seconds"] if t else None,
            }
        )
    return rows


def _cell(row: Mapping[str, Any], key: str, with_se: bool) -> str:
    value = row.get(key)
    if not isinstance(value, float):
        return fmt(value)
    digits = {"ce": 3, "entropy": 3, "top1": 3, "ppl": 2, "train_ce": 3, "train_s": 0, "words": 1}.get(key, 1)
    text = fmt(value, digits)
    se = row.get(f"{key}_se")
    if with_se and se is not None and not math.isnan(se):
        text += f" ± {se:.1f}"
    return text


def format_table(rows: Sequence[Mapping[str, Any]], *, markdown: bool, with_se: bool = True) -> str:
    """The comparison table: markdown (the report's `table`) or aligned plain text (the terminal)."""
    header = [title for _, title in COLUMNS]
    body = [[_cell(row, key, with_se) for key, _ in COLUMNS] for row in rows]
    if markdown:
        return "\n".join(table(header, body))
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(header)]
    line = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join(
        [line.format(*header), line.format(*("-" * w for w in widths)), *(line.format(*c) for c in body)]
    )


def differences(results: Sequence[Mapping[str, Any]], reference: str = "ce") -> list[str]:
    """Each run against `reference` (CE): deltas, and for diversity the paired standard error over prompts."""
    by_name = {r["name"]: r for r in results}
    if reference not in by_name:
        return []
    ref = by_name[reference]
    lines = []
    for r in results:
        if r["name"] in (reference, BASE_RUN):
            continue
        parts = [
            f"perplexity {r['stats']['perplexity'] - ref['stats']['perplexity']:+.2f}",
            f"entropy {r['stats']['mean_entropy'] - ref['stats']['mean_entropy']:+.3f} nats",
        ]
        keys = [key for key in DIVERSITY_METRICS if key in r["diversity"]]
        for key, (mean, se) in paired_differences(r["per_prompt"], ref["per_prompt"], keys).items():
            flag = "" if math.isnan(se) else f" ({verdict(mean, se)})"
            parts.append(f"{METRIC_SHORT[key]} {mean:+.1f} ± {se:.1f}{flag}")
        lines.append(f"- **{r['name']} vs {reference}**: " + "; ".join(parts))
    return lines


#: how a paired difference is worded: clear only beyond two standard errors
CLEAR, NOT_CLEAR = "clear: beyond 2 s.e.", "not clear: within 2 s.e."


def verdict(mean: float, se: float) -> str:
    """`clear: beyond 2 s.e.` when |mean| > 2 * se, else `not clear: within 2 s.e.`."""
    return CLEAR if abs(mean) > 2 * se else NOT_CLEAR


def _excerpt(text: str, limit: int = 160) -> str:
    """A sample on one line (lines joined by ' / '), cut at `limit` characters; `table` escapes its '|'."""
    flat = " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return (flat[: limit - 1] + "…") if len(flat) > limit else (flat or "(empty)")


def _settings_rows(cfg: DemoConfig, env: Mapping[str, Any]) -> list[tuple[str, str]]:
    lora = (
        f"LoRA r={cfg.lora_r}, alpha={2 * cfg.lora_r}, dropout 0, attention + MLP projections of "
        + (f"the top {cfg.lora_layers} decoder layers" if cfg.lora_layers else "every decoder layer")
        if cfg.lora_r
        else "full fine-tuning"
    )
    return [
        ("model", env["model"]),
        (
            "losses",
            ", ".join(cfg.losses) + " (TRL `DistMatchSFTTrainer`, library defaults: GEM beta 0.7, EMO emo1 "
            "with a frozen copy of the output embedding as cost embedding)",
        ),
        (
            "training data",
            f"`{_rel(cfg.train_file)}` ({env['train_examples']} prompt/answer pairs; the loss is on the answer)",
        ),
        ("fine-tuning", f"{lora}; {env['trainable']} trainable parameters"),
        (
            "optimisation",
            f"{cfg.steps} steps x {cfg.batch_size} examples ({cfg.steps * cfg.batch_size} examples, "
            f"{'%.2f' % (cfg.steps * cfg.batch_size / max(1, env['train_examples']))} epochs), AdamW, lr {cfg.lr:g}, cosine "
            f"schedule, {max(1, round(0.1 * cfg.steps))} warm-up steps, max length {cfg.max_length} tokens",
        ),
        ("precision", f"{env['dtype']} (training autocast and sampling); held-out scoring in float32"),
        (
            "held-out scoring",
            f"first {min(cfg.eval_examples, env['heldout_examples'])} pairs of `{_rel(cfg.heldout_file)}` "
            "(CE / perplexity / entropy / top-1 probability over the answer tokens)",
        ),
        (
            "sampling",
            f"first {min(cfg.prompts, env['heldout_examples'])} held-out prompts x {cfg.samples} samples, "
            f"temperature {cfg.temperature}, top-k {cfg.top_k}, top-p {cfg.top_p}, at most {cfg.max_new_tokens} new tokens, "
            f"chat template; {SAMPLER}",
        ),
        (
            "diversity",
            "n-gram (distinct 1-3), Self-BLEU (all other samples as references), Sentence-BERT ("
            f"{env['sbert']}); response only; mean ± standard error over prompts",
        ),
        ("seed", f"{cfg.seed} (LoRA initialisation, data order, sampling: the same for every loss)"),
        (
            "device",
            f"{env['device']}, {env['threads']} torch threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}",
        ),
        ("versions", env["versions"]),
    ]


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def make_plots(
    cfg: DemoConfig, results: Sequence[Mapping[str, Any]], training: Mapping[str, Mapping[str, Any]]
) -> dict[str, Path]:
    """`summary.png` in the output folder, and the standard `distmatch-eval report` of the runs in `eval_report/`."""
    from eval_tasks import report as R
    from eval_tasks.report.plots import quality_diversity_plot

    out = Path(cfg.out_dir)
    written = R.build_report(
        {r["name"]: [out / "runs" / r["name"]] for r in results},
        out / "eval_report",
        title="distmatch demo: the standard `distmatch-eval report` of the demo runs",
        published=False,
    )
    plots = {p.stem: p for p in written if p.suffix == ".png"}
    summary = quality_diversity_plot(table_rows(results, training), out, titles=METRIC_SHORT)
    if summary is not None:
        plots["summary"] = summary
    return plots


def write_report(
    cfg: DemoConfig,
    results: Sequence[Mapping[str, Any]],
    training: Mapping[str, Mapping[str, Any]],
    env: Mapping[str, Any],
    timings: Mapping[str, float],
    plots: Mapping[str, Path],
) -> Path:
    """`report.md` and `results.json` in the output folder."""
    out = Path(cfg.out_dir)
    runs_dir = out / "runs"
    rows = table_rows(results, training)
    summary = plots.get("summary")
    lines = [
        f"# distmatch demo: {' vs '.join(cfg.losses)} on {env['model_short']}",
        "",
        f"Run on {env['date']} by `make demo` (`examples/demo/run_demo.py`). One fine-tune per loss from the same "
        "start, seed, data order and hyper-parameters; every model (and the base model) scored on held-out "
        "prompts whose subjects never occur in the training data. All numbers below are what this run measured.",
        "",
        "## Results",
        "",
        format_table(rows, markdown=True),
        "",
        "Held-out CE (nats/token), perplexity = exp(CE), mean entropy (nats) and mean top-1 probability of the next-"
        "token distribution over the reference answers' tokens; diversity of the K samples per prompt on the GEM "
        "paper's 0-100 scale (higher = more diverse), mean ± standard error over prompts; words/sample: mean "
        "sample length (diversity depends on it); train CE (last): the CE of the last training batch.",
        "",
    ]
    if summary:
        lines += [f"![Held-out perplexity vs diversity]({summary.name})", ""]
    diffs = differences(results)
    if diffs:
        lines += [
            "### Differences against CE",
            "",
            "Diversity differences are paired per prompt (same prompts, same sampling random numbers), mean ± "
            "standard error over prompts; a difference is called clear only when it is larger than twice its "
            "standard error, otherwise not clear. Perplexity and entropy are one number per run (no standard "
            "error). One seed: `DEMO_SEED` reruns with another; docs/demo/README.md shows the spread over the seeds "
            "and machines tried.",
            "",
            *diffs,
            "",
        ]
    lines += [
        "## What this scale can and cannot show",
        "",
        f"- It shows, end to end, what the losses change in one small fine-tune: the held-out fit (perplexity), "
        f"how spread out the next-token distributions stay (entropy, top-1 probability) and how different K "
        f"samples of the same prompt are — measured, with seed {cfg.seed}, on {env['model_short']}.",
        f"- It cannot reproduce the papers' numbers or test their claims: {cfg.steps} steps x {cfg.batch_size} "
        f"examples (from {env['train_examples']} short template-written ones), {env['method']} of a "
        f"{env['parameters'] / 1e6:.0f}M-parameter model, {min(cfg.prompts, env['heldout_examples'])} prompts x "
        f"{cfg.samples} samples of at most {cfg.max_new_tokens} tokens, one seed, no judge of quality or "
        "correctness. The papers fine-tune 7-8B models for one to three epochs of real data (WikiText-103, "
        "UltraFeedback) and measure quality on benchmarks (`examples/reproduce/`). A difference here that is within its error bars, or that flips with another "
        "seed or step count, is not evidence either way; nor is a difference that is only there at this scale.",
        "- Fit and diversity are separate axes: a lower held-out perplexity means more probability on the single "
        "reference answers, and says nothing about how varied the samples are (nor does diversity say whether "
        "they are good). Compare runs on both (plot above), and read the samples.",
        "",
        "## Samples",
        "",
        "The first samples of each run for the first held-out prompts (lines joined by ' / '):",
        "",
    ]
    for prompt_index in range(min(2, cfg.prompts)):
        prompt = None
        sample_rows = []
        for r in results:
            record = read_jsonl(runs_dir / r["name"] / "samples.jsonl")[prompt_index]
            prompt = record["prompt"]
            for j, sample in enumerate(record["samples"][:3]):
                sample_rows.append([r["name"] if j == 0 else "", _excerpt(sample)])
        lines += [f"**{prompt}**", "", *table(["run", "sample"], sample_rows), ""]
    lines += ["## Plots", ""]
    titles = {
        "training": "Training curves (objective, entropy)",
        "diversity": "Diversity per metric",
        "next_token": "First-token distributions of GEM's figure-6 probe prompts",
    }
    for stem, title in titles.items():
        if stem in plots and stem != "summary":
            lines += [f"**{title}**", "", f"![{title}](eval_report/{plots[stem].name})", ""]
    lines += [
        "More tables (probe prompts, training statistics) in [`eval_report/report.md`](eval_report/report.md), "
        "built by `distmatch-eval report` from `runs/<name>/` (samples.jsonl, diversity.json, nexttoken.json, "
        "trainer_state.json; LoRA adapters in `runs/<name>/adapter/`).",
        "",
        "## Settings",
        "",
        *table(["setting", "value"], _settings_rows(cfg, env)),
        "",
        "## Time and machine",
        "",
        *table(["stage", "wall time"], [(k, format_duration(v)) for k, v in timings.items()]),
        "",
        f"Load average (1 min) at start {env['load_start']:.2f}, at the end {env['load_end']:.2f}, on {env['cpus']} "
        f"CPU cores. CPU: {env['cpu']}; torch kernels: {env['aten_cpu_capability']}. Reproduce: `{env['command']}`.",
        "",
    ]
    report_md = out / "report.md"
    report_md.write_text("\n".join(lines), encoding="utf-8")
    write_json(
        out / "results.json",
        {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()},
            "environment": dict(env),
            "timings_seconds": dict(timings),
            "rows": rows,
            "training": dict(training),
        },
    )
    return report_md


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"
