"""Collecting a run's results: lm-eval results files, ``distmatch-eval`` diversity / nexttoken JSONs, samples JSONL
and ``trainer_state.json``, recognised by content."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval_tasks import published as P
from eval_tasks.protocols import paper_protocol_check
from eval_tasks.report.labels import DIVERSITY_METRICS, NOT_FRACTIONS, NOVELTY_METRICS
from eval_tasks.samples import read_text

__all__ = ["ReportError", "RunData", "collect_run", "parse_run_specs"]


class ReportError(ValueError):
    """Bad report input: an unparsable --run, a missing path, a file of unknown kind."""


@dataclass
class RunData:
    name: str
    sources: list[str] = field(default_factory=list)
    # task -> metric -> value (paper scale)
    lm_eval: dict[str, dict[str, float]] = field(default_factory=dict)
    #: task -> paper-protocol check of an lm-eval task (eval_tasks.protocols.paper_protocol_check)
    lm_eval_protocol: dict[str, dict[str, Any]] = field(default_factory=dict)
    diversity: dict[str, dict[str, Any]] = field(default_factory=dict)  # benchmark/label -> entry
    nexttoken: list[dict[str, Any]] = field(default_factory=list)
    training: dict[str, Any] | None = None
    #: benchmark (gsm8k, math, alpacaeval_bon) -> {"curve": metric@k -> value, "source": path} of a
    #: ``distmatch-eval voting`` / ``reward`` output
    curves: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: EMO open-ended benchmark (emo_lm_<corpus>, emo_oracle_gpt2_large) -> {"metrics", "std", "featurizer",
    #: "seeds", "via", "source"} of an lm-eval distmatch_open_ended_* task or a ``distmatch-eval open-ended score``
    open_ended: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: judged benchmark (alpacaeval) -> a ``distmatch-eval alpacaeval winrate`` output, with its "source"
    win_rates: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: NoveltyBench subset (noveltybench_curated, ...) -> {"metrics", "setting", "via", "source"}
    novelty: dict[str, dict[str, Any]] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (
            self.lm_eval
            or self.diversity
            or self.nexttoken
            or self.training
            or self.curves
            or self.open_ended
            or self.win_rates
            or self.novelty
        )


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
    text = read_text(path)  # not UTF-8: refused naming the line
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: not valid JSON ({err}).") from err


def _kind(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    if data.get("kind") in ("distmatch.diversity", "distmatch.nexttoken"):
        return data["kind"].split(".")[1]
    if data.get("kind") in ("distmatch.voting", "distmatch.reward"):
        return "curve"
    if data.get("kind") == "distmatch.open_ended":
        return "open_ended"
    if data.get("kind") == "distmatch.win_rate":
        return "win_rate"
    if data.get("kind") == "distmatch.novelty":
        return "novelty"
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
                    read_text(path)  # not UTF-8: said so, naming the line
                    raise ReportError(f"{path}: not a distmatch-eval generate JSONL (no 'samples' list).")
                continue
            data = _load_json(path)
            kind = _kind(data)
            if kind is None:
                if explicit:
                    raise ReportError(
                        f"{path}: not an lm-eval results file, a distmatch-eval diversity/nexttoken/voting/reward "
                        "/open-ended/win-rate/novelty JSON or a trainer_state.json."
                    )
                continue
            if kind == "lm_eval":
                lm_eval_files.append((path.stat().st_mtime, path, data))
            elif kind == "diversity":
                _add_diversity(run, path, data)
            elif kind == "nexttoken":
                run.nexttoken.append({**data, "source": str(path)})
                run.sources.append(str(path))
            elif kind == "curve":
                _add_curve(run, path, data)
            elif kind == "open_ended":
                _add_open_ended_score(run, path, data)
            elif kind == "win_rate":
                _add_win_rate(run, path, data)
            elif kind == "novelty":
                _add_novelty(run, path, data)
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
            metrics[metric] = float(value) * (1.0 if metric in NOT_FRACTIONS else 100.0)
        if not metrics:
            continue
        check = paper_protocol_check(
            task,
            ((data.get("configs") or {}).get(task) or {}).get("metadata"),
            n_samples=(data.get("n-samples") or {}).get(task),
            chat_template=bool(data.get("chat_template")) if "chat_template" in data else None,
        )
        benchmark = P.benchmark_for_task(task)
        if benchmark and P.benchmarks()[benchmark]["family"] == "open_ended":
            metadata = ((data.get("configs") or {}).get(task) or {}).get("metadata") or {}
            _put_open_ended(
                run,
                benchmark,
                {
                    "metrics": metrics,
                    "std": {},
                    "featurizer": metadata.get("mauve_featurizer"),
                    "seeds": 1,
                    "via": f"lm-eval task {task}",
                    "source": str(path),
                },
            )
        elif benchmark and P.benchmarks()[benchmark]["family"] == "novelty":
            metadata = ((data.get("configs") or {}).get(task) or {}).get("metadata") or {}
            counts = (data.get("n-samples") or {}).get(task) or {}
            run.novelty[benchmark] = _novelty_entry(task, metrics, metadata, str(path), counts)
        elif benchmark and P.benchmarks()[benchmark]["family"] == "creative":
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


#: the benchmarks a ``distmatch-eval voting`` / ``reward`` curve may belong to, and their metric families
CURVE_FAMILIES = {
    "gsm8k": ("mv", "bon"),
    "math": ("mv", "bon"),
    "alpacaeval_bon": ("reward_bon", "win_rate_bon"),
}


def _add_curve(run: RunData, path: Path, data: dict[str, Any]) -> None:
    benchmark, curve = data.get("task"), data.get("curve")
    if benchmark not in CURVE_FAMILIES:
        raise ReportError(f"{path}: task must be one of {', '.join(CURVE_FAMILIES)}, got {benchmark!r}.")
    families = CURVE_FAMILIES[benchmark]
    ok = isinstance(curve, dict) and bool(curve)
    for key, value in (curve or {}).items() if ok else ():
        family, at, k = str(key).rpartition("@")
        if not (at and family in families and k.isdigit() and int(k) >= 1) or isinstance(value, bool):
            ok = False
        elif not isinstance(value, (int, float)):
            ok = False
    if not ok:
        raise ReportError(
            f"{path}: curve must map {'@k / '.join(families)}@k (k >= 1) to numbers, as distmatch-eval writes it."
        )
    if benchmark in run.curves:
        raise ReportError(
            f"run {run.name!r}: two {benchmark} curves ({run.curves[benchmark]['source']}, {path}); give one per run."
        )
    run.curves[benchmark] = {"curve": {str(k): float(v) for k, v in curve.items()}, "source": str(path)}
    run.sources.append(str(path))


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
    from eval_tasks.metrics import corpus_diversity
    from eval_tasks.results import gem_protocol_notes
    from eval_tasks.samples import check_same_settings, check_unique_ids, detect_benchmark, read_jsonl

    records = read_jsonl(path)
    check_unique_ids(records, path)
    check_same_settings(records, path)  # the row reports the first record's settings for all
    result = corpus_diversity(records)
    meta = records[0].get("meta") or {}
    benchmark = meta.get("benchmark") or detect_benchmark([r.get("prompt") for r in records])
    ks = {len(r["samples"]) for r in records}
    data = {
        "benchmark": benchmark,
        "samples_file": str(path),
        "metrics": result.metrics,
        "settings": result.settings,
        "num_prompts": len(records),
        "protocol_differences": gem_protocol_notes(result.settings, meta, len(records), ks, benchmark),
    }
    _add_diversity(run, path, data)


def _put_open_ended(run: RunData, benchmark: str, entry: dict[str, Any]) -> None:
    """One entry per benchmark: an ``open-ended score`` output (all rounds and seeds) wins over an lm-eval result,
    a later lm-eval result over an earlier one (as for every lm-eval task); two score outputs are refused."""
    existing = run.open_ended.get(benchmark)
    from_score = entry["via"].startswith("distmatch-eval")
    if existing is not None and existing["via"].startswith("distmatch-eval"):
        if not from_score:
            return
        raise ReportError(
            f"run {run.name!r}: two {benchmark} scores ({existing['source']}, {entry['source']}); give one per run "
            "(open-ended score averages several seeds' files into one)."
        )
    run.open_ended[benchmark] = entry


def _add_open_ended_score(run: RunData, path: Path, data: dict[str, Any]) -> None:
    """A ``distmatch-eval open-ended score`` output: the mean (and std over rounds and seeds) of each metric."""
    benchmark = data.get("benchmark") or path.stem
    metrics, std = {}, {}
    for key in ("mauve", "rouge1", "rougeL", "oracle_ppl"):
        value = data.get(key)
        if value is None:
            continue
        if not (isinstance(value, dict) and isinstance(value.get("mean"), (int, float))):
            raise ReportError(
                f"{path}: {key} must be {{'mean': ..., 'std': ...}}, as open-ended score writes it."
            )
        metrics[key], std[key] = float(value["mean"]), float(value.get("std") or 0.0)
    if "mauve" not in metrics:
        raise ReportError(f"{path}: no MAUVE (an open-ended score output has 'mauve': {{'mean', 'std'}}).")
    _put_open_ended(
        run,
        benchmark,
        {
            "metrics": metrics,
            "std": std,
            "featurizer": data.get("featurizer"),
            "max_text_length": data.get("max_text_length"),
            "seeds": len(data.get("seeds") or []),
            "via": "distmatch-eval open-ended score",
            "source": str(path),
        },
    )
    run.sources.append(str(path))


def _add_win_rate(run: RunData, path: Path, data: dict[str, Any]) -> None:
    benchmark = data.get("benchmark") or "alpacaeval"
    if not isinstance(data.get("win_rate"), (int, float)) or isinstance(data.get("win_rate"), bool):
        raise ReportError(f"{path}: no numeric win_rate (distmatch-eval alpacaeval winrate writes one).")
    if benchmark in run.win_rates:
        raise ReportError(
            f"run {run.name!r}: two {benchmark} win rates ({run.win_rates[benchmark]['source']}, {path}); "
            "give one per run."
        )
    run.win_rates[benchmark] = {**data, "source": str(path)}
    run.sources.append(str(path))


def _novelty_entry(
    task: str, metrics: dict[str, float], metadata: dict[str, Any], source: str, counts: dict[str, Any]
) -> dict[str, Any]:
    """A run's entry from an lm-eval NoveltyBench task (its setting: the results file's task metadata; a run of
    fewer prompts than the task has, e.g. with --limit, is not comparable)."""
    setting = dict(
        metadata.get("noveltybench_setting")
        or {
            "comparable": False,
            "note": "not comparable: the results file does not record NoveltyBench's setting",
        }
    )
    effective, original = counts.get("effective"), counts.get("original")
    if isinstance(effective, int) and isinstance(original, int) and effective < original:
        note = f"{effective} of the task's {original} prompts (--limit)"
        setting["note"] = (
            f"{setting['note']}; {note}"
            if not setting.get("comparable")
            else f"not comparable with NoveltyBench's published numbers: {note}"
        )
        setting["comparable"] = False
    return {
        "metrics": {m: metrics[m] for m in NOVELTY_METRICS if m in metrics},
        "setting": setting,
        "via": f"lm-eval task {task}",
        "source": source,
    }


def _add_novelty(run: RunData, path: Path, data: dict[str, Any]) -> None:
    """A ``distmatch-eval novelty`` JSON (``kind: distmatch.novelty``)."""
    label = data.get("benchmark") or Path(data.get("samples_file") or path).stem
    while label in run.novelty:
        label += "'"
    run.novelty[label] = {
        "metrics": {m: v for m, v in (data.get("metrics") or {}).items() if m in NOVELTY_METRICS},
        "setting": data.get("setting") or {},
        "via": "distmatch-eval novelty",
        "source": str(path),
    }
    run.sources.append(str(path))
