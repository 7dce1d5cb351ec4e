"""pass@k: the unbiased estimator of Chen et al. (2021) per problem, 1 - C(n-c, k) / C(n, k).

From `n` samples of a problem of which `c` pass, the probability that at least one of `k` samples drawn without
replacement passes. Computed in the product form 1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms the huge
binomial coefficients (n = 200, k = 100 has C(n, k) ~ 9e58) and is exact up to float rounding. The benchmark's
pass@k is the mean over problems (x100 on the papers' scale): :func:`mean_pass_at_k`.
"""

from __future__ import annotations

from collections.abc import Iterable

from distmatch.errors import DistMatchConfigError

__all__ = ["PASS_AT_K", "mean_pass_at_k", "pass_at_k"]

#: The k values of GEM's code tables (Tables 6 and 9: 10, 20, 50, 100) and Figure 4's pass@1.
PASS_AT_K = (1, 10, 20, 50, 100)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `n` samples, `c` of them correct (0 <= c <= n, 1 <= k <= n)."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise DistMatchConfigError(f"pass_at_k: {name} must be an integer, got {value!r}.")
    if not 0 <= c <= n:
        raise DistMatchConfigError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}.")
    if not 1 <= k <= n:
        raise DistMatchConfigError(f"pass_at_k: need 1 <= k <= n (samples per problem), got n={n}, k={k}.")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems given as (n, c) pairs, on the 0-1 scale."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise DistMatchConfigError("mean_pass_at_k: no problems.")
    return sum(values) / len(values)
