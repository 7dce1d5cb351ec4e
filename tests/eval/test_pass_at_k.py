"""eval_tasks.metrics.pass_at_k: the unbiased estimator 1 - C(n-c, k) / C(n, k) against exact fractions."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.metrics import PASS_AT_K, mean_pass_at_k, pass_at_k


def exact(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(comb(n - c, k), comb(n, k))


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(n, c, k) for n in (1, 2, 5, 10) for c in range(n + 1) for k in range(1, n + 1)]
    + [(200, c, k) for c in (0, 1, 2, 7, 50, 100, 101, 199, 200) for k in PASS_AT_K],
)
def test_equals_the_exact_binomial_ratio(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(float(exact(n, c, k)), rel=1e-12, abs=1e-15)


def test_hand_computed_values() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(200, 0, 100) == 0.0
    assert pass_at_k(200, 101, 100) == 1.0  # fewer than k failures: every draw holds a success
    # One success in 200, k = 100: exactly one half.
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)


def test_mean_over_problems() -> None:
    assert mean_pass_at_k([(4, 1), (4, 0), (4, 4)], 2) == pytest.approx((0.5 + 0 + 1) / 3)


@pytest.mark.parametrize(
    ("n", "c", "k", "match"),
    [(5, 6, 1, "0 <= c <= n"), (5, -1, 1, "0 <= c <= n"), (5, 1, 6, "1 <= k <= n"), (5, 1, 0, "1 <= k <= n")],
)
def test_bad_counts_are_refused(n: int, c: int, k: int, match: str) -> None:
    with pytest.raises(DistMatchConfigError, match=match):
        pass_at_k(n, c, k)
    with pytest.raises(DistMatchConfigError, match="must be an integer"):
        pass_at_k(5.0, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(DistMatchConfigError, match="no problems"):
        mean_pass_at_k([], 1)
