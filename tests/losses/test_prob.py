"""`prob` (the probability family of Beyond Log Likelihood) beyond the shared oracle sweeps: the thresholds keep the
tokens exactly at them (the authors' `p >= t` / `p <= t`), q = 0 is CE exactly, small q tends to it."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.loss_cases import F64, make_fused
from trl_ext.losses import fused_token_loss, token_loss
from trl_ext.losses.reference import reference_token_loss


@pytest.mark.parametrize("path", ["token", "reference"])
def test_a_token_exactly_at_a_threshold_is_kept(path):
    """Two equal logits: p_y = 0.5 exactly. OnlyTopP-0.5 (p >= 0.5) and OnlyBottomP-0.5 (p <= 0.5) both keep it."""
    fn = token_loss if path == "token" else reference_token_loss
    z = torch.zeros(1, 2, dtype=F64)
    y = torch.tensor([1])
    for bounds in ({"min_p": 0.5}, {"max_p": 0.5}):
        assert float(fn("prob", z, y, **bounds)[0]) == 0.5, bounds  # 1 - p_y
    with pytest.raises(ValueError, match="min_p=0.5 = max_p=0.5 keeps no token"):
        fn("prob", z, y, min_p=0.5, max_p=0.5)  # only p_y == 0.5 exactly: no token in training
    assert float(fn("prob", z, y, min_p=0.5 + 1e-12)[0]) == 0.0  # just above: dropped
    assert float(fn("prob", z, y, max_p=0.5 - 1e-12)[0]) == 0.0


def test_q_zero_is_cross_entropy_exactly_and_small_q_tends_to_it():
    hidden, weight, labels = make_fused(9, 13, 6, seed=5)
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    ce = fused_token_loss("ce", h, w, labels)
    ce.sum().backward()
    ce_grads = (h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    prob = fused_token_loss("prob", h, w, labels, q=0.0)
    prob.sum().backward()
    assert torch.equal(prob, ce) and torch.equal(h.grad, ce_grads[0]) and torch.equal(w.grad, ce_grads[1])
    small = fused_token_loss("prob", hidden, weight, labels, q=1e-9)
    torch.testing.assert_close(small, ce.detach(), rtol=1e-7, atol=1e-8)
