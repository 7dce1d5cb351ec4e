"""eval_tasks.metrics.pass_at_k's refusals name what is wrong (the project's refusal contract, docs/refusals.md:
a refusal says which value is wrong and what was given), so a user can fix the call without reading the code."""

from __future__ import annotations

import re

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.metrics import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    ("args", "name", "given"),
    [((10.0, 1, 1), "n", "10.0"), ((10, True, 1), "c", "True"), ((10, 1, "1"), "k", "'1'")],
)
def test_a_non_integer_argument_is_named(args: tuple, name: str, given: str) -> None:
    with pytest.raises(DistMatchConfigError) as err:
        pass_at_k(*args)
    # exactly the argument's own name: `n`, `c` or `k` (the estimator's letters, Chen et al. 2021)
    assert re.search(rf"\b{name} must be an integer, got {re.escape(given)}", str(err.value)), str(err.value)


def test_no_problems_is_said_in_words() -> None:
    with pytest.raises(DistMatchConfigError, match=r"^mean_pass_at_k: no problems\.$"):
        mean_pass_at_k([], 1)
