"""The newer losses' options at their bounds (`prob`, `asft` / `sft_kl`), through `trl_ext.options.loss_params`
(the check TRL's config and the Axolotl plugin share): the bounds docs/refusals.md and the option help state
(`prob_min_p` in [0, 1), `prob_max_p` in (0, 1], min_p < max_p, `prob_q` in [0, 10], `anchor_kl_weight` in
[0, 1000]), each bound on both sides."""

from __future__ import annotations

import pytest

from trl_ext.options import loss_params


def _refused(loss: str, **options) -> str:
    with pytest.raises(ValueError) as caught:
        loss_params(loss, options)
    return str(caught.value)


@pytest.mark.parametrize("bound", [1e-9, 0.25, 0.5])
def test_prob_min_p_equal_to_max_p_is_refused(bound):
    message = _refused("prob", prob_min_p=bound, prob_max_p=bound)
    assert "keeps no token" in message and f"prob_min_p={bound!r} = prob_max_p={bound!r}" in message


def test_prob_thresholds_just_apart_are_accepted_and_reversed_refused():
    params = loss_params("prob", {"prob_min_p": 0.5, "prob_max_p": 0.5000001})
    assert (params["min_p"], params["max_p"]) == (0.5, 0.5000001)
    assert "keeps no token" in _refused("prob", prob_min_p=0.6, prob_max_p=0.5)


@pytest.mark.parametrize(
    ("option", "value"), [("prob_min_p", 0.0), ("prob_max_p", 1.0), ("prob_min_p", 0.999)]
)
def test_prob_threshold_bounds_that_are_inside(option, value):
    assert loss_params("prob", {option: value})[option.removeprefix("prob_")] == value


@pytest.mark.parametrize(
    ("option", "value"), [("prob_min_p", 1.0), ("prob_max_p", 0.0), ("prob_min_p", -0.01)]
)
def test_prob_threshold_bounds_that_are_outside(option, value):
    assert option in _refused("prob", **{option: value})


@pytest.mark.parametrize("q", [0.0, 10.0])
def test_prob_q_at_its_bounds_is_accepted(q):
    assert loss_params("prob", {"prob_q": q})["q"] == q


@pytest.mark.parametrize("q", [10.000001, 1e300, -1e-9])
def test_prob_q_beyond_its_bounds_is_refused(q):
    message = _refused("prob", prob_q=q)
    assert "prob_q" in message and "<= 10" in message


@pytest.mark.parametrize("loss", ["asft", "sft_kl"])
def test_anchor_kl_weight_cap(loss):
    assert loss_params(loss, {"anchor_kl_weight": 1000.0})["kl_weight"] == 1000.0
    assert loss_params(loss, {"anchor_kl_weight": 0.0})["kl_weight"] == 0.0
    for value in (1000.001, 1e30, -0.1):
        message = _refused(loss, anchor_kl_weight=value)
        assert "anchor_kl_weight" in message and "<= 1000" in message
