"""Uncertainty over prompts: the mean of per-prompt values with its standard error, and the paired difference of
two runs scored on the same prompts (same prompts, same sampling seeds: the per-prompt differences cancel what the
prompts themselves contribute, so the paired standard error is smaller than the two runs' errors combined).

The per-prompt rows are those of :func:`~eval_tasks.metrics.corpus_diversity` (``per_prompt`` of a
``distmatch.diversity`` result): one mapping per prompt with its ``id`` and a value per metric key. Standard library
only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["mean_se", "paired_differences"]


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) of `values`: sample standard deviation (n - 1) / sqrt(n); the error is
    NaN for a single value (nothing to estimate it from)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_se: no values (need at least one).")
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def paired_differences(
    rows: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]], keys: Sequence[str]
) -> dict[str, tuple[float, float]]:
    """Per metric key: (mean, standard error) over prompts of ``rows[key] - reference[key]``, paired by prompt ``id``.

    Both runs must have been scored on the same prompts (the same ids, in any order); a key missing from either
    run's rows is left out of the result.
    """
    ids = [str(r["id"]) for r in rows]
    ref_by_id = {str(r["id"]): r for r in reference}
    if len(set(ids)) != len(ids) or len(ref_by_id) != len(reference):
        raise ValueError("paired_differences: prompt ids are not unique.")
    if set(ids) != set(ref_by_id):
        only = sorted(set(ids) ^ set(ref_by_id))
        raise ValueError(
            f"paired_differences: the runs were scored on different prompts (ids only in one of them: {only[:5]})."
        )
    out = {}
    for key in keys:
        if all(key in r for r in rows) and all(key in r for r in reference):
            out[key] = mean_se([r[key] - ref_by_id[str(r["id"])][key] for r in rows])
    return out
