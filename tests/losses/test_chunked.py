"""The chunked and fused paths (`trl_ext/losses/chunked.py`): path equality and chunk invariance, ignored rows,
half precision.

Independent oracle tests for trl_ext.losses (written from the API spec, not from the implementation), against
hand-written float64 formulas in tests/helpers/loss_oracles.py; shared cases and builders: tests/helpers/loss_cases.py.
"""

from __future__ import annotations

import pytest
import torch

import tests.helpers.loss_oracles as O  # noqa: E402
from tests.helpers.loss_cases import (  # noqa: E402
    BASIC,
    BASIC_IDS,
    CFG_IDS,
    CONFIGS,
    F32,
    F64,
    HALF_DTYPES,
    _float32_level,
    as_float64,
    call_logits_path,
    logits_params,
    make_cost_embedding,
    make_fused,
    upstream,
    with_inputs,
)
from trl_ext.losses import (  # noqa: E402
    IGNORE_INDEX,
    fused_token_loss,
    token_loss,
)

# ---------------------------------------------------------------------------------------------
# Path equality and chunk invariance
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_three_paths_agree_float32(cfg):
    name, params = cfg
    hidden, weight, labels = make_fused(11, 17, 8, seed=91, dtype=F32, n_ignored=3)
    params = with_inputs(name, params, make_cost_embedding(17, 6, seed=91, dtype=F32), rows=11, seed=91)
    g = upstream("random", 11, 91, F32)
    logits = hidden @ weight.T
    res = {}
    for path in ("token", "reference"):
        z = logits.clone().requires_grad_(True)
        loss = call_logits_path(path, name, z, labels, params)
        assert loss.dtype == F32
        (loss * g).sum().backward()
        res[path] = (loss.detach(), z.grad @ weight, z.grad.T @ hidden)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    loss = fused_token_loss(name, h, w, labels, **params)
    assert loss.dtype == F32
    (loss * g).sum().backward()
    res["fused"] = (loss.detach(), h.grad, w.grad)
    for path in ("reference", "fused"):
        for a, b in zip(res[path], res["token"]):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


CHUNKS = [1, 2, 3, 7, None, 1000]


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_chunk_invariance(cfg, dtype):
    name, params = cfg
    N, V, d = 10, 15, 6
    hidden, weight, labels = make_fused(N, V, d, seed=101, dtype=dtype, n_ignored=3)
    params = with_inputs(name, params, make_cost_embedding(V, 5, seed=101, dtype=dtype), rows=N, seed=101)
    logits = (hidden @ weight.T).detach()
    g = upstream("random", N, 101, dtype)
    tol = {"atol": 1e-12, "rtol": 1e-12} if dtype == F64 else {"atol": 2e-6, "rtol": 2e-6}
    base_tok = base_fused = None
    for cs in CHUNKS:
        z = logits.clone().requires_grad_(True)
        loss = token_loss(name, z, labels, chunk_size=cs, **logits_params(params))
        (loss * g).sum().backward()
        tok = (loss.detach(), z.grad)
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        lf = fused_token_loss(name, h, w, labels, chunk_size=cs, **params)
        (lf * g).sum().backward()
        fus = (lf.detach(), h.grad, w.grad)
        if base_tok is None:
            base_tok, base_fused = tok, fus
            continue
        for a, b in zip(tok, base_tok):
            torch.testing.assert_close(a, b, **tol)
        for a, b in zip(fus, base_fused):
            torch.testing.assert_close(a, b, **tol)


# ---------------------------------------------------------------------------------------------
# Ignored rows
# ---------------------------------------------------------------------------------------------

DTYPES_ALL = [F64, F32, torch.float16, torch.bfloat16]


def _out_dtype(dtype):
    return F64 if dtype == F64 else F32


