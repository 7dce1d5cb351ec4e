"""Input checks shared by the diversity metrics (one prompt's K samples)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["DiversityInputError", "check_samples", "no_text"]

#: The extra that installs the metrics' optional dependencies.
EVAL_EXTRA = "eval"


class DiversityInputError(ValueError):
    """Bad input to a diversity metric: fewer than 2 samples, an empty sample, a wrong type."""


def check_samples(samples: Any, *, allow_empty: bool, what: str = "samples") -> list[str]:
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Iterable):
        raise DiversityInputError(
            f"{what} must be a list of the K sample strings of one prompt, got {type(samples).__name__}."
        )
    samples = list(samples)
    bad = [i for i, s in enumerate(samples) if not isinstance(s, str)]
    if bad:
        raise DiversityInputError(
            f"{what} must all be strings; item {bad[0]} is {type(samples[bad[0]]).__name__}."
        )
    if len(samples) < 2:
        raise DiversityInputError(
            f"{what}: diversity needs at least 2 samples of the same prompt, got {len(samples)}."
        )
    if not allow_empty:
        empty = [i for i, s in enumerate(samples) if not s.strip()]
        if empty:
            raise DiversityInputError(
                f"{what}: sample(s) {empty} are empty or whitespace only. An empty response usually means the "
                "model stopped at once (EOS) or the generations were not decoded; pass allow_empty=True "
                "(CLI: --allow-empty) to score them anyway (a prompt whose samples are all empty then scores 0)."
            )
    return samples


def no_text(samples: Iterable[str]) -> bool:
    """Whether every sample is empty or whitespace only: no diversity to measure, the prompt scores 0 on every
    metric (with allow_empty; docs/evaluation.md)."""
    return all(not s.strip() for s in samples)
