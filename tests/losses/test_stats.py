"""The per-batch statistics (`TokenStats`, `return_stats=True`) on every path.

Independent oracle tests for trl_ext.losses (written from the API spec, not from the implementation), against
hand-written float64 formulas in tests/helpers/loss_oracles.py; shared cases and builders: tests/helpers/loss_cases.py.
"""

from __future__ import annotations

import pytest
import torch

import tests.helpers.loss_oracles as O  # noqa: E402
from tests.helpers.loss_cases import (  # noqa: E402
    CFG_IDS,
    CONFIGS,
    F32,
    F64,
    HALF_DTYPES,
    REFERENCE_LOSSES,
    TIGHT,
    _float32_level,
    _tol,
    logits_params,
    make_cost_embedding,
    make_fused,
    make_logits,
    upstream,
    with_inputs,
)
from trl_ext.losses import (  # noqa: E402
    IGNORE_INDEX,
    TokenStats,
    fused_token_loss,
    token_loss,
)

# ---------------------------------------------------------------------------------------------
# Stats
# ---------------------------------------------------------------------------------------------


def _check_stats(stats, orc, name, ign):
    assert isinstance(stats, TokenStats)
    for field in ("ce", "entropy", "top1_correct"):
        t = getattr(stats, field)
        assert isinstance(t, torch.Tensor) and t.shape == orc.value.shape, field
        assert t.is_floating_point(), field
        assert not t.requires_grad and t.grad_fn is None, field
        tol = TIGHT if t.dtype == F64 else {"atol": 1e-5, "rtol": 1e-5}
        torch.testing.assert_close(t.double(), getattr(orc, field), **tol, msg=field)
        assert torch.count_nonzero(t[ign]) == 0, field
    assert 0 < orc.top1_correct.sum() < (~ign).sum()  # test data sees both outcomes
    # the loss's own statistic: EMO's DEMD; the anchored losses' KL to the reference model, KL(p_ref || p)
    own = {"demd": ("emo",) if name == "emo" else (), "kl": REFERENCE_LOSSES}
    for field, losses in own.items():
        t = getattr(stats, field)
        if name not in losses:
            assert t is None, field
            continue
        assert isinstance(t, torch.Tensor) and t.is_floating_point(), field
        assert not t.requires_grad and t.grad_fn is None, field
        tol = _tol(name) if t.dtype == F64 else {"atol": 1e-5, "rtol": 1e-5}
        torch.testing.assert_close(t.double(), orc.demd if field == "demd" else orc.e, **tol, msg=field)
        assert torch.count_nonzero(t[ign]) == 0, field


@pytest.mark.parametrize("chunk_size", [None, 3])
@pytest.mark.parametrize("path", ["token", "fused"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_return_stats(cfg, path, chunk_size):
    name, params = cfg
    N, V, d = 10, 13, 6
    hidden, weight, labels = make_fused(N, V, d, seed=201, n_ignored=3)
    params = with_inputs(name, params, make_cost_embedding(V, 5, seed=201), rows=N, seed=201)
    ign = labels == IGNORE_INDEX
    logits = hidden @ weight.T
    if path == "fused":
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        out = fused_token_loss(name, h, w, labels, chunk_size=chunk_size, return_stats=True, **params)
        plain = fused_token_loss(name, hidden, weight, labels, chunk_size=chunk_size, **params)
    else:
        z = logits.clone().requires_grad_(True)
        kw = logits_params(params)
        out = token_loss(name, z, labels, chunk_size=chunk_size, return_stats=True, **kw)
        plain = token_loss(name, logits, labels, chunk_size=chunk_size, **kw)
    assert isinstance(out, tuple) and len(out) == 2
    loss, stats = out
    assert isinstance(plain, torch.Tensor)
    torch.testing.assert_close(loss.detach(), plain, **TIGHT)
    orc = O.oracle(name, logits, labels, **params)
    _check_stats(stats, orc, name, ign)
    assert loss.requires_grad
    g = upstream("random", N, 201, F64)
    (loss * g).sum().backward()  # gradients still flow with stats requested
    if path == "fused":
        torch.testing.assert_close(h.grad, (g[:, None] * orc.grad) @ weight, **_tol(name))
    else:
        torch.testing.assert_close(z.grad, g[:, None] * orc.grad, **_tol(name))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("cfg", [("ce", {}), ("emo", {"weighting": "emo2"})], ids=["ce", "emo2"])
def test_return_stats_half(cfg, dtype):
    name, params = cfg
    logits, labels = make_logits(9, 13, seed=211, dtype=F32, n_ignored=2)
    logits = logits.to(dtype)
    emb = make_cost_embedding(13, 5, seed=211, big=False, dtype=dtype)
    loss, stats = token_loss(
        name, logits, labels, return_stats=True, **with_inputs(name, params, emb, rows=9, seed=211)
    )
    orc = O.oracle(name, logits.double(), labels, **with_inputs(name, params, emb.double(), rows=9, seed=211))
    ign = labels == IGNORE_INDEX
    for field in ("ce", "entropy") + (("demd",) if name == "emo" else ()):
        t = getattr(stats, field)
        assert torch.isfinite(t).all()
        # float32 math on the same 16-bit inputs: float32-level agreement
        torch.testing.assert_close(t.double(), getattr(orc, field), **_float32_level(getattr(orc, field)))
        assert torch.count_nonzero(t[ign]) == 0
    torch.testing.assert_close(stats.top1_correct.double(), orc.top1_correct)


def test_return_stats_all_ignored():
    logits, _ = make_logits(5, 7, seed=221)
    labels = torch.full((5,), IGNORE_INDEX)
    emb = make_cost_embedding(7, 3, seed=221)
    loss, stats = token_loss("emo", logits, labels, cost_embedding=emb, return_stats=True)
    for field in ("ce", "entropy", "top1_correct", "demd"):
        t = getattr(stats, field)
        assert torch.equal(t, torch.zeros_like(t)), field
    assert torch.equal(loss, torch.zeros_like(loss))