@pytest.mark.parametrize("dtype", DTYPES_ALL, ids=str)
@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_ignored_rows_exact_zero(cfg, path, dtype):
    name, params = cfg
    N, V, d = 9, 13, 6
    hidden, weight, labels = make_fused(N, V, d, seed=111, dtype=dtype, n_ignored=4)
    emb_dtype = dtype if dtype in HALF_DTYPES else F32 if dtype == F32 else F64
    emb = make_cost_embedding(V, 5, seed=111, big=False, dtype=emb_dtype)
    params = with_inputs(name, params, emb, rows=N, seed=111)
    ign = labels == IGNORE_INDEX
    assert ign.sum() == 4
    g = upstream("random", N, 111, F32 if dtype != F64 else F64)
    if path == "fused":
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = fused_token_loss(name, h, w, labels, **params)
        (loss * g).sum().backward()
        grad_rows = h.grad
        assert torch.isfinite(w.grad).all()
    else:
        z = (hidden @ weight.T).detach().requires_grad_(True)
        loss = call_logits_path(path, name, z, labels, params)
        (loss * g).sum().backward()
        grad_rows = z.grad
    assert loss.dtype == _out_dtype(dtype)
    assert torch.isfinite(loss).all()
    assert torch.isfinite(grad_rows).all()
    assert torch.equal(loss.detach()[ign], torch.zeros(int(ign.sum()), dtype=loss.dtype))
    assert torch.count_nonzero(grad_rows[ign]) == 0
    assert (loss.detach()[~ign] != 0).any()
    assert torch.count_nonzero(grad_rows[~ign]) > 0


