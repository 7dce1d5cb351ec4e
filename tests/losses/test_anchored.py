"""What is particular to the anchored losses (`asft`, `sft_kl`: `trl_ext/losses/objectives/anchored.py`): the KL's
direction, that without the anchor they are DFT and CE, float32 inputs, and the refusals.

Their values, gradients, statistics, chunk sizes and 16-bit inputs are checked by the shared sweeps of tests/losses/
(their configurations are in tests/helpers/loss_cases.CONFIGS and BASIC; each case builds the reference problem,
`reference_hidden` + `reference_weight`, from its seed: `with_inputs`) against the float64 oracles of
tests/helpers/loss_oracles_more.py, written from the ASFT authors' `train_v2.py` (KL(p_ref || p_theta) by
`F.kl_div(log_softmax(z), softmax(z_ref))`, the reference without gradient, `sg(p_y)` as DFT's weight).
"""

from __future__ import annotations

import pytest
import torch

import tests.helpers.loss_oracles as O
from tests.helpers.loss_cases import (
    D_REF,
    F32,
    F64,
    _float32_level,
    assert_close,
    make_fused,
    make_reference,
)
from trl_ext.losses import fused_token_loss, token_loss
from trl_ext.losses.reference import reference_token_loss

N, V, D = 9, 13, 6


def _problem(seed: int, dtype: torch.dtype = F64):
    hidden, weight, labels = make_fused(N, V, D, seed=seed, dtype=dtype)
    ref_hidden, ref_weight = make_reference(N, V, D_REF, seed=seed, dtype=dtype)
    return hidden, weight, labels, ref_hidden, ref_weight


def test_the_kl_is_the_reference_to_model_direction():
    """KL(p_ref || p) = sum p_ref log(p_ref / p), by hand on one row (the reverse direction differs clearly)."""
    z = torch.tensor([[2.0, 0.0, -1.0]], dtype=F64)
    z_ref = torch.tensor([[-1.0, 1.0, 3.0]], dtype=F64)
    p, p_ref = torch.softmax(z, 1), torch.softmax(z_ref, 1)
    forward = float((p_ref * (p_ref / p).log()).sum())
    reverse = float((p * (p / p_ref).log()).sum())
    assert abs(forward - reverse) > 0.5
    labels = torch.tensor([0])
    _, stats = token_loss("sft_kl", z, labels, reference_logits=z_ref, return_stats=True)
    assert float(stats.kl[0]) == pytest.approx(forward, rel=1e-12)
    loss = token_loss("sft_kl", z, labels, reference_logits=z_ref, kl_weight=0.5)
    assert float(loss[0]) == pytest.approx(-float(torch.log(p[0, 0])) + 0.5 * forward, rel=1e-12)


@pytest.mark.parametrize(("name", "plain"), [("asft", "dft"), ("sft_kl", "ce")])
def test_without_the_anchor_they_are_dft_and_ce(name, plain):
    """kl_weight = 0, or a reference equal to the model (KL = 0): ASFT is DFT and SFT+KL is CE, values and gradients."""
    hidden, weight, labels, rh, rw = _problem(41)
    logits = hidden @ weight.T
    z0 = logits.clone().requires_grad_(True)
    base = token_loss(plain, z0, labels)
    base.sum().backward()
    for ref_logits, params in ((rh @ rw.T, {"kl_weight": 0.0}), (logits, {"kl_weight": 0.7})):
        z = logits.clone().requires_grad_(True)
        loss, stats = token_loss(name, z, labels, reference_logits=ref_logits, return_stats=True, **params)
        loss.sum().backward()
        assert_close(loss.detach(), base.detach(), atol=1e-14, rtol=1e-14)
        assert_close(z.grad, z0.grad, atol=1e-14, rtol=1e-14)
    assert float(stats.kl.abs().max()) < 1e-14  # the model is its own reference


@pytest.mark.parametrize("dtype", [F32])
@pytest.mark.parametrize("name", ["asft", "sft_kl"])
def test_low_precision_inputs_match_the_oracle_of_the_same_inputs(name, dtype):
    """32-bit policy and reference: float32 math, equal to the float64 oracle of the same inputs (16-bit ones: the
    shared sweeps test_chunked.test_half_precision / test_half_matches_float32_implementation)."""
    hidden, weight, labels, rh, rw = _problem(51, dtype)
    logits64 = hidden.double() @ weight.double().T
    orc = O.oracle(name, logits64, labels, reference_logits=rh.double() @ rw.double().T)
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss = fused_token_loss(name, h, w, labels, chunk_size=4, reference_hidden=rh, reference_weight=rw)
    assert loss.dtype == F32 and h.grad is None
    assert_close(loss.detach(), orc.value, **_float32_level(orc.value))
    loss.sum().backward()
    assert h.grad.dtype == dtype and w.grad.dtype == dtype
    z, ref = logits64.to(dtype), (rh.double() @ rw.double().T).to(dtype)  # 16-bit logits of both models
    tok = token_loss(name, z, labels, reference_logits=ref)
    orc = O.oracle(name, z.double(), labels, reference_logits=ref.double())
    assert_close(tok.detach(), orc.value, **_float32_level(orc.value))


def test_refusals_name_what_is_missing_or_wrong():
    hidden, weight, labels, rh, rw = _problem(71)
    logits = hidden @ weight.T
    cases = [
        (lambda: token_loss("asft", logits, labels), "needs the frozen reference model's reference_logits="),
        (
            lambda: fused_token_loss("sft_kl", hidden, weight, labels, reference_hidden=rh),
            "needs the frozen reference model's reference_hidden= + reference_weight=",
        ),
        (lambda: reference_token_loss("asft", logits, labels), "reference_logits="),
        (
            lambda: token_loss("ce", logits, labels, reference_logits=logits),
            "reference_logits= is only for the anchored losses (asft, sft_kl)",
        ),
        (
            lambda: fused_token_loss("dft", hidden, weight, labels, reference_hidden=rh, reference_weight=rw),
            "only for the anchored losses",
        ),
        (
            lambda: token_loss("asft", logits, labels, reference_logits=logits[:, :-1]),
            f"reference_logits must be [{N}, {V}] like the logits",
        ),
        (
            lambda: fused_token_loss(
                "asft", hidden, weight, labels, reference_hidden=rh, reference_weight=rw[:-1]
            ),
            f"reference_weight [{V}, d_ref]",
        ),
        (
            lambda: token_loss("asft", logits, labels, reference_logits=logits, kl_weight=-0.1),
            "kl_weight=-0.1 is invalid",
        ),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as err:
            call()
        assert message in str(err.value), str(err.value)
