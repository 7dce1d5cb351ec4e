"""The report's markdown: tables of the runs next to the papers' published numbers, one section per kind of result."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eval_tasks import published as P
from eval_tasks.report.collect import RunData
from eval_tasks.report.labels import DIVERSITY_METRICS, METRIC_TITLES, NLU_ORDER, NLU_SHORT, probe_tokens

__all__ = [
    "bold",
    "diversity_section",
    "fmt",
    "ifeval_section",
    "nexttoken_section",
    "nlu_section",
    "other_tasks_section",
    "table",
    "training_section",
    "training_summary",
]

# ---------------------------------------------------------------------------------------------------------
# Markdown helpers


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def cell(x: Any) -> str:
        return fmt(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return lines


def bold(text: str) -> str:
    return f"**{text}**"


# ---------------------------------------------------------------------------------------------------------
# Sections


def nlu_section(
    runs: list[RunData], pub: bool, model_filter: str | None, used: set[tuple[str, str]]
) -> list[str]:
    tasks = {b: P.benchmarks()[b]["lm_eval_tasks"][0] for b in NLU_ORDER}
    present = [b for b in NLU_ORDER if any(tasks[b] in r.lm_eval for r in runs)]
    if not present:
        return []
    header = ["run", *[NLU_SHORT[b] for b in present]] + (
        ["Avg (8)"] if len(present) == len(NLU_ORDER) else []
    )
    header.append("protocol")
    rows, notes = [], []
    for r in runs:
        checks = [r.lm_eval_protocol.get(tasks[b]) for b in present if tasks[b] in r.lm_eval]
        # The paper's number: acc_ppl under OpenICL's normalisation (protocol emo_official), else acc.
        values = [
            r.lm_eval.get(tasks[b], {}).get((r.lm_eval_protocol.get(tasks[b]) or {}).get("metric") or "acc")
            for b in present
        ]
        row = [bold(r.name), *values]
        if len(present) == len(NLU_ORDER):
            row.append(sum(values) / len(values) if all(v is not None for v in values) else None)
        if checks and all(c is not None and c["comparable"] for c in checks):
            row.append("emo_official: paper-comparable")
        elif checks:
            differences = list(dict.fromkeys(d for c in checks if c for d in c["differences"]))
            protocols = sorted({c["protocol"] for c in checks if c})
            notes.append(f"{len(notes) + 1}. {bold(r.name)}: " + "; ".join(differences) + ".")
            row.append(f"{'/'.join(protocols)}: not comparable [{len(notes)}]")
        else:
            row.append("–")
        rows.append(row)
    if pub:
        merged: dict[str, dict[str, Any]] = {}
        for b in present:
            for p in P.published_rows(b, model_filter):
                entry = merged.setdefault(p["label"], {**p, "values": {}})
                entry["values"][b] = p["values"].get("acc")
                used.add((p["paper"], p["table"]))
        for label, p in merged.items():
            values = [p["values"].get(b) for b in present]
            row = [label, *values]
            if len(present) == len(NLU_ORDER):
                row.append(sum(values) / len(values) if all(v is not None for v in values) else None)
            row.append("published")
            rows.append(row)
    lines = ["### In-context NLU (EMO §4.2; accuracy, %)", ""]
    lines += table(header, rows)
    lines += [
        "",
        "Published rows: models continually fine-tuned on WikiText-103 with each objective, 8 retrieved "
        "demonstrations (MMLU 5-shot), lowest-perplexity label (OpenICL). Same task definitions as the "
        "`distmatch_*` lm-eval tasks; base models and training data differ from your runs. A run is on the "
        'paper\'s protocol with `--metadata \'{"protocol": "emo_official"}\'` (its column then shows '
        "`acc_ppl`, OpenICL's rule, with MMLU as the mean of its 57 subjects); other runs show `acc`.",
        "",
    ]
    if notes:
        lines += [
            "Differences from the EMO evaluation protocol (numbers not directly comparable):",
            "",
            *notes,
            "",
        ]
    return lines


def ifeval_section(
    runs: list[RunData], pub: bool, model_filter: str | None, used: set[tuple[str, str]]
) -> list[str]:
    spec = P.benchmarks()["ifeval"]
    task_of = {r.name: next((t for t in spec["lm_eval_tasks"] if t in r.lm_eval), None) for r in runs}
    if not any(task_of.values()):
        return []
    metrics = spec["metrics"]
    rows = [
        [bold(r.name), *[r.lm_eval[task_of[r.name]].get(m) for m in metrics]] for r in runs if task_of[r.name]
    ]
    if pub:
        for p in P.published_rows("ifeval", model_filter):
            rows.append([p["label"], *[p["values"].get(m) for m in metrics]])
            used.add((p["paper"], p["table"]))
    lines = ["### IFEval (GEM Table 1; accuracy, %)", ""]
    lines += table(["run", *[METRIC_TITLES[m] for m in metrics]], rows)
    lines += [
        "",
        "Published rows: Llama-3-8B fine-tuned on UltraFeedback; greedy, up to 1,024 new tokens.",
        "",
    ]
    return lines


_BON_TITLES = {
    "gsm8k": "GSM8K voting / coverage (GEM Tables 5, 7; %)",
    "math": "MATH voting / coverage (GEM Table 8; %)",
    "alpacaeval_bon": "AlpacaEval best-of-n (GEM Table 4; reward, win rate %)",
    "humaneval": "HumanEval pass@k (GEM Tables 6, 9; %)",
    "mbpp_plus": "MBPP+ pass@k (GEM Tables 6, 9; %)",
}


def best_of_n_section(
    runs: list[RunData], pub: bool, model_filter: str | None, used: set[tuple[str, str]]
) -> list[str]:
    """GEM's best-of-n / voting benchmarks: each run's first-k metrics beside the published rows."""
    lines: list[str] = []
    for key, title in _BON_TITLES.items():
        spec = P.benchmarks()[key]
        values = {}  # an lm-eval task's metrics, else a distmatch-eval voting / reward curve
        for r in runs:
            task = next((t for t in spec["lm_eval_tasks"] if t in r.lm_eval), None)
            if task is not None:
                values[r.name] = r.lm_eval[task]
            elif key in r.curves:
                values[r.name] = r.curves[key]["curve"]
        if not values:
            continue
        metrics = spec["metrics"]
        rows = [[bold(name), *[v.get(m) for m in metrics]] for name, v in values.items()]
        if pub:
            for p in P.published_rows(key, model_filter):
                if not any(m in p["values"] for m in metrics):
                    continue  # e.g. GEM's Figure 3 text: differences to CE, no value of these columns
                rows.append([p["label"], *[p["values"].get(m) for m in metrics]])
                used.add((p["paper"], p["table"]))
        lines += [f"### {title}", "", *table(["run", *metrics], rows), ""]
    if lines:
        lines += [
            "First k of 32 samples per question (temperature 0.6, top-k 50, top-p 0.9) in the published rows; a run "
            "with fewer samples has no value at the larger k. Tables 4 and 5: Llama-3-8B on UltraFeedback; Tables 7 "
            "and 8: on MetaMathQA. Tables 6 and 9 (code): pass@k by the unbiased estimator from 200 samples per "
            "problem; Table 6: on UltraFeedback, Table 9: on Magicoder-OSS-Instruct.",
            "",
        ]
    return lines


def other_tasks_section(runs: list[RunData]) -> list[str]:
    known = {t for spec in P.benchmarks().values() for t in spec.get("lm_eval_tasks", ())}
    rows = []
    for r in runs:
        for task, metrics in sorted(r.lm_eval.items()):
            if task in known:
                continue
            for metric, value in sorted(metrics.items()):
                rows.append([bold(r.name), task, metric, value])
    if not rows:
        return []
    return [
        "### Other lm-eval tasks (fractions shown x100)",
        "",
        *table(["run", "task", "metric", "value"], rows),
        "",
    ]


def diversity_section(
    runs: list[RunData], pub: bool, model_filter: str | None, used: set[tuple[str, str]]
) -> list[str]:
    # One table per benchmark (or per unnamed samples file); a run may have several scorings of it.
    groups: dict[str, list[tuple[RunData, str, dict[str, Any]]]] = {}
    for r in runs:
        for label, entry in r.diversity.items():
            groups.setdefault(entry.get("benchmark") or label, []).append((r, label, entry))
    if not groups:
        return []
    lines = ["## Diversity", ""]
    for key, members in groups.items():
        spec = P.benchmarks().get(key)
        metrics = [m for m in DIVERSITY_METRICS if any(m in e["metrics"] for _, _, e in members)]
        if spec:
            metrics += [m for m in spec["metrics"] if m not in metrics and m in DIVERSITY_METRICS]
        title = f"{spec['title']}: `{key}`" if spec else f"`{key}`"
        rows, notes = [], []
        for r, label, entry in members:
            name = bold(r.name) + (label[len(key) :] if label.startswith(key) else "")
            if entry["protocol_differences"]:
                notes.append(f"{len(notes) + 1}. {name}: " + "; ".join(entry["protocol_differences"]) + ".")
                name += f" [{len(notes)}]"
            rows.append([name, *[entry["metrics"].get(m) for m in metrics], entry["protocol"]])
        if pub and spec:
            for p in P.published_rows(key, model_filter):
                rows.append([p["label"], *[p["values"].get(m) for m in metrics], _published_protocol(p)])
                used.add((p["paper"], p["table"]))
        lines += [f"### {title}", ""]
        lines += table(["run", *[METRIC_TITLES.get(m, m) for m in metrics], "scoring"], rows)
        lines.append("")
        if notes and spec:
            lines += [
                "Differences from the GEM evaluation protocol (16 samples, full prompt set, the released script's scoring; numbers not directly comparable):",
                "",
                *notes,
                "",
            ]
    lines += [
        "All diversity values are on the GEM paper's 0-100 scale (higher = more diverse). Only runs scored with "
        "GEM's published protocol (`distmatch-eval diversity --protocol gem_official`, or the lm-eval tasks with "
        '`--metadata \'{"protocol": "gem_official"}\'` and `--apply_chat_template`: prompt + response, '
        "Self-BLEU against one other sample, bert-large-nli-stsb-mean-tokens) on the full prompt set with 16 "
        "samples are comparable with the published rows; MAUVE is comparable with the EMO paper only with `--mauve-featurizer "
        "lm:gpt2-large` and the paper's data and lengths.",
        "",
    ]
    return lines


def _published_protocol(p: dict[str, Any]) -> str:
    if p["paper"].startswith("GEM repository"):
        return "GEM script (prompt+response, 1 ref)"
    if p["paper"].startswith("GEM"):
        return "as published (see notes)"
    return "gpt2-large features"


def nexttoken_section(
    runs: list[RunData], pub: bool, model_filter: str | None, used: set[tuple[str, str]]
) -> list[str]:
    rows = []
    benchmarks = set()
    for r in runs:
        for entry in r.nexttoken:
            stats = entry.get("stats")
            if not stats:
                continue
            benchmarks.add(entry.get("benchmark"))
            rows.append(
                [
                    bold(r.name),
                    entry.get("benchmark") or Path(entry.get("data_file") or "?").name,
                    stats["perplexity"],
                    f"{stats['mean_entropy']:.3f}",
                    f"{stats['mean_top1_prob']:.4f}",
                    f"{stats['top1_accuracy']:.4f}",
                    stats["num_tokens"],
                ]
            )
    if pub:
        for b in sorted(x for x in benchmarks if x and x in P.benchmarks()):
            for p in P.published_rows(b, model_filter):
                ppl = p["values"].get("perplexity")
                rows.append([p["label"], b, ppl, None, None, None, None])
                used.add((p["paper"], p["table"]))
    probes = any(entry.get("probes") for r in runs for entry in r.nexttoken)
    if not rows and not probes:
        return []
    lines = ["## Next-token distributions", ""]
    if rows:
        lines += table(
            ["run", "data", "perplexity", "mean entropy (nats)", "mean top-1 prob", "top-1 acc", "tokens"],
            rows,
        )
        lines += ["", "Token-level means over the scored (response) tokens; perplexity = exp(mean NLL).", ""]
    if probes:
        lines += ["Probe prompts (first response token; entropy in nats over the full vocabulary):", ""]
        probe_rows = []
        for r in runs:
            for entry in r.nexttoken:
                for d in entry.get("probes") or []:
                    top = ", ".join(f"{label} {p:.3f}" for _, label, p in probe_tokens(d)[:3])
                    probe_rows.append(
                        [bold(r.name), d["prompt"], f"{d['entropy']:.3f}", f"{d['top1_prob']:.4f}", top]
                    )
        lines += table(["run", "prompt", "entropy", "top-1 prob", "top tokens"], probe_rows)
        lines.append("")
    return lines


def training_summary(training: dict[str, Any]) -> dict[str, Any]:
    history = training["log_history"]
    train = [h for h in history if "loss" in h]
    evals = [h for h in history if "eval_loss" in h]
    last = train[-1] if train else {}
    last_eval = evals[-1] if evals else {}
    return {
        "steps": training.get("global_step") or (history[-1].get("step") if history else None),
        "epoch": (history[-1].get("epoch") if history else None),
        "loss": last.get("loss"),
        "ce": last.get("ce"),
        "entropy": last.get("entropy"),
        "mean_token_accuracy": last.get("mean_token_accuracy"),
        "eval_loss": last_eval.get("eval_loss"),
        "eval_ppl": math.exp(last_eval["eval_ce"])
        if "eval_ce" in last_eval
        else (
            math.exp(last_eval["eval_loss"])
            if "eval_loss" in last_eval and last_eval["eval_loss"] < 50
            else None
        ),
        "eval_entropy": last_eval.get("eval_entropy"),
    }


def training_section(runs: list[RunData]) -> list[str]:
    rows = []
    for r in runs:
        if not r.training:
            continue
        s = training_summary(r.training)
        rows.append(
            [
                bold(r.name),
                s["steps"],
                fmt(s["epoch"]),
                s["loss"],
                s["ce"],
                s["entropy"],
                s["mean_token_accuracy"],
                s["eval_loss"],
                s["eval_ppl"],
                s["eval_entropy"],
            ]
        )
    if not rows:
        return []
    header = [
        "run",
        "steps",
        "epoch",
        "train loss",
        "train CE",
        "train entropy",
        "token acc",
        "eval loss",
        "eval ppl",
        "eval entropy",
    ]
    return [
        "## Training",
        "",
        *table(header, [[x if not isinstance(x, float) else round(x, 4) for x in row] for row in rows]),
        "",
        "Last logged values of `trainer_state.json` (`log_history`); CE / entropy / token accuracy are logged by "
        "the distmatch trainers next to the objective. Eval perplexity = exp(eval CE), else exp(eval loss) below 50 "
        "(none above: a diverged run).",
        "",
    ]
