"""eval_tasks.metrics.paired: mean ± standard error over prompts and paired differences, against hand-computed
values."""

from __future__ import annotations

import math

import pytest

from eval_tasks import metrics as M


def test_mean_se_hand_computed() -> None:
    # values 1, 2, 6: mean 3, sample variance ((-2)^2 + (-1)^2 + 3^2) / 2 = 7, s.e. sqrt(7 / 3)
    mean, se = M.mean_se([1.0, 2.0, 6.0])
    assert mean == pytest.approx(3.0) and se == pytest.approx(math.sqrt(7 / 3))
    assert M.mean_se([4.0, 4.0]) == (4.0, 0.0)


def test_mean_se_of_one_value_has_no_error_and_none_is_refused() -> None:
    mean, se = M.mean_se([2.5])
    assert mean == 2.5 and math.isnan(se)
    with pytest.raises(ValueError, match="no values"):
        M.mean_se([])


def test_paired_differences_pair_by_prompt_id() -> None:
    reference = [
        {"id": 0, "a": 10.0, "b": 1.0},
        {"id": 1, "a": 20.0, "b": 2.0},
        {"id": 2, "a": 30.0, "b": 3.0},
    ]
    # the same prompts in another order; differences a: +1, +2, +6 (ids 0, 1, 2); b: 0, 0, 0
    rows = [{"id": 2, "a": 36.0, "b": 3.0}, {"id": 0, "a": 11.0, "b": 1.0}, {"id": 1, "a": 22.0, "b": 2.0}]
    out = M.paired_differences(rows, reference, ["a", "b", "missing"])
    assert set(out) == {"a", "b"}
    assert out["a"][0] == pytest.approx(3.0) and out["a"][1] == pytest.approx(math.sqrt(7 / 3))
    assert out["b"] == (0.0, 0.0)
    # paired: much smaller than the unpaired error of either run (the prompts' own spread cancels)
    assert out["a"][1] < M.mean_se([r["a"] for r in reference])[1]


def test_paired_differences_refuse_different_prompts() -> None:
    with pytest.raises(ValueError, match="different prompts"):
        M.paired_differences([{"id": 0, "a": 1.0}], [{"id": 1, "a": 1.0}], ["a"])
    with pytest.raises(ValueError, match="not unique"):
        M.paired_differences([{"id": 0, "a": 1.0}, {"id": 0, "a": 2.0}], [{"id": 0, "a": 1.0}], ["a"])
