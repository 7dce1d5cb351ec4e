"""Every loss in LOSS_NAMES (`trl_ext/losses/objectives/`) on all three paths (token_loss, fused_token_loss with
logits = hidden @ weight.T, reference_token_loss): per-token values, closed-form gradients (with per-token upstream
weights), gradcheck against surrogates whose true derivative is the spec'd gradient, closed-form facts.

Independent oracle tests for trl_ext.losses (written from the API spec, not from the implementation), against
hand-written float64 formulas in tests/helpers/loss_oracles.py; shared cases and builders: tests/helpers/loss_cases.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tests.helpers.loss_oracles as O  # noqa: E402
from tests.helpers.env import REPO_ROOT  # noqa: E402
from tests.helpers.loss_cases import (  # noqa: E402
    BASIC,
    BASIC_IDS,
    CFG_IDS,
    CONFIGS,
    EMO_TIGHT,
    F32,
    F64,
    GMODES,
    REFERENCE_LOSSES,
    TIGHT,
    _tol,
    assert_close,
    call_logits_path,
    logits_params,
    make_cost_embedding,
    make_fused,
    make_logits,
    reduce_loss,
    reference_untouched,
    upstream,
    with_inputs,
)
from trl_ext.losses import (  # noqa: E402
    IGNORE_INDEX,
    LOSS_NAMES,
    TokenStats,
    fused_token_loss,
    token_loss,
)
from trl_ext.losses.objectives import SPECS  # noqa: E402


def test_readme_states_the_tested_tolerances():
    """The agreement claim of docs/losses.md quotes the tolerances these tests use."""
    readme = " ".join((REPO_ROOT / "docs" / "losses.md").read_text(encoding="utf-8").split())
    assert (TIGHT["atol"], EMO_TIGHT["atol"]) == (1e-10, 2e-9)
    assert "values and gradients to 1e-10, EMO to 2e-9" in readme


# ---------------------------------------------------------------------------------------------
# API surface
# ---------------------------------------------------------------------------------------------


def test_api_constants():
    # The registry's order (objectives/__init__.py's SPECS) of the losses released so far; a new loss goes after them.
    assert tuple(LOSS_NAMES)[:9] == (
        "ce",
        "emo",
        "gem_linear",
        "gem_ls",
        "ce_entropy",
        "tailr",
        "mixce",
        "dft",
        "eaft",
    )
    assert isinstance(LOSS_NAMES, tuple)
    assert IGNORE_INDEX == -100
    assert dataclasses.is_dataclass(TokenStats)
    fields = {f.name for f in dataclasses.fields(TokenStats)}
    assert {"ce", "entropy", "top1_correct", "demd"} <= fields


def test_configs_cover_every_loss():
    assert {n for n, _ in CONFIGS} == set(LOSS_NAMES)
    assert {n for n, _ in BASIC} == set(LOSS_NAMES)
    # the cases of exactly the losses that take a reference model carry a reference problem (with_inputs)
    assert set(REFERENCE_LOSSES) == {spec.name for spec in SPECS if spec.needs_reference}


# ---------------------------------------------------------------------------------------------
# Oracle self-checks (the oracle's closed forms vs autograd of readable sg-formulas)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_oracle_self_consistency(cfg):
    name, params = cfg
    logits, labels = make_logits(seed=3)
    params = with_inputs(name, params, make_cost_embedding(13, 5, seed=3), rows=9, seed=3)
    z = logits.clone().requires_grad_(True)
    val = O.readable(name, z, labels, params)  # the readable sg-formula, differentiated by autograd
    g = upstream("random", 9, 3, F64)
    (val * g).sum().backward()
    orc = O.oracle(name, logits, labels, **params)
    torch.testing.assert_close(val.detach(), orc.value, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(z.grad, g[:, None] * orc.grad, atol=1e-12, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Values and closed-form gradients, float64, all paths
# ---------------------------------------------------------------------------------------------


# The chunk size of the chunked paths per upstream mode: every mode with another chunking, unchunked included.
CHUNK_OF_GMODE = {"sum": None, "mean": 2, "const": 4, "random": 3, "sparse": 1}


def _check_stats_of_loss(stats, orc, name):
    """The per-token CE, and the loss's own statistic (EMO's DEMD, the anchored losses' KL), against the oracle."""
    assert_close(stats.ce, orc.ce, **TIGHT)
    if name == "emo":
        assert_close(stats.demd, orc.demd, **EMO_TIGHT)
    if name in REFERENCE_LOSSES:
        assert_close(stats.kl, orc.e, **TIGHT)  # the KL, 0 at ignored rows
    else:
        assert stats.kl is None


