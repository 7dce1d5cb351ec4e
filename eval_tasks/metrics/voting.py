"""Test-time scaling metrics of GEM Tables 4, 5, 7 and 8: first-k voting, coverage and reward best-of-n.

All per-question metrics look at the **first k** samples of each question (one draw, not an unbiased estimator),
as GEM's scripts do (``calculate_accuracy_voting``, ``calculation_best_of_n``):

* :func:`majority_vote` / MV@k - the most common answer among the first k (a missing answer, None, is a vote like
  any other; ties go to the answer seen first), correct when it equals the gold answer.
* coverage / BON@k (math tables) - the gold answer is among the first k answers (an oracle verifier).
* :func:`reward_best_of_n` - Reward BON@k: the mean over questions of the best reward among the first k samples.
* :func:`win_rate_best_of_n` - Win-rate BON@k: 100 x the mean over questions of sigmoid(r_best@k - r_reference)
  (Bradley-Terry with the reward model's score).

Pure Python (``math`` only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from distmatch.errors import DistMatchConfigError

__all__ = [
    "GEM_K_VALUES",
    "majority_vote",
    "reward_best_of_n",
    "voting_accuracies",
    "win_rate_best_of_n",
]

#: The k values of GEM's tables.
GEM_K_VALUES = (4, 8, 16, 32)


def _check_k(k: int, n: int, what: str) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise DistMatchConfigError(f"k must be an integer >= 1, got {k!r}.")
    if k > n:
        raise DistMatchConfigError(f"k={k} needs at least {k} samples per question; {what} has {n}.")


def majority_vote(answers: Sequence[Hashable], k: int | None = None) -> Hashable:
    """The most common of the first `k` answers (all when None); ties go to the answer seen first."""
    first = list(answers if k is None else answers[:k])
    if not first:
        raise DistMatchConfigError("majority_vote needs at least one answer.")
    counts: dict[Hashable, int] = {}
    for answer in first:
        counts[answer] = counts.get(answer, 0) + 1
    best = max(counts.values())
    return next(answer for answer in counts if counts[answer] == best)  # dicts keep first-seen order


def voting_accuracies(
    answers: Sequence[Sequence[Hashable]],
    golds: Sequence[Hashable],
    ks: Sequence[int] = GEM_K_VALUES,
    *,
    equal: Callable[[Any, Any], bool] | None = None,
) -> dict[str, float]:
    """MV@k and BON@k (coverage) over questions, x100: ``{"mv@4": ..., "bon@4": ..., ...}``.

    `answers[i]` are question i's extracted answers in sampling order (None = no answer), `golds[i]` its gold
    answer. `equal(answer, gold)` decides correctness (default ``==``; for MATH, the Hendrycks check).
    """
    if len(answers) != len(golds):
        raise DistMatchConfigError(f"{len(answers)} questions of answers but {len(golds)} gold answers.")
    if not answers:
        raise DistMatchConfigError("voting_accuracies needs at least one question.")
    same = equal or (lambda a, b: a == b)
    out: dict[str, float] = {}
    for k in ks:
        mv = bon = 0
        for i, (row, gold) in enumerate(zip(answers, golds, strict=True)):
            _check_k(k, len(row), f"question {i}")
            first = list(row[:k])
            mv += bool(same(majority_vote(first), gold))
            bon += any(same(a, gold) for a in first)
        out[f"mv@{k}"] = 100.0 * mv / len(answers)
        out[f"bon@{k}"] = 100.0 * bon / len(answers)
    return out


def reward_best_of_n(
    rewards: Sequence[Sequence[float]], ks: Sequence[int] = GEM_K_VALUES
) -> dict[str, float]:
    """Reward BON@k: mean over questions of max(reward of the first k samples): ``{"reward_bon@4": ...}``."""
    if not rewards:
        raise DistMatchConfigError("reward_best_of_n needs at least one question.")
    out: dict[str, float] = {}
    for k in ks:
        best = []
        for i, row in enumerate(rewards):
            _check_k(k, len(row), f"question {i}")
            best.append(max(float(r) for r in row[:k]))
        out[f"reward_bon@{k}"] = sum(best) / len(best)
    return out


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def win_rate_best_of_n(
    rewards: Sequence[Sequence[float]],
    reference_rewards: Sequence[float],
    ks: Sequence[int] = GEM_K_VALUES,
) -> dict[str, float]:
    """Win-rate BON@k = 100 x mean_i sigmoid(max(first k rewards of i) - reference reward of i)."""
    if len(rewards) != len(reference_rewards):
        raise DistMatchConfigError(
            f"{len(rewards)} questions of rewards but {len(reference_rewards)} reference rewards."
        )
    if not rewards:
        raise DistMatchConfigError("win_rate_best_of_n needs at least one question.")
    out: dict[str, float] = {}
    for k in ks:
        total = 0.0
        for i, (row, ref) in enumerate(zip(rewards, reference_rewards, strict=True)):
            _check_k(k, len(row), f"question {i}")
            total += _sigmoid(max(float(r) for r in row[:k]) - float(ref))
        out[f"win_rate_bon@{k}"] = 100.0 * total / len(rewards)
    return out
