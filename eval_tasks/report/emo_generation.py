"""The report's sections for EMO's generation results: open-ended generation (MAUVE beside Table 1, the oracle data
of Table 2) and AlpacaEval win rates (Tables 9-10), each run's numbers beside the published rows."""

from __future__ import annotations

from typing import Any

from eval_tasks import published as P
from eval_tasks.open_ended.open_ended import (
    CORPORA,
    EMO_FEATURIZER,
    EMO_MAX_TEXT_LENGTH,
    ORACLE_CORPUS,
    published_benchmark,
)
from eval_tasks.report.collect import RunData
from eval_tasks.report.markdown import bold, fmt, table

__all__ = ["open_ended_section", "win_rate_section"]

#: Table 1's corpora in the paper's column order, and the oracle data of Table 2
TABLE1 = tuple(published_benchmark(k) for k in CORPORA if k != ORACLE_CORPUS)
ORACLE = published_benchmark(ORACLE_CORPUS)
TITLES = {published_benchmark(k): spec.title for k, spec in CORPORA.items()}
#: Table 2's columns
ORACLE_METRICS = ("oracle_ppl", "mauve", "rouge1", "rougeL")
METRIC_NAMES = {"oracle_ppl": "oracle PPL", "mauve": "MAUVE", "rouge1": "ROUGE-1", "rougeL": "ROUGE-L"}


def _value(entry: dict[str, Any], metric: str) -> str | None:
    if metric not in entry["metrics"]:
        return None
    mean, std = entry["metrics"][metric], entry["std"].get(metric)
    return fmt(mean) + (f" ± {fmt(std)}" if std is not None else "")


def _scoring(entry: dict[str, Any]) -> str:
    """How MAUVE was computed, and whether that is the paper's way (gpt2-large features, 256 tokens)."""
    featurizer = entry.get("featurizer") or "?"
    length = entry.get("max_text_length") or EMO_MAX_TEXT_LENGTH
    paper = featurizer == EMO_FEATURIZER and length == EMO_MAX_TEXT_LENGTH
    rounds = f"{entry['seeds']} seed file(s) x 5 rounds" if entry.get("seeds") else "5 rounds"
    return f"{entry['via']}; {rounds}; MAUVE features {featurizer}, {length} tokens" + (
        "" if paper else " (not the paper's: not comparable)"
    )


def _published_by_label(
    benchmarks: tuple[str, ...], model_filter: str | None, used: set[tuple[str, str]]
) -> dict[str, dict[str, float]]:
    """label -> benchmark -> MAUVE over several benchmarks' published rows (one row per method and base model)."""
    rows: dict[str, dict[str, float]] = {}
    for benchmark in benchmarks:
        for p in P.published_rows(benchmark, model_filter):
            if "mauve" in p["values"]:
                rows.setdefault(p["label"], {})[benchmark] = p["values"]["mauve"]
                used.add((p["paper"], p["table"]))
    return rows


def open_ended_section(
    runs: list[RunData], pub: bool, model_filter: str | None, used: set[tuple[str, str]]
) -> list[str]:
    """MAUVE of each run per corpus beside EMO Table 1; the oracle data beside Table 2; every metric per run."""
    if not any(r.open_ended for r in runs):
        return []
    lines = ["## Open-ended generation (EMO)", ""]
    columns = [b for b in TABLE1 if any(b in r.open_ended for r in runs)]
    if columns:
        rows: list[list[Any]] = [
            [
                bold(r.name),
                *[_value(r.open_ended[b], "mauve") if b in r.open_ended else None for b in columns],
            ]
            for r in runs
            if any(b in r.open_ended for b in columns)
        ]
        if pub:
            for label, values in _published_by_label(tuple(columns), model_filter, used).items():
                rows.append([label, *[values.get(b) for b in columns]])
        lines += ["### MAUVE per corpus (EMO Table 1; x100)", ""]
        lines += [*table(["run", *[TITLES[b] for b in columns]], rows), ""]
    if any(ORACLE in r.open_ended for r in runs):
        rows = [
            [bold(r.name), *[_value(r.open_ended[ORACLE], m) for m in ORACLE_METRICS]]
            for r in runs
            if ORACLE in r.open_ended
        ]
        if pub:
            for p in P.published_rows(ORACLE, model_filter):
                rows.append([p["label"], *[p["values"].get(m) for m in ORACLE_METRICS]])
                used.add((p["paper"], p["table"]))
        lines += ["### Oracle data: GPT-2-large samples (EMO Table 2)", ""]
        lines += [*table(["run", *[METRIC_NAMES[m] for m in ORACLE_METRICS]], rows), ""]
    detail = []
    for r in runs:
        for benchmark, entry in r.open_ended.items():
            values = [_value(entry, m) for m in ("mauve", "rouge1", "rougeL", "oracle_ppl")]
            detail.append([bold(r.name), TITLES.get(benchmark, benchmark), *values, _scoring(entry)])
    lines += [
        "### Every open-ended metric",
        "",
        *table(["run", "corpus", "MAUVE", "ROUGE-1", "ROUGE-L", "oracle PPL", "scoring"], detail),
        "",
        "MAUVE and ROUGE x100 (mean ± standard deviation over the sampling rounds and seed files, where a "
        "`distmatch-eval open-ended score` output gives them; an lm-eval task reports the mean over its 5 rounds); "
        "oracle PPL raw. The published rows are the mean of 5 sampling rounds over 3 training seeds, MAUVE with "
        "gpt2-large features at 256 tokens: a run scored another way, on a subset (`--limit`) or with one seed "
        "is not directly comparable.",
        "",
    ]
    return lines


def win_rate_section(
    runs: list[RunData], pub: bool, model_filter: str | None, used: set[tuple[str, str]]
) -> list[str]:
    """AlpacaEval win rates (``distmatch-eval alpacaeval winrate``) beside EMO Tables 9-10."""
    measured = [r for r in runs if "alpacaeval" in r.win_rates]
    if not measured:
        return []
    rows: list[list[Any]] = []
    for r in measured:
        w = r.win_rates["alpacaeval"]
        record = f"{w.get('n_wins')} / {w.get('n_draws')} / {w.get('n_wins_base')} of {w.get('n_total')}"
        judge = ", ".join(w.get("annotator") or []) or "?"
        reference = ", ".join(w.get("reference") or []) or "?"
        rows.append([bold(r.name), w["win_rate"], record, judge, reference])
    if pub:
        for p in P.published_rows("alpacaeval", model_filter):
            rows.append(
                [p["label"], p["values"].get("win_rate"), None, "GPT-4 (AlpacaEval 1)", "text-davinci-003"]
            )
            used.add((p["paper"], p["table"]))
    return [
        "### AlpacaEval win rate (EMO Tables 9-10; %)",
        "",
        *table(["run", "win rate", "wins / draws / losses", "judge", "reference"], rows),
        "",
        "Win rate = 100 x mean(preference - 1) over the judged pairs (a draw counts half). The published rows were "
        "judged by GPT-4 against text-davinci-003 (AlpacaEval 1) on the 805 instructions: another judge or "
        "reference is not directly comparable.",
        "",
    ]
