"""The anchored losses (`asft`, `sft_kl`: `trl_ext/losses/objectives/anchored.py`) on all three paths, against the
float64 oracles of tests/helpers/loss_oracles.py written from the ASFT authors' `train_v2.py` (KL(p_ref || p_theta)
by `F.kl_div(log_softmax(z), softmax(z_ref))`, the reference without gradient, `sg(p_y)` as DFT's weight).

The shared sweeps of tests/losses/ cannot pass a reference model (tests/helpers/loss_cases.ANCHORED_CONFIGS says
why); this file runs the same checks for these losses: values, closed-form gradients with per-token upstream
weights, gradcheck against the surrogate, statistics, chunk sizes, 16-bit inputs, and the refusals.
"""

from __future__ import annotations

import pytest
import torch

import tests.helpers.loss_oracles as O
from tests.helpers.loss_cases import (
    ANCHORED_CONFIGS,
    ANCHORED_IDS,
    F32,
    F64,
    GMODES,
    TIGHT,
    _float32_level,
    assert_close,
    make_fused,
    make_reference,
    reduce_loss,
    upstream,
)
from trl_ext.losses import fused_token_loss, token_loss
from trl_ext.losses.reference import reference_token_loss

N, V, D, D_REF = 9, 13, 6, 4


def _problem(seed: int, dtype: torch.dtype = F64):
    hidden, weight, labels = make_fused(N, V, D, seed=seed, dtype=dtype)
    ref_hidden, ref_weight = make_reference(N, V, D_REF, seed=seed, dtype=dtype)
    return hidden, weight, labels, ref_hidden, ref_weight


def _logits_path(path: str, name: str, z, labels, ref_logits, params, **kw):
    fn = token_loss if path == "token" else reference_token_loss
    return fn(name, z, labels, reference_logits=ref_logits, **params, **kw)