@pytest.mark.parametrize("dtype", [F32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_all_ignored_batch(cfg, path, dtype):
    name, params = cfg
    N, V, d = 6, 9, 4
    hidden, weight, _ = make_fused(N, V, d, seed=121, dtype=dtype)
    labels = torch.full((N,), IGNORE_INDEX, dtype=torch.long)
    params = with_inputs(
        name, params, make_cost_embedding(V, 4, seed=121, big=False, dtype=dtype), rows=N, seed=121
    )
    if path == "fused":
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = fused_token_loss(name, h, w, labels, **params)
        grads = lambda: (h.grad, w.grad)  # noqa: E731
    else:
        z = (hidden @ weight.T).detach().requires_grad_(True)
        loss = call_logits_path(path, name, z, labels, params)
        grads = lambda: (z.grad,)  # noqa: E731
    assert loss.shape == (N,) and loss.dtype == F32
    assert torch.equal(loss.detach(), torch.zeros(N, dtype=F32))
    assert loss.requires_grad, "graph must stay connected for an all-ignored batch"
    loss.sum().backward()
    for gr in grads():
        assert gr is not None, "grad must be a zero tensor, not None"
        assert gr.dtype == dtype
        assert torch.count_nonzero(gr) == 0
        assert torch.isfinite(gr).all()


@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_all_ignored_mean_reduction_no_nan(cfg):
    """Caller-side masked mean with clamp: no NaN anywhere for an all-ignored fp16 batch."""
    name, params = cfg
    hidden, weight, _ = make_fused(5, 9, 4, seed=122, dtype=torch.float16)
    labels = torch.full((5,), IGNORE_INDEX)
    emb = make_cost_embedding(9, 4, seed=122, big=False, dtype=torch.float16)
    params = with_inputs(name, params, emb, rows=5, seed=122)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    loss = fused_token_loss(name, h, w, labels, **params)
    total = loss.sum() / max(int((labels != IGNORE_INDEX).sum()), 1)
    total.backward()
    assert total.item() == 0.0
    assert torch.count_nonzero(h.grad) == 0 and torch.count_nonzero(w.grad) == 0


# ---------------------------------------------------------------------------------------------
# Half precision
# ---------------------------------------------------------------------------------------------


def _half_tol(dtype, ref):
    frac = 1.5e-2 if dtype == torch.float16 else 4e-2
    return {"atol": frac * (1.0 + float(ref.abs().max())), "rtol": frac}


@pytest.mark.parametrize("scale", [1.0, 50.0])
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_half_precision(cfg, path, dtype, scale):
    name, params = cfg
    N, V, d = 9, 13, 6
    hidden, weight, labels = make_fused(N, V, d, seed=131, dtype=F32, n_ignored=2)
    hidden = (hidden * scale).to(dtype)
    weight = weight.to(dtype)
    emb = make_cost_embedding(V, 5, seed=131, big=False, dtype=dtype)
    params = with_inputs(name, params, emb, rows=N, seed=131)
    params64 = as_float64(params)
    g = upstream("random", N, 131, F32)
    ign = labels == IGNORE_INDEX
    if path == "fused":
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = fused_token_loss(name, h, w, labels, **params)
        (loss * g).sum().backward()
        assert h.grad.dtype == dtype and w.grad.dtype == dtype
        assert torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()
        orc = O.oracle(name, hidden.double() @ weight.double().T, labels, **params64)
        G = g.double()[:, None] * orc.grad
        exp_h, exp_w = G @ weight.double(), G.T @ hidden.double()
        torch.testing.assert_close(h.grad.double(), exp_h, **_half_tol(dtype, exp_h))
        torch.testing.assert_close(w.grad.double(), exp_w, **_half_tol(dtype, exp_w))
        assert torch.count_nonzero(h.grad[ign]) == 0
    else:
        logits = (hidden.float() @ weight.float().T).to(dtype)
        z = logits.clone().requires_grad_(True)
        loss = call_logits_path(path, name, z, labels, params)
        (loss * g).sum().backward()
        assert z.grad.dtype == dtype
        assert torch.isfinite(z.grad).all()
        orc = O.oracle(name, logits.double(), labels, **as_float64(logits_params(params)))
        exp_z = g.double()[:, None] * orc.grad
        torch.testing.assert_close(z.grad.double(), exp_z, **_half_tol(dtype, exp_z))
        assert torch.count_nonzero(z.grad[ign]) == 0
    assert loss.dtype == F32
    assert torch.isfinite(loss).all()
    assert torch.equal(loss.detach()[ign], torch.zeros(int(ign.sum())))
    torch.testing.assert_close(loss.detach().double(), orc.value, **_half_tol(dtype, orc.value))


def _rounded_to(dtype, ref):
    """A 16-bit result equal to the exact one up to its own output rounding (one ulp of `dtype`, a little more)."""
    eps = torch.finfo(dtype).eps
    return {"atol": 2 * eps * float(ref.abs().max()) + 1e-6, "rtol": 2 * eps}


@pytest.mark.parametrize("scale", [1.0, 50.0])
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_half_matches_float32_implementation(cfg, path, dtype, scale):
    """fp16/bf16 inputs are computed in float32: the values equal the float64 oracle of the *same* (exactly upcast)
    16-bit inputs at float32-level tolerance, and the 16-bit gradients equal it up to their own output rounding.
    Rounding any intermediate (e.g. the fused path's logits) to the 16-bit dtype fails this."""
    name, params = cfg
    N, V, d = 9, 13, 6
    hidden, weight, labels = make_fused(N, V, d, seed=141, dtype=F32, n_ignored=2)
    hidden = (hidden * scale).to(dtype)
    weight = weight.to(dtype)
    emb = make_cost_embedding(V, 5, seed=141, big=False, dtype=dtype)
    params = with_inputs(name, params, emb, rows=N, seed=141)
    params64 = as_float64(params)
    g = upstream("random", N, 141, F32)
    if path == "fused":
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = fused_token_loss(name, h, w, labels, chunk_size=4, **params)  # test_half_precision: unchunked
        (loss * g).sum().backward()
        orc = O.oracle(name, hidden.double() @ weight.double().T, labels, **params64)
        G = g.double()[:, None] * orc.grad
        exp_h, exp_w = G @ weight.double(), G.T @ hidden.double()
        torch.testing.assert_close(h.grad.double(), exp_h, **_rounded_to(dtype, exp_h))
        torch.testing.assert_close(w.grad.double(), exp_w, **_rounded_to(dtype, exp_w))
    else:
        # The logits themselves are 16-bit here (what the model hands over); the float32 math starts from them.
        z = (hidden.double() @ weight.double().T).to(dtype).requires_grad_(True)
        loss = call_logits_path(path, name, z, labels, params)
        (loss * g).sum().backward()
        orc = O.oracle(name, z.detach().double(), labels, **as_float64(logits_params(params)))
        exp_z = g.double()[:, None] * orc.grad
        torch.testing.assert_close(z.grad.double(), exp_z, **_rounded_to(dtype, exp_z))
    assert loss.dtype == F32
    tol = _float32_level(orc.value)
    if name == "eaft" and scale > 1:
        # EAFT's top-k entropy of a peaked row is a small difference of logits near 50 (log q = z - lse): float32
        # cancellation, amplified by the fractional power, moves the value by up to ~1e-2 relative in float32 itself.
        tol = {"atol": tol["atol"], "rtol": 2e-2}
    torch.testing.assert_close(loss.detach().double(), orc.value, **tol)
