"""The EMO and GEM papers' published numbers, as data (``*.json`` next to this file).

Every number is one record with its source: ``paper``, ``table``, ``benchmark``, ``metric``, ``value`` (the paper's
scale: percent for accuracy / diversity / MAUVE), ``method`` (as the paper names it), ``loss`` (the distmatch loss
name it corresponds to, or null), ``base_model`` and ``train_data``. ``benchmarks.json`` says which lm-eval tasks
and ``distmatch-eval`` outputs each benchmark id corresponds to.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["benchmarks", "benchmark_for_task", "numbers", "published_rows", "source_notes"]

_BENCHMARKS_FILE = "benchmarks.json"


def _files() -> list[Any]:
    root = resources.files(__name__)
    return sorted((f for f in root.iterdir() if f.name.endswith(".json")), key=lambda f: f.name)


@lru_cache(maxsize=1)
def benchmarks() -> dict[str, dict[str, Any]]:
    """Benchmark id -> title, family, matching lm-eval tasks, metrics, protocol."""
    text = resources.files(__name__).joinpath(_BENCHMARKS_FILE).read_text(encoding="utf-8")
    return json.loads(text)["benchmarks"]


@lru_cache(maxsize=1)
def _numbers() -> tuple[dict[str, Any], ...]:
    rows = []
    for f in _files():
        if f.name == _BENCHMARKS_FILE:
            continue
        data = json.loads(f.read_text(encoding="utf-8"))
        for row in data["numbers"]:
            rows.append({**row, "source_file": f.name, "source": data["source"]})
    return tuple(rows)


def source_notes() -> dict[str, list[str]]:
    """Source text -> the notes of its file (protocol details that apply to all its numbers)."""
    out = {}
    for f in _files():
        if f.name != _BENCHMARKS_FILE:
            data = json.loads(f.read_text(encoding="utf-8"))
            out[data["source"]] = list(data.get("notes", []))
    return out


def numbers() -> list[dict[str, Any]]:
    """Every published number (a fresh list of dicts; each has its paper, table and source file)."""
    return [dict(r) for r in _numbers()]


def benchmark_for_task(task: str) -> str | None:
    """The benchmark id an lm-eval task name belongs to (``distmatch_sst2`` -> ``sst2``), or None."""
    for key, spec in benchmarks().items():
        if task in spec.get("lm_eval_tasks", ()):
            return key
    return None


def published_rows(benchmark: str, model_filter: str | None = None) -> list[dict[str, Any]]:
    """Published results of `benchmark` grouped per (paper, table, base model, method): one dict per row with
    ``label``, ``paper``, ``table``, ``base_model``, ``method``, ``loss``, ``train_data`` and ``values``
    (metric -> value), in the order of the source files. `model_filter`: case-insensitive substring of the base
    model (e.g. ``"llama-7b"``)."""
    rows: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for r in _numbers():
        if r["benchmark"] != benchmark:
            continue
        if model_filter and model_filter.lower() not in r["base_model"].lower():
            continue
        key = (r["paper"], r["table"], r["base_model"], r["method"])
        row = rows.setdefault(
            key,
            {
                "label": f"{r['method']} · {r['base_model']} [{_short(r['paper'])} {r['table']}]",
                "paper": r["paper"],
                "table": r["table"],
                "base_model": r["base_model"],
                "method": r["method"],
                "loss": r["loss"],
                "train_data": r["train_data"],
                "values": {},
                "approximate": False,
            },
        )
        row["values"][r["metric"]] = r["value"]
        row["approximate"] = row["approximate"] or bool(r.get("approximate"))
    return list(rows.values())


def _short(paper: str) -> str:
    if paper.startswith("GEM repository"):
        return "GEM repo"
    return paper.split(" ")[0]
