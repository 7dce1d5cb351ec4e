"""trl_ext.losses' `prob` (Beyond Log Likelihood, Li et al., 2025) against its documented contract, for what the
oracle tests leave open: the thresholds keep a token whose p_y equals a bound (min_p <= p_y <= max_p, the authors'
OnlyTopP / OnlyBottomP), the ranges of min_p, max_p and q, and what each refusal says."""

from __future__ import annotations

import pytest
import torch

from trl_ext.losses import reference_token_loss, resolve, token_loss

# Equal logits over 2 and 4 tokens: p_y = 1/2 and 1/4 exactly; loss at q = 1: 1 - p_y.
Z = torch.zeros(2, 4)
Z[0, 2:] = -torch.inf
Y = torch.zeros(2, dtype=torch.long)


@pytest.mark.parametrize("loss_fn", [token_loss, reference_token_loss])
def test_a_token_on_a_bound_is_kept(loss_fn) -> None:
    z = Z.clone().requires_grad_()
    assert loss_fn("prob", z, Y, min_p=0.5).tolist() == [0.5, 0.0]
    assert loss_fn("prob", z, Y, max_p=0.25).tolist() == [0.0, 0.75]
    assert loss_fn("prob", z, Y, min_p=0.25, max_p=0.5).tolist() == [0.5, 0.75]


def _refusal(**params: float) -> str:
    with pytest.raises(ValueError) as err:
        resolve("prob", params)
    return str(err.value)


def test_the_ranges_and_their_refusals() -> None:
    assert _refusal(min_p=1.0) == (
        "Loss 'prob': min_p=1.0 is invalid; expected a number in [0, 1) (tokens with p_y >= prob_min_p are kept; "
        "0 keeps all)."
    )
    for max_p in (0.0, 1.5):
        assert _refusal(max_p=max_p) == (
            f"Loss 'prob': max_p={max_p!r} is invalid; expected a number in (0, 1] (tokens with p_y <= prob_max_p "
            "are kept; 1 keeps all)."
        )
    assert _refusal(q=10.5) == (
        "Loss 'prob': q=10.5 is invalid; expected a number >= 0 and <= 10 (the gradient is p_y ** q times the "
        "cross-entropy's: a larger q trains almost no token)."
    )


def test_bounds_that_keep_no_token_are_refused() -> None:
    tail = "keeps no token (the kept tokens have p_y between the lower and the upper bound); lower the first or raise the second."
    assert _refusal(min_p=0.5, max_p=0.25) == f"Loss 'prob': min_p=0.5 > max_p=0.25 {tail}"
    assert _refusal(min_p=0.5, max_p=0.5) == f"Loss 'prob': min_p=0.5 = max_p=0.5 {tail}"