@pytest.mark.parametrize("gmode", GMODES)
@pytest.mark.parametrize("path", ["token", "reference"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_logits_paths_match_oracle(cfg, path, gmode):
    name, params = cfg
    N, V = 9, 13
    logits, labels = make_logits(N, V, seed=11)
    params = with_inputs(
        name, params, make_cost_embedding(V, 5, seed=11), rows=N, seed=11, requires_grad=True
    )
    z = logits.clone().requires_grad_(True)
    chunk_size = CHUNK_OF_GMODE[gmode] if path == "token" else None
    loss, stats = call_logits_path(path, name, z, labels, params, chunk_size=chunk_size, return_stats=True)
    assert loss.shape == (N,)
    assert loss.dtype == F64
    orc = O.oracle(name, logits, labels, **logits_params(params))
    assert_close(loss.detach(), orc.value, **_tol(name))
    _check_stats_of_loss(stats, orc, name)
    g = upstream(gmode, N, 11, F64)
    reduce_loss(loss, gmode, g).backward()
    assert z.grad is not None and z.grad.dtype == F64
    assert_close(z.grad, g[:, None] * orc.grad, **_tol(name))
    assert reference_untouched(params)  # the reference model is frozen


@pytest.mark.parametrize("gmode", GMODES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_fused_matches_oracle(cfg, gmode):
    name, params = cfg
    chunk_size = CHUNK_OF_GMODE[gmode]
    N, V, d = 9, 13, 6
    hidden, weight, labels = make_fused(N, V, d, seed=21)
    params = with_inputs(
        name, params, make_cost_embedding(V, 5, seed=21), rows=N, seed=21, requires_grad=True
    )
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    loss, stats = fused_token_loss(name, h, w, labels, chunk_size=chunk_size, return_stats=True, **params)
    assert loss.shape == (N,) and loss.dtype == F64
    logits = hidden @ weight.T
    orc = O.oracle(name, logits, labels, **params)
    assert_close(loss.detach(), orc.value, **_tol(name))
    _check_stats_of_loss(stats, orc, name)
    g = upstream(gmode, N, 21, F64)
    reduce_loss(loss, gmode, g).backward()
    G = g[:, None] * orc.grad
    assert h.grad is not None and w.grad is not None
    assert_close(h.grad, G @ weight, **_tol(name))
    assert_close(w.grad, G.T @ hidden, **_tol(name))
    assert reference_untouched(params)


@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_no_cross_row_gradient(cfg, path):
    """Jacobian is block diagonal: upstream weight on one row only moves that row's logits."""
    name, params = cfg
    N, V, d = 7, 11, 5
    hidden, weight, labels = make_fused(N, V, d, seed=31, n_ignored=1)
    params = with_inputs(name, params, make_cost_embedding(V, 4, seed=31), rows=N, seed=31)
    logits = hidden @ weight.T
    orc = O.oracle(name, logits, labels, **params)
    valid_rows = [i for i in range(N) if labels[i] != IGNORE_INDEX]
    for row in valid_rows[:3]:
        g = torch.zeros(N, dtype=F64)
        g[row] = 1.7
        if path == "fused":
            h = hidden.clone().requires_grad_(True)
            w = weight.clone().requires_grad_(True)
            (fused_token_loss(name, h, w, labels, **params) * g).sum().backward()
            G = g[:, None] * orc.grad
            assert_close(h.grad, G @ weight, **_tol(name))
            assert_close(w.grad, G.T @ hidden, **_tol(name))
            assert torch.count_nonzero(h.grad[torch.arange(N) != row]) == 0
        else:
            z = logits.clone().requires_grad_(True)
            (call_logits_path(path, name, z, labels, params) * g).sum().backward()
            assert_close(z.grad, g[:, None] * orc.grad, **_tol(name))
            assert torch.count_nonzero(z.grad[torch.arange(N) != row]) == 0


@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_natural_norm_embedding(weighting, path):
    """Typical unit-scale cost embedding (eps effects allowed at 1e-6)."""
    N, V, d = 9, 13, 6
    hidden, weight, labels = make_fused(N, V, d, seed=41)
    emb = make_cost_embedding(V, 7, seed=41, big=False)
    params = {"weighting": weighting, "cost_embedding": emb}
    logits = hidden @ weight.T
    orc = O.oracle("emo", logits, labels, **params)
    g = upstream("random", N, 41, F64)
    if path == "fused":
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = fused_token_loss("emo", h, w, labels, **params)
        (loss * g).sum().backward()
        G = g[:, None] * orc.grad
        assert_close(h.grad, G @ weight, atol=1e-6, rtol=1e-6)
        assert_close(w.grad, G.T @ hidden, atol=1e-6, rtol=1e-6)
    else:
        z = logits.clone().requires_grad_(True)
        loss = call_logits_path(path, "emo", z, labels, params)
        (loss * g).sum().backward()
        assert_close(z.grad, g[:, None] * orc.grad, atol=1e-6, rtol=1e-6)
    assert_close(loss.detach(), orc.value, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# gradcheck (float64)
# ---------------------------------------------------------------------------------------------


def _graft(impl_out, surrogate_out):
    """Value of the surrogate, gradient of the implementation."""
    return impl_out + (surrogate_out - impl_out).detach()


# Losses without any stop-gradient: gradcheck the implementation itself.
TRUE_GRADIENT = ("ce", "ce_entropy", "sft_kl")


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_gradcheck_token_loss(cfg):
    """The gradient (with per-token upstream weights) is autograd of the surrogate, a function written without
    stop-gradients (potential or frozen-coefficient form, see tests/helpers/loss_oracles.make_surrogate), and the
    surrogate's value differentiated numerically; losses with true gradients are gradchecked as they are."""
    name, params = cfg
    N, V = 5, 7
    logits, labels = make_logits(N, V, seed=51, n_ignored=1)
    params = with_inputs(name, params, make_cost_embedding(V, 3, seed=51), rows=N, seed=51)
    sur = O.make_surrogate(name, logits, labels, **params)
    kw = logits_params(params)
    z = logits.clone().requires_grad_(True)
    g = upstream("random", N, 51, F64)
    got = torch.autograd.grad((token_loss(name, z, labels, chunk_size=2, **kw) * g).sum(), z)[0]
    assert_close(got, torch.autograd.grad((sur(z) * g).sum(), z)[0], **_tol(name))
    if name in TRUE_GRADIENT:

        def fn(x):
            return token_loss(name, x, labels, chunk_size=2, **kw)

    else:

        def fn(x):
            return _graft(token_loss(name, x, labels, chunk_size=2, **kw), sur(x))

    assert torch.autograd.gradcheck(fn, (z,), eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_gradcheck_fused_token_loss(cfg):
    name, params = cfg
    N, V, d = 5, 7, 3
    hidden, weight, labels = make_fused(N, V, d, seed=61, n_ignored=1)
    params = with_inputs(name, params, make_cost_embedding(V, 4, seed=61), rows=N, seed=61)
    sur = O.make_surrogate(name, hidden @ weight.T, labels, **params)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    g = upstream("random", N, 61, F64)
    got = torch.autograd.grad(
        (fused_token_loss(name, h, w, labels, chunk_size=2, **params) * g).sum(), (h, w)
    )
    want = torch.autograd.grad((sur(h @ w.T) * g).sum(), (h, w))
    for a, b in zip(got, want):
        assert_close(a, b, **_tol(name))
    if name in TRUE_GRADIENT:

        def fn(a, b):
            return fused_token_loss(name, a, b, labels, chunk_size=2, **params)

    else:

        def fn(a, b):
            return _graft(fused_token_loss(name, a, b, labels, chunk_size=2, **params), sur(a @ b.T))

    assert torch.autograd.gradcheck(fn, (h, w), eps=1e-6, atol=1e-6, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# Closed-form facts
# ---------------------------------------------------------------------------------------------


def _grads_all_paths(name, params, logits, hidden, weight, labels, g):
    """Return {path: (loss, grad wrt logits-equivalent)}; fused grads are returned as (h.grad, w.grad)."""
    out = {}
    for path in ("token", "reference"):
        z = logits.clone().requires_grad_(True)
        loss = call_logits_path(path, name, z, labels, params)
        (loss * g).sum().backward()
        out[path] = (loss.detach(), z.grad)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    loss = fused_token_loss(name, h, w, labels, **params)
    (loss * g).sum().backward()
    out["fused"] = (loss.detach(), (h.grad, w.grad))
    return out


def _fused_case():
    hidden, weight, labels = make_fused(9, 13, 6, seed=71)
    return hidden, weight, hidden @ weight.T, labels


def test_gem_linear_beta1_gradient_equals_ce_gradient():
    hidden, weight, logits, labels = _fused_case()
    g = upstream("random", 9, 71, F64)
    gem = _grads_all_paths("gem_linear", {"beta": 1.0}, logits, hidden, weight, labels, g)
    ce = _grads_all_paths("ce", {}, logits, hidden, weight, labels, g)
    for path in ("token", "reference"):
        torch.testing.assert_close(gem[path][1], ce[path][1], **TIGHT)
    for a, b in zip(gem["fused"][1], ce["fused"][1]):
        torch.testing.assert_close(a, b, **TIGHT)
    # but the values differ (gem = E_q z - z_y != l in general)
    assert not torch.allclose(gem["token"][0], ce["token"][0])


@pytest.mark.parametrize("name", ["gem_linear", "gem_ls"])
@pytest.mark.parametrize("beta", [0.7, 0.4, 1.3])
def test_gem_value_closed_form(name, beta):
    hidden, weight, logits, labels = _fused_case()
    valid = labels != IGNORE_INDEX
    ys = torch.where(valid, labels, 0)
    q = torch.softmax(logits / beta, dim=1)
    zy = logits.gather(1, ys[:, None])
    if name == "gem_linear":
        expected = (q * logits).sum(1) - zy.squeeze(1)  # E_q[z] - z_y
    else:
        w = torch.sigmoid(0.01 * (logits - zy))
        expected = (q * w * (logits - zy)).sum(1)
    expected = expected * valid
    g = upstream("random", 9, 72, F64)
    res = _grads_all_paths(name, {"beta": beta}, logits, hidden, weight, labels, g)
    for path in ("token", "reference", "fused"):
        torch.testing.assert_close(res[path][0], expected, **TIGHT)


def test_gem_value_can_be_negative():
    # label = argmax with a clear margin => z_y > E_q[z] => negative gem_linear value
    logits = torch.tensor([[3.0, 0.0, -1.0, 0.5]], dtype=F64)
    labels = torch.tensor([0])
    for path in ("token", "reference"):
        val = call_logits_path(path, "gem_linear", logits, labels, {})
        assert val.item() < 0
        torch.testing.assert_close(val, O.oracle("gem_linear", logits, labels).value, **TIGHT)


@pytest.mark.parametrize("dtype", [F64, F32])
def test_emo1_forward_value_equals_ce(dtype):
    hidden, weight, logits, labels = _fused_case()
    emb = make_cost_embedding(13, 5, seed=73, big=False)
    params = {"cost_embedding": emb.to(dtype), "weighting": "emo1"}
    rtol = 1e-8 if dtype == F64 else 2e-5
    ce_tok = token_loss("ce", logits.to(dtype), labels)
    for path in ("token", "reference"):
        emo = call_logits_path(path, "emo", logits.to(dtype), labels, params)
        torch.testing.assert_close(emo, ce_tok, rtol=rtol, atol=rtol)
    emo_f = fused_token_loss("emo", hidden.to(dtype), weight.to(dtype), labels, **params)
    ce_f = fused_token_loss("ce", hidden.to(dtype), weight.to(dtype), labels)
    torch.testing.assert_close(emo_f, ce_f, rtol=rtol, atol=rtol)
    # and the emo1 gradient is NOT the CE gradient (the DEMD term is live)
    z1 = logits.clone().requires_grad_(True)
    z2 = logits.clone().requires_grad_(True)
    token_loss("emo", z1, labels, **{**params, "cost_embedding": emb}).sum().backward()
    token_loss("ce", z2, labels).sum().backward()
    assert (z1.grad - z2.grad).abs().max() > 1e-3


def test_emo2_value_is_twice_e_and_e_is_demd_plus_py():
    hidden, weight, logits, labels = _fused_case()
    emb = make_cost_embedding(13, 5, seed=74)
    valid = labels != IGNORE_INDEX
    ys = torch.where(valid, labels, 0)
    # independent computation of e = DEMD + p_y (non-zero embeddings: s_y = 1)
    eh = emb / emb.norm(dim=1, keepdim=True)
    s = eh[ys] @ eh.T
    p = torch.softmax(logits, dim=1)
    demd = 1 - (p * s).sum(1)
    py = p.gather(1, ys[:, None]).squeeze(1)
    e = (demd + py) * valid
    e_alt = (1 - (p * s).sum(1) + py * s.gather(1, ys[:, None]).squeeze(1)) * valid
    torch.testing.assert_close(e, e_alt, **TIGHT)  # s_y == 1
    params = {"cost_embedding": emb, "weighting": "emo2"}
    g = upstream("random", 9, 74, F64)
    res = _grads_all_paths("emo", params, logits, hidden, weight, labels, g)
    for path in ("token", "reference", "fused"):
        torch.testing.assert_close(res[path][0], 2 * e, **EMO_TIGHT)
    loss, stats = token_loss("emo", logits, labels, return_stats=True, **params)
    torch.testing.assert_close(stats.demd.to(F64), demd * valid, **EMO_TIGHT)
    torch.testing.assert_close(
        loss, 2 * (stats.demd.to(F64) + torch.exp(-stats.ce.to(F64))) * valid, **EMO_TIGHT
    )


@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_demd_gradient_closed_form(weighting):
    """Extract dDEMD/dz from the implementation's gradient and compare with p * (c - DEMD)."""
    hidden, weight, logits, labels = _fused_case()
    emb = make_cost_embedding(13, 5, seed=75)
    valid = labels != IGNORE_INDEX
    ys = torch.where(valid, labels, 0)
    eh = emb / emb.norm(dim=1, keepdim=True)
    s = eh[ys] @ eh.T
    c = 1 - s
    p = torch.softmax(logits, dim=1)
    demd = (p * c).sum(1)
    ell = -torch.log_softmax(logits, 1).gather(1, ys[:, None]).squeeze(1)
    e = demd + p.gather(1, ys[:, None]).squeeze(1)
    onehot = torch.nn.functional.one_hot(ys, 13).double()
    expected = p * (c - demd[:, None])
    # numerical check of the closed form itself
    zz = logits.clone().requires_grad_(True)
    d_auto = torch.autograd.grad((1 - (torch.softmax(zz, 1) * s).sum(1)).sum(), zz)[0]
    torch.testing.assert_close(d_auto, expected, **TIGHT)
    for path in ("token", "reference"):
        z = logits.clone().requires_grad_(True)
        call_logits_path(
            path, "emo", z, labels, {"cost_embedding": emb, "weighting": weighting}
        ).sum().backward()
        if weighting == "emo1":
            r = ell / (e + 1e-10)
            d_demd = (z.grad - 0.5 * (p - onehot)) / (0.5 * r[:, None])
        else:
            a = e / (ell + 1e-10)
            d_demd = z.grad - a[:, None] * (p - onehot)
        torch.testing.assert_close(d_demd[valid], expected[valid], **EMO_TIGHT)


def _ce_equiv_check(name, params, logits, labels, tol=TIGHT):
    z1 = logits.clone().requires_grad_(True)
    z2 = logits.clone().requires_grad_(True)
    g = upstream("random", logits.shape[0], 80, logits.dtype)
    for path in ("token", "reference"):
        z1.grad = None
        z2.grad = None
        a = call_logits_path(path, name, z1, labels, params)
        b = call_logits_path(path, "ce", z2, labels, {})
        (a * g).sum().backward()
        (b * g).sum().backward()
        assert torch.isfinite(a).all() and torch.isfinite(z1.grad).all()
        torch.testing.assert_close(a, b, **tol)
        torch.testing.assert_close(z1.grad, z2.grad, **tol)


@pytest.mark.parametrize(
    "name,params",
    [
        ("tailr", {"gamma": 0.0}),
        ("mixce", {"gamma": 1.0}),
        ("ce_entropy", {"entropy_coef": 0.0}),
        ("eaft", {"alpha": 0.0}),
    ],
)
def test_reduces_to_ce(name, params):
    logits, labels = make_logits(seed=81)
    _ce_equiv_check(name, params, logits, labels)
    hidden, weight, labels = make_fused(seed=81)
    h1 = hidden.clone().requires_grad_(True)
    w1 = weight.clone().requires_grad_(True)
    h2 = hidden.clone().requires_grad_(True)
    w2 = weight.clone().requires_grad_(True)
    a = fused_token_loss(name, h1, w1, labels, **params)
    b = fused_token_loss("ce", h2, w2, labels)
    a.sum().backward()
    b.sum().backward()
    torch.testing.assert_close(a, b, **TIGHT)
    torch.testing.assert_close(h1.grad, h2.grad, **TIGHT)
    torch.testing.assert_close(w1.grad, w2.grad, **TIGHT)


@pytest.mark.parametrize("dtype", [F64, F32, torch.float16, torch.bfloat16])
def test_tailr_gamma0_is_ce_when_py_underflows(dtype):
    """gamma = 0 => w = 1 exactly, also when p_y underflows to 0 (no 0/0)."""
    V = 6
    gap = 1000.0 if dtype == F64 else 200.0
    logits = torch.zeros(3, V, dtype=F64)
    labels = torch.tensor([2, 4, IGNORE_INDEX])
    logits[0, 2] = -gap
    logits[1, 4] = -gap
    logits[1, 0] = 5.0
    logits = logits.to(dtype)
    if dtype in (F64, F32):
        # check that p_y really underflows in this dtype
        assert torch.softmax(logits, 1)[0, 2] == 0
    for path in ("token", "reference"):
        z = logits.clone().requires_grad_(True)
        loss = call_logits_path(path, "tailr", z, labels, {"gamma": 0.0})
        loss.sum().backward()
        assert torch.isfinite(loss).all() and torch.isfinite(z.grad).all(), path
        orc = O.oracle("ce", logits, labels)
        tol = {"atol": 1e-6, "rtol": 1e-6} if dtype in (F64, F32) else {"atol": 1e-2, "rtol": 1e-2}
        torch.testing.assert_close(loss.double(), orc.value, **tol)
        torch.testing.assert_close(z.grad.double(), orc.grad, **tol)