@pytest.mark.parametrize("cfg", ANCHORED_CONFIGS, ids=ANCHORED_IDS)
def test_oracle_self_consistency(cfg):
    """The closed form (value, gradient) equals autograd of the authors' readable formula."""
    name, params = cfg
    hidden, weight, labels, rh, rw = _problem(3)
    logits = hidden @ weight.T
    cfg_params = {**params, "reference_logits": rh @ rw.T}
    z = logits.clone().requires_grad_(True)
    val = O.readable(name, z, labels, cfg_params)
    g = upstream("random", N, 3, F64)
    (val * g).sum().backward()
    orc = O.oracle(name, logits, labels, **cfg_params)
    torch.testing.assert_close(val.detach(), orc.value, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(z.grad, g[:, None] * orc.grad, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("gmode", GMODES)
@pytest.mark.parametrize("path", ["token", "reference"])
@pytest.mark.parametrize("cfg", ANCHORED_CONFIGS, ids=ANCHORED_IDS)
def test_logits_paths_match_oracle(cfg, path, gmode):
    name, params = cfg
    hidden, weight, labels, rh, rw = _problem(11)
    logits, ref_logits = hidden @ weight.T, rh @ rw.T
    z = logits.clone().requires_grad_(True)
    r = ref_logits.clone().requires_grad_(True)  # the reference never gets a gradient
    kw = {"chunk_size": 4, "return_stats": True} if path == "token" else {"return_stats": True}
    loss, stats = _logits_path(path, name, z, labels, r, params, **kw)
    assert loss.shape == (N,) and loss.dtype == F64
    orc = O.oracle(name, logits, labels, reference_logits=ref_logits, **params)
    assert_close(loss.detach(), orc.value, **TIGHT)
    assert_close(stats.kl, orc.e, **TIGHT)  # the KL, 0 at ignored rows
    assert_close(stats.ce, orc.ce, **TIGHT)
    g = upstream(gmode, N, 11, F64)
    reduce_loss(loss, gmode, g).backward()
    assert_close(z.grad, g[:, None] * orc.grad, **TIGHT)
    assert r.grad is None


@pytest.mark.parametrize("gmode", GMODES)
@pytest.mark.parametrize("cfg", ANCHORED_CONFIGS, ids=ANCHORED_IDS)
def test_fused_matches_oracle(cfg, gmode):
    name, params = cfg
    chunk_size = {"sum": None, "mean": 2, "const": 4, "random": 3, "sparse": 1}[gmode]
    hidden, weight, labels, rh, rw = _problem(21)
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    rh_, rw_ = rh.clone().requires_grad_(True), rw.clone().requires_grad_(True)
    loss, stats = fused_token_loss(
        name, h, w, labels, chunk_size=chunk_size, return_stats=True,
        reference_hidden=rh_, reference_weight=rw_, **params,
    )  # fmt: skip
    orc = O.oracle(name, hidden @ weight.T, labels, reference_logits=rh @ rw.T, **params)
    assert_close(loss.detach(), orc.value, **TIGHT)
    assert_close(stats.kl, orc.e, **TIGHT)
    g = upstream(gmode, N, 21, F64)
    reduce_loss(loss, gmode, g).backward()
    G = g[:, None] * orc.grad
    assert_close(h.grad, G @ weight, **TIGHT)
    assert_close(w.grad, G.T @ hidden, **TIGHT)
    assert rh_.grad is None and rw_.grad is None


@pytest.mark.parametrize("cfg", ANCHORED_CONFIGS, ids=ANCHORED_IDS)
def test_gradients_are_the_surrogates_derivative(cfg):
    """The paths' gradients equal autograd of the surrogate F(l) + kl_weight * KL(p_ref || p) (F = -exp(-l) for
    asft, whose F' is sg(p_y); F = l for sft_kl), a function written without any stop-gradient; sft_kl has no
    stop-gradient at all, so it is also gradchecked numerically as it is."""
    name, params = cfg
    n, v, d = 5, 7, 3
    hidden, weight, labels = make_fused(n, v, d, seed=61, n_ignored=1)
    rh, rw = make_reference(n, v, 2, seed=61)
    ref_logits = rh @ rw.T
    sur = O.make_surrogate(name, hidden @ weight.T, labels, reference_logits=ref_logits, **params)
    g = upstream("random", n, 61, F64)

    z = (hidden @ weight.T).clone().requires_grad_(True)
    got = torch.autograd.grad(
        (token_loss(name, z, labels, chunk_size=2, reference_logits=ref_logits, **params) * g).sum(), z
    )[0]
    want = torch.autograd.grad((sur(z) * g).sum(), z)[0]
    assert_close(got, want, **TIGHT)

    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    fused = fused_token_loss(
        name, h, w, labels, chunk_size=2, reference_hidden=rh, reference_weight=rw, **params
    )
    got_h, got_w = torch.autograd.grad((fused * g).sum(), (h, w))
    want_h, want_w = torch.autograd.grad((sur(h @ w.T) * g).sum(), (h, w))
    assert_close(got_h, want_h, **TIGHT)
    assert_close(got_w, want_w, **TIGHT)

    if name == "sft_kl":
        assert torch.autograd.gradcheck(
            lambda x: token_loss(name, x, labels, chunk_size=2, reference_logits=ref_logits, **params),
            (z,), eps=1e-6, atol=1e-6, rtol=1e-4,
        )  # fmt: skip
        assert torch.autograd.gradcheck(
            lambda a, b: fused_token_loss(
                name, a, b, labels, chunk_size=2, reference_hidden=rh, reference_weight=rw, **params
            ),
            (h, w), eps=1e-6, atol=1e-6, rtol=1e-4,
        )  # fmt: skip


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, F32])
@pytest.mark.parametrize("name", ["asft", "sft_kl"])
def test_low_precision_inputs_match_the_oracle_of_the_same_inputs(name, dtype):
    """16/32-bit policy and reference: float32 math, equal to the float64 oracle of the rounded inputs."""
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
