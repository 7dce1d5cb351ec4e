"""``distmatch-eval report``: collect several runs' results and write a markdown report with PNG plots.

A run is a name and one or more files or folders. Files are recognised by content:

* lm-eval results (``results_*.json``: ``results`` + ``configs``/``versions``) - every task's metrics;
* ``distmatch-eval diversity`` output (``kind: distmatch.diversity``), or a ``generate`` JSONL (scored here with
  the default settings);
* ``distmatch-eval nexttoken`` output (``kind: distmatch.nexttoken``);
* a Trainer's ``trainer_state.json`` (``log_history``); in a folder, the one with the highest ``global_step``.

The papers' numbers (``eval_tasks.published``) are shown under the runs for every benchmark the runs have, with
the paper and table of each row; protocol differences that make a comparison unfair are listed under each table.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval_tasks import published as P
from eval_tasks.protocols import paper_protocol_check
from trl_ext._optional import require

__all__ = ["RunData", "build_report", "collect_run", "parse_run_specs"]

# lm-eval metrics that are not fractions in [0, 1] (everything else is shown x100, as the papers do).
_NOT_FRACTIONS = {
    "ngram_diversity",
    "self_bleu_diversity",
    "sbert_diversity",
    "mauve",
    "perplexity",
    "word_perplexity",
    "byte_perplexity",
    "bits_per_byte",
}
DIVERSITY_METRICS = ("ngram_diversity", "self_bleu_diversity", "sbert_diversity", "mauve")
METRIC_TITLES = {
    "acc": "acc",
    "ngram_diversity": "N-gram div.",
    "self_bleu_diversity": "Self-BLEU div.",
    "sbert_diversity": "Sentence-BERT div.",
    "mauve": "MAUVE",
    "prompt_level_strict_acc": "prompt strict",
    "inst_level_strict_acc": "instr. strict",
    "prompt_level_loose_acc": "prompt loose",
    "inst_level_loose_acc": "instr. loose",
    "perplexity": "perplexity",
}
_NLU_ORDER = ("tweet_emotion", "sst2", "trec", "subj", "cr", "rt", "ag_news", "mmlu")
_NLU_SHORT = {"tweet_emotion": "TE", "sst2": "SST-2", "trec": "TREC", "subj": "Subj", "cr": "CR", "rt": "RT",
              "ag_news": "AG", "mmlu": "MMLU"}  # fmt: skip


class ReportError(ValueError):
    """Bad report input: an unparsable --run, a missing path, a file of unknown kind."""


@dataclass
class RunData:
    name: str
    sources: list[str] = field(default_factory=list)
    lm_eval: dict[str, dict[str, float]] = field(
        default_factory=dict
    )  # task -> metric -> value (paper scale)
    #: task -> paper-protocol check of an lm-eval task (eval_tasks.protocols.paper_protocol_check)
    lm_eval_protocol: dict[str, dict[str, Any]] = field(default_factory=dict)
    diversity: dict[str, dict[str, Any]] = field(default_factory=dict)  # benchmark/label -> entry
    nexttoken: list[dict[str, Any]] = field(default_factory=list)
    training: dict[str, Any] | None = None

    def is_empty(self) -> bool:
        return not (self.lm_eval or self.diversity or self.nexttoken or self.training)


# ---------------------------------------------------------------------------------------------------------
# Collecting


def parse_run_specs(specs: Sequence[str]) -> dict[str, list[Path]]:
    """``["ce=out/ce", "gem=a.json", "gem=b.json"]`` -> ``{"ce": [...], "gem": [a, b]}`` (order kept)."""
    runs: dict[str, list[Path]] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ReportError(f"--run {spec!r}: expected NAME=PATH (e.g. --run ce=outputs/ce).")
        p = Path(path.strip()).expanduser()
        if not p.exists():
            raise ReportError(f"--run {spec!r}: {p} does not exist.")
        runs.setdefault(name.strip(), []).append(p)
    return runs


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ReportError(f"{path}: not valid JSON ({err}).") from err


def _kind(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    if data.get("kind") in ("distmatch.diversity", "distmatch.nexttoken"):
        return data["kind"].split(".")[1]
    if isinstance(data.get("log_history"), list):
        return "training"
    if isinstance(data.get("results"), dict) and any(
        k in data for k in ("configs", "versions", "n-shot", "config")
    ):
        return "lm_eval"
    return None


def _is_generate_jsonl(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(first, dict) and isinstance(first.get("samples"), list)


def collect_run(name: str, paths: Sequence[Path]) -> RunData:
    """Read every recognised file of a run (folders recursively; unknown JSON in folders is skipped)."""
    run = RunData(name)
    trainer_states: list[tuple[int, Path, dict[str, Any]]] = []
    for root in paths:
        explicit = root.is_file()
        files = [root] if explicit else sorted(p for p in root.rglob("*") if p.suffix in (".json", ".jsonl"))
        lm_eval_files: list[tuple[float, Path, dict[str, Any]]] = []
        sample_files: list[Path] = []
        for path in files:
            if path.suffix == ".jsonl":
                if _is_generate_jsonl(path):
                    sample_files.append(path)
                elif explicit:
                    raise ReportError(f"{path}: not a distmatch-eval generate JSONL (no 'samples' list).")
                continue
            data = _load_json(path)
            kind = _kind(data)
            if kind is None:
                if explicit:
                    raise ReportError(
                        f"{path}: not an lm-eval results file, a distmatch-eval diversity/nexttoken JSON or a "
                        "trainer_state.json."
                    )
                continue
            if kind == "lm_eval":
                lm_eval_files.append((path.stat().st_mtime, path, data))
            elif kind == "diversity":
                _add_diversity(run, path, data)
            elif kind == "nexttoken":
                run.nexttoken.append({**data, "source": str(path)})
                run.sources.append(str(path))
            elif kind == "training":
                trainer_states.append((int(data.get("global_step") or 0), path, data))
        for _, path, data in sorted(lm_eval_files, key=lambda item: item[0]):  # later runs override
            _add_lm_eval(run, path, data)
        # A generate JSONL found in a folder is scored here (default settings) only when no diversity JSON of
        # the run was computed from it; one given explicitly is always scored.
        scored = set()
        for e in run.diversity.values():
            if e.get("samples_file"):
                sf = Path(e["samples_file"])
                scored |= {sf.resolve(), (Path(e["source"]).parent / sf.name).resolve()}
        for path in sample_files:
            if explicit or path.resolve() not in scored:
                _add_generate_jsonl(run, path)
    if trainer_states:
        _, path, data = max(trainer_states, key=lambda item: item[0])
        run.training = {
            "source": str(path),
            "log_history": data["log_history"],
            "global_step": data.get("global_step"),
        }
        run.sources.append(str(path))
    if run.is_empty():
        raise ReportError(f"run {name!r}: no results found in {', '.join(map(str, paths))}.")
    return run


def _add_lm_eval(run: RunData, path: Path, data: dict[str, Any]) -> None:
    run.sources.append(str(path))
    for task, values in data["results"].items():
        if not isinstance(values, dict):
            continue
        metrics: dict[str, float] = {}
        for key, value in values.items():
            metric, comma, filt = key.partition(",")
            if (
                not comma
                or metric.endswith("_stderr")
                or not isinstance(value, (int, float))
                or isinstance(value, bool)
            ):
                continue
            if metric in metrics and filt not in ("none", ""):
                continue  # keep the unfiltered value when a metric has several filters
            metrics[metric] = float(value) * (1.0 if metric in _NOT_FRACTIONS else 100.0)
        if not metrics:
            continue
        check = paper_protocol_check(
            task,
            ((data.get("configs") or {}).get(task) or {}).get("metadata"),
            n_samples=(data.get("n-samples") or {}).get(task),
            chat_template=bool(data.get("chat_template")) if "chat_template" in data else None,
        )
        benchmark = P.benchmark_for_task(task)
        if benchmark and P.benchmarks()[benchmark]["family"] == "creative":
            check = check or {"protocol": "?", "comparable": False, "differences": []}
            run.diversity[benchmark] = {
                "benchmark": benchmark,
                "metrics": {m: v for m, v in metrics.items() if m in DIVERSITY_METRICS},
                "protocol": f"lm-eval task {task}, protocol {check['protocol']}"
                + (" (paper-comparable)" if check["comparable"] else ""),
                "protocol_differences": list(check["differences"]),
                "comparable_to_published": check["comparable"],
                "source": str(path),
            }
        else:
            run.lm_eval[task] = metrics
            if check is not None:
                run.lm_eval_protocol[task] = check


def _protocol_label(data: dict[str, Any]) -> str:
    settings = data.get("settings") or {}
    parts = [settings["scoring"]] if "scoring" in settings else []
    if "self_bleu" in settings:
        parts.append(
            "Self-BLEU: " + ("1 ref (GEM script)" if settings["self_bleu"].get("gem_compat") else "all refs")
        )
    if "sbert" in settings:
        parts.append("SBERT: " + str(settings["sbert"].get("name", "?")).split("/")[-1])
    if data.get("metrics", {}).get("mauve_featurizer"):
        parts.append("MAUVE: " + data["metrics"]["mauve_featurizer"])
    return "; ".join(parts)


def _add_diversity(run: RunData, path: Path, data: dict[str, Any]) -> None:
    benchmark = data.get("benchmark")
    label = benchmark or Path(data.get("samples_file") or path).stem
    # The same samples may be scored several ways: label the non-default scorings (order-independent).
    settings = data.get("settings") or {}
    if (settings.get("self_bleu") or {}).get("gem_compat"):
        label += " (gem-compat)"
    elif settings.get("scoring") == "prompt+response":
        label += " (prompt+response)"
    metrics = {k: v for k, v in data.get("metrics", {}).items() if k in DIVERSITY_METRICS}
    existing = run.diversity.get(label)
    shared = set(existing["metrics"]) & set(metrics) if existing is not None else set()
    if existing is not None and all(abs(existing["metrics"][m] - metrics[m]) < 1e-9 for m in shared):
        # same samples and scoring, further metrics (e.g. MAUVE computed separately): one row
        existing["metrics"].update(metrics)
        parts = existing["protocol"].split("; ") + _protocol_label(data).split("; ")
        existing["protocol"] = "; ".join(dict.fromkeys(x for x in parts if x and x != "?"))
        existing["protocol_differences"] += [
            d for d in data.get("protocol_differences") or [] if d not in existing["protocol_differences"]
        ]
        existing["source"] += f", {path}"
        run.sources.append(str(path))
        return
    if label in run.diversity:
        label += f" ({path.stem})"
    while label in run.diversity:
        label += "'"
    run.diversity[label] = {
        "benchmark": benchmark,
        "samples_file": data.get("samples_file"),
        "metrics": {k: v for k, v in data.get("metrics", {}).items() if k in DIVERSITY_METRICS},
        "protocol": _protocol_label(data),
        "protocol_differences": list(data.get("protocol_differences") or []),
        "num_prompts": data.get("num_prompts"),
        "source": str(path),
    }
    run.sources.append(str(path))


def _add_generate_jsonl(run: RunData, path: Path) -> None:
    from eval_tasks import cli, metrics

    records = cli.read_jsonl(path)
    result = metrics.corpus_diversity(records)
    meta = records[0].get("meta") or {}
    benchmark = meta.get("benchmark") or cli.detect_benchmark([r.get("prompt") for r in records])
    ks = {len(r["samples"]) for r in records}
    data = {
        "benchmark": benchmark,
        "samples_file": str(path),
        "metrics": result.metrics,
        "settings": result.settings,
        "num_prompts": len(records),
        "protocol_differences": cli._gem_protocol_notes(result.settings, meta, len(records), ks, benchmark),
    }
    _add_diversity(run, path, data)


# ---------------------------------------------------------------------------------------------------------
# Markdown helpers


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def cell(x: Any) -> str:
        return _fmt(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return lines


def _bold(text: str) -> str:
    return f"**{text}**"


# ---------------------------------------------------------------------------------------------------------
# Sections


def _nlu_section(
    runs: list[RunData], pub: bool, model_filter: str | None, used: set[tuple[str, str]]
) -> list[str]:
    tasks = {b: P.benchmarks()[b]["lm_eval_tasks"][0] for b in _NLU_ORDER}
    present = [b for b in _NLU_ORDER if any(tasks[b] in r.lm_eval for r in runs)]
    if not present:
        return []
    header = ["run", *[_NLU_SHORT[b] for b in present]] + (
        ["Avg (8)"] if len(present) == len(_NLU_ORDER) else []
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
        row = [_bold(r.name), *values]
        if len(present) == len(_NLU_ORDER):
            row.append(sum(values) / len(values) if all(v is not None for v in values) else None)
        if checks and all(c is not None and c["comparable"] for c in checks):
            row.append("emo_official: paper-comparable")
        elif checks:
            differences = list(dict.fromkeys(d for c in checks if c for d in c["differences"]))
            protocols = sorted({c["protocol"] for c in checks if c})
            notes.append(f"{len(notes) + 1}. {_bold(r.name)}: " + "; ".join(differences) + ".")
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
            if len(present) == len(_NLU_ORDER):
                row.append(sum(values) / len(values) if all(v is not None for v in values) else None)
            row.append("published")
            rows.append(row)
    lines = ["### In-context NLU (EMO §4.2; accuracy, %)", ""]
    lines += _table(header, rows)
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


def _ifeval_section(
    runs: list[RunData], pub: bool, model_filter: str | None, used: set[tuple[str, str]]
) -> list[str]:
    spec = P.benchmarks()["ifeval"]
    task_of = {r.name: next((t for t in spec["lm_eval_tasks"] if t in r.lm_eval), None) for r in runs}
    if not any(task_of.values()):
        return []
    metrics = spec["metrics"]
    rows = [
        [_bold(r.name), *[r.lm_eval[task_of[r.name]].get(m) for m in metrics]]
        for r in runs
        if task_of[r.name]
    ]
    if pub:
        for p in P.published_rows("ifeval", model_filter):
            rows.append([p["label"], *[p["values"].get(m) for m in metrics]])
            used.add((p["paper"], p["table"]))
    lines = ["### IFEval (GEM Table 1; accuracy, %)", ""]
    lines += _table(["run", *[METRIC_TITLES[m] for m in metrics]], rows)
    lines += [
        "",
        "Published rows: Llama-3-8B fine-tuned on UltraFeedback; greedy, up to 1,024 new tokens.",
        "",
    ]
    return lines


def _other_tasks_section(runs: list[RunData]) -> list[str]:
    known = {t for spec in P.benchmarks().values() for t in spec.get("lm_eval_tasks", ())}
    rows = []
    for r in runs:
        for task, metrics in sorted(r.lm_eval.items()):
            if task in known:
                continue
            for metric, value in sorted(metrics.items()):
                rows.append([_bold(r.name), task, metric, value])
    if not rows:
        return []
    return [
        "### Other lm-eval tasks (fractions shown x100)",
        "",
        *_table(["run", "task", "metric", "value"], rows),
        "",
    ]


def _diversity_section(
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
            name = _bold(r.name) + (label[len(key) :] if label.startswith(key) else "")
            if entry["protocol_differences"]:
                notes.append(f"{len(notes) + 1}. {name}: " + "; ".join(entry["protocol_differences"]) + ".")
                name += f" [{len(notes)}]"
            rows.append([name, *[entry["metrics"].get(m) for m in metrics], entry["protocol"]])
        if pub and spec:
            for p in P.published_rows(key, model_filter):
                rows.append([p["label"], *[p["values"].get(m) for m in metrics], _published_protocol(p)])
                used.add((p["paper"], p["table"]))
        lines += [f"### {title}", ""]
        lines += _table(["run", *[METRIC_TITLES.get(m, m) for m in metrics], "scoring"], rows)
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


def _nexttoken_section(
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
            rows.append([
                _bold(r.name), entry.get("benchmark") or Path(entry.get("data_file") or "?").name,
                stats["perplexity"], f"{stats['mean_entropy']:.3f}", f"{stats['mean_top1_prob']:.4f}",
                f"{stats['top1_accuracy']:.4f}", stats["num_tokens"],
            ])  # fmt: skip
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
        lines += _table(
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
                    top = ", ".join(f"{label} {p:.3f}" for _, label, p in _probe_tokens(d)[:3])
                    probe_rows.append(
                        [_bold(r.name), d["prompt"], f"{d['entropy']:.3f}", f"{d['top1_prob']:.4f}", top]
                    )
        lines += _table(["run", "prompt", "entropy", "top-1 prob", "top tokens"], probe_rows)
        lines.append("")
    return lines


def _training_summary(training: dict[str, Any]) -> dict[str, Any]:
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


def _training_section(runs: list[RunData]) -> list[str]:
    rows = []
    for r in runs:
        if not r.training:
            continue
        s = _training_summary(r.training)
        rows.append([
            _bold(r.name), s["steps"], _fmt(s["epoch"]), s["loss"], s["ce"], s["entropy"], s["mean_token_accuracy"],
            s["eval_loss"], s["eval_ppl"], s["eval_entropy"],
        ])  # fmt: skip
    if not rows:
        return []
    header = ["run", "steps", "epoch", "train loss", "train CE", "train entropy", "token acc", "eval loss",
              "eval ppl", "eval entropy"]  # fmt: skip
    return [
        "## Training",
        "",
        *_table(header, [[x if not isinstance(x, float) else round(x, 4) for x in row] for row in rows]),
        "",
        "Last logged values of `trainer_state.json` (`log_history`); CE / entropy / token accuracy are logged by "
        "the distmatch trainers next to the objective. Eval perplexity = exp(eval CE), else exp(eval loss).",
        "",
    ]


# ---------------------------------------------------------------------------------------------------------
# Plots


def _plt() -> Any:
    matplotlib = require("matplotlib", extra="eval", feature="distmatch-eval report plots")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _grouped_bars(
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


def _accuracy_plot(runs: list[RunData], out: Path) -> Path | None:
    entries: list[tuple[str, str, str]] = []
    for r in runs:
        for task, metrics in r.lm_eval.items():
            b = P.benchmark_for_task(task)
            wanted = (
                P.benchmarks()[b]["metrics"] if b else (["acc"] if "acc" in metrics else sorted(metrics)[:1])
            )
            for m in wanted:
                label = (_NLU_SHORT.get(b or "", task.removeprefix("distmatch_")) if m == "acc" else
                         f"{task.removeprefix('distmatch_')}\n{METRIC_TITLES.get(m, m)}")  # fmt: skip
                if m in metrics and (label, task, m) not in entries:
                    entries.append((label, task, m))
    if not entries:
        return None
    order = {task: i for i, task in enumerate(P.benchmarks()[b]["lm_eval_tasks"][0] for b in _NLU_ORDER)}
    entries.sort(key=lambda e: (order.get(e[1], 99), e[1], e[2]))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(entries) + 2), 4.2))
    series = {r.name: [r.lm_eval.get(t, {}).get(m) for _, t, m in entries] for r in runs if r.lm_eval}
    _grouped_bars(ax, [e[0] for e in entries], series, "score (%)")
    ax.set_title("Accuracy per task (lm-eval)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _diversity_plot(runs: list[RunData], out: Path) -> Path | None:
    labels: list[str] = []
    for r in runs:
        labels += [b for b in r.diversity if b not in labels]
    metrics = [
        m for m in DIVERSITY_METRICS if any(m in e["metrics"] for r in runs for e in r.diversity.values())
    ]
    if not metrics:
        return None
    plt = _plt()
    width = max(3.6, 1.2 * len(labels) + 1.5)
    fig, axes = plt.subplots(1, len(metrics), figsize=(width * len(metrics) + 1, 4.2), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        series = {
            r.name: [r.diversity.get(b, {}).get("metrics", {}).get(m) for b in labels]
            for r in runs
            if r.diversity
        }
        _grouped_bars(ax, ["\n".join(textwrap.wrap(b, 18)) for b in labels], series, "0-100")
        ax.set_title(METRIC_TITLES.get(m, m))
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Diversity per metric (higher = more diverse)")
    fig.tight_layout()
    path = out / "diversity.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _probe_tokens(d: dict[str, Any]) -> list[tuple[Any, str, float]]:
    """(key, label, probability) per listed token; keyed by id (several byte tokens decode to the same '\ufffd')."""
    ids = d.get("token_ids") or d["tokens"]
    pieces = d.get("token_pieces") or d["tokens"]
    out = []
    for key, text, piece, prob in zip(ids, d["tokens"], pieces, d["probs"]):
        label = repr(piece) if "\ufffd" in text or not text.strip() else repr(text)
        out.append((key, label, prob))
    return out


def _nexttoken_plot(runs: list[RunData], out: Path, max_tokens: int = 8) -> Path | None:
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
    plt = _plt()
    fig, axes = plt.subplots(1, len(prompts), figsize=(4.6 * len(prompts) + 0.5, 4.4), squeeze=False)
    for ax, prompt in zip(axes[0], prompts):
        best: dict[Any, float] = {}
        labels: dict[Any, str] = {}
        for name in names:
            d = dists.get((name, prompt))
            for key, label, p in _probe_tokens(d) if d else ():
                best[key] = max(best.get(key, 0.0), p)
                labels[key] = label
        keys = sorted(best, key=lambda k: -best[k])[:max_tokens]
        series = {}
        for name in names:
            d = dists.get((name, prompt))
            probs = {key: p for key, _, p in _probe_tokens(d)} if d else {}
            # None = not among this run's listed top tokens (no bar)
            series[f"{name} (H={d['entropy']:.2f})" if d else name] = [probs.get(k) for k in keys]
        _grouped_bars(ax, [labels[k] for k in keys], series, "probability", value_format="%.2g")
        top = max((v for values in series.values() for v in values if v is not None), default=1.0)
        ax.set_ylim(0, min(1.0, 1.25 * top) or 1.0)
        ax.set_title("\n".join(textwrap.wrap(prompt, 38)), fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Next-token distributions (first response token, cf. GEM figure 6)")
    fig.tight_layout()
    path = out / "next_token.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _training_plot(runs: list[RunData], out: Path) -> Path | None:
    with_logs = [r for r in runs if r.training and any("loss" in h for h in r.training["log_history"])]
    if not with_logs:
        return None
    keys = [
        k
        for k in ("loss", "entropy", "eval_loss")
        if any(k in h for r in with_logs for h in r.training["log_history"])
    ]
    plt = _plt()
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
    fig.tight_layout()
    path = out / "training.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------------
# Report


def build_report(
    run_specs: dict[str, list[Path]],
    out_dir: Path,
    *,
    title: str = "distmatch evaluation report",
    published: bool = True,
    published_model: str | None = None,
) -> list[Path]:
    """Write ``report.md``, ``report.json`` and the PNG plots to `out_dir`; return the written paths."""
    if not run_specs:
        raise ReportError("no runs given (--run NAME=PATH).")
    runs = [collect_run(name, paths) for name, paths in run_specs.items()]
    out_dir.mkdir(parents=True, exist_ok=True)
    used: set[tuple[str, str]] = set()
    body: list[str] = []
    accuracy = _nlu_section(runs, published, published_model, used)
    accuracy += _ifeval_section(runs, published, published_model, used)
    accuracy += _other_tasks_section(runs)
    plots = {
        "accuracy": _accuracy_plot(runs, out_dir),
        "diversity": _diversity_plot(runs, out_dir),
        "next_token": _nexttoken_plot(runs, out_dir),
        "training": _training_plot(runs, out_dir),
    }
    if accuracy:
        body += ["## Accuracy (lm-eval)", "", *accuracy]
        if plots["accuracy"]:
            body += ["![Accuracy per task](accuracy.png)", ""]
    diversity = _diversity_section(runs, published, published_model, used)
    if diversity:
        body += diversity + (["![Diversity per metric](diversity.png)", ""] if plots["diversity"] else [])
    nexttoken = _nexttoken_section(runs, published, published_model, used)
    if nexttoken:
        body += nexttoken + (
            ["![Next-token distributions](next_token.png)", ""] if plots["next_token"] else []
        )
    training = _training_section(runs)
    if training:
        body += training + (["![Training curves](training.png)", ""] if plots["training"] else [])
    head = [
        f"# {title}",
        "",
        f"Generated by `distmatch-eval report` on {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}. Run names are in "
        "bold; the other rows are the papers' published numbers (method · base model [paper table]).",
        "",
        "## Runs",
        "",
        *_table(
            ["run", "sources"], [[_bold(r.name), "<br>".join(f"`{s}`" for s in r.sources)] for r in runs]
        ),
        "",
    ]
    tail: list[str] = []
    if used:
        tail += ["## Sources of the published numbers", ""]
        sources: dict[str, set[str]] = {}
        for row in P.numbers():
            if (row["paper"], row["table"]) in used:
                sources.setdefault(row["source"], set()).add(row["table"])
        notes = P.source_notes()
        for source, tables in sources.items():
            tail.append(f"- {source} — {', '.join(sorted(tables))}")
            tail += [f"  - {note}" for note in notes.get(source, [])]
        tail += [
            "",
            "Data: `eval_tasks/published/*.json` (one record per number, with its paper and table).",
            "",
        ]
    report_md = out_dir / "report.md"
    report_md.write_text("\n".join(head + body + tail), encoding="utf-8")
    report_json = out_dir / "report.json"
    report_json.write_text(
        json.dumps(
            {
                "title": title,
                "runs": [
                    {
                        "name": r.name,
                        "sources": r.sources,
                        "lm_eval": r.lm_eval,
                        "diversity": r.diversity,
                        "nexttoken": [{k: v for k, v in e.items()} for e in r.nexttoken],
                        "training": _training_summary(r.training) if r.training else None,
                    }
                    for r in runs
                ],
                "published_tables_shown": sorted(f"{p} - {t}" for p, t in used),
                "plots": {k: v.name for k, v in plots.items() if v},
            },
            indent=2,
            ensure_ascii=False,
        )
        + "\n",
        encoding="utf-8",
    )
    return [report_md, report_json, *[p for p in plots.values() if p]]
