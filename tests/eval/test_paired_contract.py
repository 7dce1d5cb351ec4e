"""eval_tasks.metrics.paired against its docstrings, for what tests/eval/test_metrics_paired.py leaves open: a key
missing from either run's rows is left out (not only one missing from both), a refusal over different prompts names
the ids found in only one of the runs, and the refusals say what is wrong."""

from __future__ import annotations

import pytest

from eval_tasks.metrics.paired import mean_se, paired_differences


def test_a_key_missing_from_either_run_is_left_out() -> None:
    rows = [{"id": 1, "a": 1.0, "b": 2.0}, {"id": 2, "a": 3.0, "b": 4.0}]
    reference = [{"id": 1, "a": 0.0}, {"id": 2, "a": 1.0}]
    assert paired_differences(rows, reference, ["a", "b"]).keys() == {"a"}
    assert paired_differences(reference, rows, ["a", "b"]).keys() == {"a"}


def test_different_prompts_name_the_ids_in_only_one_run() -> None:
    rows = [{"id": i, "a": 1.0} for i in (1, 2, 3)]
    reference = [{"id": i, "a": 1.0} for i in (2, 3, 4)]
    with pytest.raises(ValueError) as err:
        paired_differences(rows, reference, ["a"])
    assert str(err.value) == (
        "paired_differences: the runs were scored on different prompts (ids only in one of them: ['1', '4'])."
    )


def test_the_refusals_say_what_is_wrong() -> None:
    with pytest.raises(ValueError) as err:
        mean_se([])
    assert str(err.value) == "mean_se: no values (need at least one)."
    with pytest.raises(ValueError) as err:
        paired_differences([{"id": 1}, {"id": 1}], [{"id": 1}], ["a"])
    assert str(err.value) == "paired_differences: prompt ids are not unique."
