"""Independent oracle tests for trl_ext.losses (written from the API spec, not from the implementation).

Every loss in LOSS_NAMES is checked on all three paths (token_loss, fused_token_loss with
logits = hidden @ weight.T, reference_token_loss) against hand-written float64 formulas in
tests/_loss_oracles.py: per-token values, closed-form gradients (with per-token upstream weights),
gradcheck against surrogates whose true derivative is the spec'd gradient, chunk invariance, ignored
rows, half precision, EMO cost-embedding edge cases, stats and input validation.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import tests.helpers.loss_oracles as O  # noqa: E402
from tests.helpers.env import REPO_ROOT  # noqa: E402
from trl_ext.losses import (  # noqa: E402
    IGNORE_INDEX,
    LOSS_NAMES,
    TokenStats,
    fused_token_loss,
    token_loss,
)
from trl_ext.losses.reference import reference_token_loss  # noqa: E402

F64 = torch.float64
F32 = torch.float32
HALF_DTYPES = [torch.float16, torch.bfloat16]

# (name, params) pairs; EMO's cost_embedding is added per test (it depends on V).
CONFIGS = [
    ("ce", {}),
    ("gem_linear", {}),
    ("gem_linear", {"beta": 0.5}),
    ("gem_linear", {"beta": 1.0}),
    ("gem_linear", {"beta": 2.5}),
    ("gem_ls", {}),
    ("gem_ls", {"beta": 0.3}),
    ("gem_ls", {"beta": 1.0}),
    ("emo", {}),
    ("emo", {"weighting": "emo1"}),
    ("emo", {"weighting": "emo2"}),
    ("emo", {"weighting": "emo1", "ratio_clamp": 3.0}),  # the EMO code's continual fine-tuning mode `emo`
    ("emo", {"ratio_clamp": 0.4}),  # a cap that binds on most rows
    ("ce_entropy", {}),
    ("ce_entropy", {"entropy_coef": 0.0}),
    ("ce_entropy", {"entropy_coef": 0.5}),
    ("tailr", {}),
    ("tailr", {"gamma": 0.0}),
    ("tailr", {"gamma": 0.3}),
    ("tailr", {"gamma": 1.0}),
    ("tailr", {"min_weight": 0.0}),  # unclamped: the EMO paper's eq. 16
    ("tailr", {"gamma": 0.3, "min_weight": 0.0}),
    ("tailr", {"gamma": 0.1, "min_weight": 0.6}),  # the clamp binds on most rows
    ("tailr", {"variant": "emo_code"}),
    ("tailr", {"variant": "emo_code", "gamma": 0.9}),
    ("tailr", {"variant": "emo_code", "gamma": 0.1, "min_weight": 0.0}),
    ("tailr", {"variant": "emo_code", "gamma": 1.0}),
    ("tailr", {"variant": "emo_code", "gamma": 0.0}),
    ("mixce", {}),
    ("mixce", {"gamma": 0.0}),
    ("mixce", {"gamma": 0.2}),
    ("mixce", {"gamma": 1.0}),
    ("dft", {}),
    ("eaft", {}),
    ("eaft", {"k": 4}),
    ("eaft", {"alpha": 0.5, "k": 3}),
    ("eaft", {"alpha": 2.0}),
    ("eaft", {"alpha": 0.0}),
]
# One config per loss (default params, EMO both weightings) for the more expensive sweeps.
BASIC = [
    ("ce", {}),
    ("gem_linear", {}),
    ("gem_ls", {}),
    ("emo", {"weighting": "emo1"}),
    ("emo", {"weighting": "emo2"}),
    ("ce_entropy", {}),
    ("tailr", {}),
    ("tailr", {"variant": "emo_code"}),
    ("mixce", {}),
    ("dft", {}),
    ("eaft", {"k": 5}),
]


def _cid(cfg):
    name, params = cfg
    if not params:
        return name
    return name + "-" + "-".join(f"{k}={v}" for k, v in params.items())


CFG_IDS = [_cid(c) for c in CONFIGS]
BASIC_IDS = [_cid(c) for c in BASIC]

GMODES = ["sum", "mean", "const", "random", "sparse"]
TIGHT = {"atol": 1e-10, "rtol": 1e-10}
# EMO's row normalisation uses an (unspecified) epsilon; the cost embedding rows used in the tight
# tests have norms 1e4..1e5 so that any eps <= 1e-6 is invisible at this tolerance.
EMO_TIGHT = {"atol": 2e-9, "rtol": 2e-9}


def test_readme_states_the_tested_tolerances():
    """The agreement claim of docs/losses.md quotes the tolerances these tests use."""
    readme = " ".join((REPO_ROOT / "docs" / "losses.md").read_text(encoding="utf-8").split())
    assert (TIGHT["atol"], EMO_TIGHT["atol"]) == (1e-10, 2e-9)
    assert "values and gradients to 1e-10, EMO to 2e-9" in readme


def _tol(name):
    return EMO_TIGHT if name == "emo" else TIGHT


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def make_cost_embedding(V, dc, seed, big=True, dtype=F64, zero_rows=()):
    gen = _gen(seed + 1000)
    emb = torch.randn(V, dc, generator=gen, dtype=F64)
    if big:
        scale = 10.0 ** (4.0 + torch.rand(V, 1, generator=gen, dtype=F64))
        emb = emb / emb.norm(dim=1, keepdim=True) * scale
    for r in zero_rows:
        emb[r] = 0.0
    return emb.to(dtype)


def with_emb(name, params, emb):
    if name == "emo":
        return {**params, "cost_embedding": emb}
    return dict(params)


def make_labels(N, V, seed, n_ignored=2, argmax_of=None, n_argmax=3):
    gen = _gen(seed + 7)
    labels = torch.randint(0, V, (N,), generator=gen)
    if argmax_of is not None:
        # a few rows where the label is the argmax, so top1_correct sees both values
        am = argmax_of.detach().float().argmax(dim=1)
        labels[:n_argmax] = am[:n_argmax]
    if n_ignored:
        perm = torch.randperm(N, generator=gen)[:n_ignored]
        labels[perm] = IGNORE_INDEX
    return labels


def make_logits(N=9, V=13, seed=0, scale=1.5, dtype=F64, n_ignored=2):
    gen = _gen(seed)
    logits = (torch.randn(N, V, generator=gen, dtype=F64) * scale).to(dtype)
    labels = make_labels(N, V, seed, n_ignored=n_ignored, argmax_of=logits)
    return logits, labels


def make_fused(N=9, V=13, d=6, seed=0, scale=1.5, dtype=F64, n_ignored=2):
    gen = _gen(seed + 99)
    hidden = (torch.randn(N, d, generator=gen, dtype=F64) * scale / math.sqrt(d)).to(dtype)
    weight = torch.randn(V, d, generator=gen, dtype=F64).to(dtype)
    labels = make_labels(N, V, seed, n_ignored=n_ignored, argmax_of=hidden.double() @ weight.double().T)
    return hidden, weight, labels


def upstream(mode, N, seed, dtype):
    gen = _gen(seed + 555)
    if mode == "sum":
        return torch.ones(N, dtype=dtype)
    if mode == "mean":
        return torch.full((N,), 1.0 / N, dtype=dtype)
    if mode == "const":
        return torch.full((N,), 0.37, dtype=dtype)
    g = torch.randn(N, generator=gen, dtype=F64)
    if mode == "sparse":
        g[::2] = 0.0
    return g.to(dtype)


def reduce_loss(loss, mode, g):
    if mode == "sum":
        return loss.sum()
    if mode == "mean":
        return loss.mean()
    return (loss * g.to(loss.dtype)).sum()


def call_logits_path(path, name, logits, labels, params, chunk_size=None, return_stats=False):
    if path == "token":
        return token_loss(name, logits, labels, chunk_size=chunk_size, return_stats=return_stats, **params)
    if path == "reference":
        assert not return_stats and chunk_size is None
        return reference_token_loss(name, logits, labels, **params)
    raise AssertionError(path)


def assert_close(actual, expected, **tol):
    torch.testing.assert_close(actual, expected.to(actual.dtype), **tol)


# ---------------------------------------------------------------------------------------------
# API surface
# ---------------------------------------------------------------------------------------------


def test_api_constants():
    assert tuple(LOSS_NAMES) == (
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


# ---------------------------------------------------------------------------------------------
# Oracle self-checks (the oracle's closed forms vs autograd of readable sg-formulas)
# ---------------------------------------------------------------------------------------------


def _readable_autograd(name, z, labels, params):
    """Readable float64 formulas with stop-gradients, differentiated by autograd (test-side)."""
    cfg = {**O.DEFAULTS[name], **params}
    y = labels.long()
    valid = y != -100
    ys = torch.where(valid, y, torch.zeros_like(y))
    logp = torch.log_softmax(z, dim=1)
    p = logp.exp()
    ell = -logp.gather(1, ys[:, None]).squeeze(1)
    zy = z.gather(1, ys[:, None]).squeeze(1)
    py = p.gather(1, ys[:, None]).squeeze(1)
    if name == "ce":
        out = ell
    elif name == "gem_linear":
        q = torch.softmax(z / cfg["beta"], dim=1).detach()
        out = -(q * (logp.gather(1, ys[:, None]) - logp)).sum(dim=1)
    elif name == "gem_ls":
        q = torch.softmax(z / cfg["beta"], dim=1).detach()
        w = torch.sigmoid(0.01 * (z - zy[:, None])).detach()
        out = -(q * w * (logp.gather(1, ys[:, None]) - logp)).sum(dim=1)
    elif name == "emo":
        eh = O.normalise_rows(cfg["cost_embedding"])
        s = eh[ys] @ eh.T
        demd = 1 - (p * s).sum(dim=1)
        e = demd + (py * s.gather(1, ys[:, None]).squeeze(1)).detach()
        if cfg["weighting"] == "emo1":
            ratio = (ell / (e + 1e-10)).detach()
            if cfg["ratio_clamp"] is not None:
                ratio = torch.clamp(ratio, max=cfg["ratio_clamp"])
            out = 0.5 * (ell + ratio * e)
        else:
            out = (e / (ell + 1e-10)).detach() * ell + e
    elif name == "ce_entropy":
        out = ell - cfg["entropy_coef"] * (-(p * logp).sum(dim=1))
    elif name == "tailr":
        g, lo, pd = cfg["gamma"], cfg["min_weight"], py.detach()
        if cfg["variant"] == "tailr":
            w = torch.clamp(pd / (g + (1 - g) * pd), lo, 1.0)
            out = w * ell
        else:  # the EMO code's tvd: gamma * l + (1 - gamma) * clamp(...) * l
            out = g * ell + (1 - g) * torch.clamp(pd / ((1 - g) + g * pd), lo, 1.0) * ell
    elif name == "mixce":
        out = (cfg["gamma"] + (1 - cfg["gamma"]) * py.detach()) * ell
    elif name == "dft":
        out = py.detach() * ell
    elif name == "eaft":
        top = torch.topk(z.detach(), min(cfg["k"], z.shape[1]), dim=1).values
        q = torch.softmax(top, dim=1)
        entropy = -(q * torch.log(q)).sum(dim=1)
        out = (entropy / 3.0) ** cfg["alpha"] * ell
    return out * valid.double()


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_oracle_self_consistency(cfg):
    name, params = cfg
    logits, labels = make_logits(seed=3)
    params = with_emb(name, params, make_cost_embedding(13, 5, seed=3))
    z = logits.clone().requires_grad_(True)
    val = _readable_autograd(name, z, labels, params)
    g = upstream("random", 9, 3, F64)
    (val * g).sum().backward()
    orc = O.oracle(name, logits, labels, **params)
    torch.testing.assert_close(val.detach(), orc.value, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(z.grad, g[:, None] * orc.grad, atol=1e-12, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Values and closed-form gradients, float64, all paths
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gmode", GMODES)
@pytest.mark.parametrize("path", ["token", "reference"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_logits_paths_match_oracle(cfg, path, gmode):
    name, params = cfg
    N, V = 9, 13
    logits, labels = make_logits(N, V, seed=11)
    params = with_emb(name, params, make_cost_embedding(V, 5, seed=11))
    z = logits.clone().requires_grad_(True)
    loss = call_logits_path(path, name, z, labels, params)
    assert loss.shape == (N,)
    assert loss.dtype == F64
    orc = O.oracle(name, logits, labels, **params)
    assert_close(loss.detach(), orc.value, **_tol(name))
    g = upstream(gmode, N, 11, F64)
    reduce_loss(loss, gmode, g).backward()
    assert z.grad is not None and z.grad.dtype == F64
    assert_close(z.grad, g[:, None] * orc.grad, **_tol(name))


@pytest.mark.parametrize("gmode", GMODES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_fused_matches_oracle(cfg, gmode):
    name, params = cfg
    chunk_size = {"sum": None, "mean": 2, "const": 4, "random": 3, "sparse": None}[gmode]
    N, V, d = 9, 13, 6
    hidden, weight, labels = make_fused(N, V, d, seed=21)
    params = with_emb(name, params, make_cost_embedding(V, 5, seed=21))
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    loss = fused_token_loss(name, h, w, labels, chunk_size=chunk_size, **params)
    assert loss.shape == (N,) and loss.dtype == F64
    logits = hidden @ weight.T
    orc = O.oracle(name, logits, labels, **params)
    assert_close(loss.detach(), orc.value, **_tol(name))
    g = upstream(gmode, N, 21, F64)
    reduce_loss(loss, gmode, g).backward()
    G = g[:, None] * orc.grad
    assert h.grad is not None and w.grad is not None
    assert_close(h.grad, G @ weight, **_tol(name))
    assert_close(w.grad, G.T @ hidden, **_tol(name))


@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_no_cross_row_gradient(cfg, path):
    """Jacobian is block diagonal: upstream weight on one row only moves that row's logits."""
    name, params = cfg
    N, V, d = 7, 11, 5
    hidden, weight, labels = make_fused(N, V, d, seed=31, n_ignored=1)
    params = with_emb(name, params, make_cost_embedding(V, 4, seed=31))
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


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_gradcheck_token_loss(cfg):
    name, params = cfg
    N, V = 5, 7
    logits, labels = make_logits(N, V, seed=51, n_ignored=1)
    params = with_emb(name, params, make_cost_embedding(V, 3, seed=51))
    z = logits.clone().requires_grad_(True)
    if name in ("ce", "ce_entropy"):
        # true gradients: gradcheck the implementation itself

        def fn(x):
            return token_loss(name, x, labels, chunk_size=2, **params)

    else:
        # stop-gradient losses: the spec'd gradient is the true derivative of a surrogate
        # (potential or frozen-coefficient form, see _loss_oracles.surrogate)
        sur = O.make_surrogate(name, logits, labels, **params)

        def fn(x):
            return _graft(token_loss(name, x, labels, chunk_size=2, **params), sur(x))

    assert torch.autograd.gradcheck(fn, (z,), eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_gradcheck_fused_token_loss(cfg):
    name, params = cfg
    N, V, d = 5, 7, 3
    hidden, weight, labels = make_fused(N, V, d, seed=61, n_ignored=1)
    params = with_emb(name, params, make_cost_embedding(V, 4, seed=61))
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    if name in ("ce", "ce_entropy"):

        def fn(a, b):
            return fused_token_loss(name, a, b, labels, chunk_size=2, **params)

    else:
        sur = O.make_surrogate(name, hidden @ weight.T, labels, **params)

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


# ---------------------------------------------------------------------------------------------
# Path equality and chunk invariance
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_three_paths_agree_float32(cfg):
    name, params = cfg
    hidden, weight, labels = make_fused(11, 17, 8, seed=91, dtype=F32, n_ignored=3)
    params = with_emb(name, params, make_cost_embedding(17, 6, seed=91, dtype=F32))
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
    params = with_emb(name, params, make_cost_embedding(V, 5, seed=101, dtype=dtype))
    logits = (hidden @ weight.T).detach()
    g = upstream("random", N, 101, dtype)
    tol = {"atol": 1e-12, "rtol": 1e-12} if dtype == F64 else {"atol": 2e-6, "rtol": 2e-6}
    base_tok = base_fused = None
    for cs in CHUNKS:
        z = logits.clone().requires_grad_(True)
        loss = token_loss(name, z, labels, chunk_size=cs, **params)
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
    params = with_emb(name, params, make_cost_embedding(V, 5, seed=111, big=False, dtype=emb_dtype))
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
    params = with_emb(name, params, make_cost_embedding(V, 4, seed=121, big=False, dtype=dtype))
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
    params = with_emb(name, params, make_cost_embedding(9, 4, seed=122, big=False, dtype=torch.float16))
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
    params = with_emb(name, params, emb)
    params64 = with_emb(name, dict(cfg[1]), emb.double())
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
        orc = O.oracle(name, logits.double(), labels, **params64)
        exp_z = g.double()[:, None] * orc.grad
        torch.testing.assert_close(z.grad.double(), exp_z, **_half_tol(dtype, exp_z))
        assert torch.count_nonzero(z.grad[ign]) == 0
    assert loss.dtype == F32
    assert torch.isfinite(loss).all()
    assert torch.equal(loss.detach()[ign], torch.zeros(int(ign.sum())))
    torch.testing.assert_close(loss.detach().double(), orc.value, **_half_tol(dtype, orc.value))


def _float32_level(ref):
    """Float32 rounding only (a few ulps of the largest value): far below what 16-bit rounding of the logits moves
    (bf16 at logit scale 50: up to ~0.7 nats)."""
    return {"atol": 2e-6 * (1.0 + float(ref.abs().max())), "rtol": 1e-5}


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
    params = with_emb(name, params, emb)
    params64 = with_emb(name, dict(cfg[1]), emb.double())
    g = upstream("random", N, 141, F32)
    if path == "fused":
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = fused_token_loss(name, h, w, labels, **params)
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
        orc = O.oracle(name, z.detach().double(), labels, **params64)
        exp_z = g.double()[:, None] * orc.grad
        torch.testing.assert_close(z.grad.double(), exp_z, **_rounded_to(dtype, exp_z))
    assert loss.dtype == F32
    tol = _float32_level(orc.value)
    if name == "eaft" and scale > 1:
        # EAFT's top-k entropy of a peaked row is a small difference of logits near 50 (log q = z - lse): float32
        # cancellation, amplified by the fractional power, moves the value by up to ~1e-2 relative in float32 itself.
        tol = {"atol": tol["atol"], "rtol": 2e-2}
    torch.testing.assert_close(loss.detach().double(), orc.value, **tol)


# ---------------------------------------------------------------------------------------------
# EMO cost embedding
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32, torch.float16], ids=str)
@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_zero_rows_in_cost_embedding(weighting, path, dtype):
    N, V, d = 8, 11, 5
    hidden, weight, labels = make_fused(N, V, d, seed=151, dtype=F64, n_ignored=1)
    valid_rows = [i for i in range(N) if labels[i] != IGNORE_INDEX]
    target_zero = int(labels[valid_rows[0]])  # zero row at a target
    other = [v for v in range(V) if v not in labels.tolist()][:2]  # zero rows at non-targets
    emb = make_cost_embedding(V, 6, seed=151, big=False, zero_rows=[target_zero, *other])
    params = {"weighting": weighting, "cost_embedding": emb.to(dtype)}
    params64 = {"weighting": weighting, "cost_embedding": emb}
    g = upstream("random", N, 151, F64 if dtype == F64 else F32)
    if path == "fused":
        h = hidden.to(dtype).requires_grad_(True)
        w = weight.to(dtype).requires_grad_(True)
        loss = fused_token_loss("emo", h, w, labels, **params)
        (loss * g).sum().backward()
        grads = [h.grad, w.grad]
    else:
        z = (hidden @ weight.T).to(dtype).requires_grad_(True)
        loss = call_logits_path(path, "emo", z, labels, params)
        (loss * g).sum().backward()
        grads = [z.grad]
    assert torch.isfinite(loss).all()
    assert all(torch.isfinite(gr).all() for gr in grads)
    orc = O.oracle("emo", hidden @ weight.T, labels, **params64)
    # rows whose target has a zero cost row: s == 0 everywhere => DEMD = 1, e = 1
    zero_t = torch.tensor([int(labels[i]) == target_zero for i in range(N)])
    assert zero_t.any()
    torch.testing.assert_close(orc.demd[zero_t], torch.ones(int(zero_t.sum()), dtype=F64))
    tol = {"atol": 1e-6, "rtol": 1e-6} if dtype != torch.float16 else {"atol": 5e-2, "rtol": 2e-2}
    torch.testing.assert_close(loss.detach().double(), orc.value, **tol)
    if path != "fused":
        exp_z = g.double()[:, None] * orc.grad
        torch.testing.assert_close(grads[0].double(), exp_z, **tol)


@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_no_gradient_into_cost_embedding(weighting, path):
    N, V, d = 8, 11, 5
    hidden, weight, labels = make_fused(N, V, d, seed=161, dtype=F32)
    emb = make_cost_embedding(V, 5, seed=161, big=False, dtype=F32).requires_grad_(True)
    g = upstream("random", N, 161, F32)
    if path == "fused":
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = fused_token_loss("emo", h, w, labels, cost_embedding=emb, weighting=weighting)
    else:
        z = (hidden @ weight.T).requires_grad_(True)
        loss = call_logits_path(path, "emo", z, labels, {"cost_embedding": emb, "weighting": weighting})
    (loss * g).sum().backward()
    assert emb.grad is None or torch.count_nonzero(emb.grad) == 0


@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_fused_with_live_head_as_cost_embedding(weighting):
    """'Adaptive' EMO: the head weight itself (requires_grad) as cost embedding; only G.T @ H reaches it."""
    N, V, d = 8, 11, 5
    hidden, weight, labels = make_fused(N, V, d, seed=171)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    g = upstream("random", N, 171, F64)
    loss = fused_token_loss("emo", h, w, labels, cost_embedding=w, weighting=weighting)
    (loss * g).sum().backward()
    orc = O.oracle("emo", hidden @ weight.T, labels, cost_embedding=weight, weighting=weighting)
    G = g[:, None] * orc.grad
    torch.testing.assert_close(loss.detach(), orc.value, atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(h.grad, G @ weight, atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(w.grad, G.T @ hidden, atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("dc", [3, 9])
@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_fused_cost_embedding_other_width(weighting, dc):
    N, V, d = 8, 11, 5
    assert dc != d
    hidden, weight, labels = make_fused(N, V, d, seed=181)
    emb = make_cost_embedding(V, dc, seed=181)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    g = upstream("random", N, 181, F64)
    loss = fused_token_loss("emo", h, w, labels, cost_embedding=emb, weighting=weighting, chunk_size=3)
    (loss * g).sum().backward()
    orc = O.oracle("emo", hidden @ weight.T, labels, cost_embedding=emb, weighting=weighting)
    G = g[:, None] * orc.grad
    torch.testing.assert_close(loss.detach(), orc.value, **EMO_TIGHT)
    torch.testing.assert_close(h.grad, G @ weight, **EMO_TIGHT)
    torch.testing.assert_close(w.grad, G.T @ hidden, **EMO_TIGHT)


@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_invariant_to_cost_row_scaling(weighting):
    logits, labels = make_logits(seed=191)
    emb = make_cost_embedding(13, 5, seed=191, big=False)
    scales = 0.1 + 10 * torch.rand(13, 1, generator=_gen(191), dtype=F64)
    a = token_loss("emo", logits, labels, cost_embedding=emb, weighting=weighting, return_stats=True)
    b = token_loss("emo", logits, labels, cost_embedding=emb * scales, weighting=weighting, return_stats=True)
    torch.testing.assert_close(a[0], b[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(a[1].demd, b[1].demd, atol=1e-6, rtol=1e-6)


def test_emo_cost_embedding_dtype_differs_from_logits():
    logits, labels = make_logits(seed=195, dtype=F32)
    emb = make_cost_embedding(13, 5, seed=195, big=False)
    for emb_dtype in (torch.float16, torch.bfloat16, F64):
        out = token_loss("emo", logits, labels, cost_embedding=emb.to(emb_dtype), weighting="emo2")
        orc = O.oracle("emo", logits, labels, cost_embedding=emb.to(emb_dtype).double(), weighting="emo2")
        assert out.dtype == F32
        torch.testing.assert_close(out.double(), orc.value, atol=1e-3, rtol=1e-3)


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
    if name == "emo":
        t = stats.demd
        assert isinstance(t, torch.Tensor) and t.is_floating_point()
        assert not t.requires_grad and t.grad_fn is None
        tol = EMO_TIGHT if t.dtype == F64 else {"atol": 1e-5, "rtol": 1e-5}
        torch.testing.assert_close(t.double(), orc.demd, **tol)
        assert torch.count_nonzero(t[ign]) == 0
    else:
        assert stats.demd is None


@pytest.mark.parametrize("chunk_size", [None, 3])
@pytest.mark.parametrize("path", ["token", "fused"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=CFG_IDS)
def test_return_stats(cfg, path, chunk_size):
    name, params = cfg
    N, V, d = 10, 13, 6
    hidden, weight, labels = make_fused(N, V, d, seed=201, n_ignored=3)
    params = with_emb(name, params, make_cost_embedding(V, 5, seed=201))
    ign = labels == IGNORE_INDEX
    logits = hidden @ weight.T
    if path == "fused":
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        out = fused_token_loss(name, h, w, labels, chunk_size=chunk_size, return_stats=True, **params)
        plain = fused_token_loss(name, hidden, weight, labels, chunk_size=chunk_size, **params)
    else:
        z = logits.clone().requires_grad_(True)
        out = token_loss(name, z, labels, chunk_size=chunk_size, return_stats=True, **params)
        plain = token_loss(name, logits, labels, chunk_size=chunk_size, **params)
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
    loss, stats = token_loss(name, logits, labels, return_stats=True, **with_emb(name, params, emb))
    orc = O.oracle(name, logits.double(), labels, **with_emb(name, params, emb.double()))
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


# ---------------------------------------------------------------------------------------------
# Misc input handling
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_noncontiguous_logits_and_int32_labels(cfg):
    name, params = cfg
    logits, labels = make_logits(9, 13, seed=231)
    params = with_emb(name, params, make_cost_embedding(13, 5, seed=231))
    nc = logits.T.contiguous().T  # same values, column-major strides
    assert not nc.is_contiguous()
    z1 = logits.clone().requires_grad_(True)
    z2 = nc.clone(memory_format=torch.preserve_format).requires_grad_(True)
    assert not z2.is_contiguous()
    a = token_loss(name, z1, labels, **params)
    b = token_loss(name, z2, labels.to(torch.int32), chunk_size=4, **params)
    g = upstream("random", 9, 231, F64)
    (a * g).sum().backward()
    (b * g).sum().backward()
    torch.testing.assert_close(b, a, **_tol(name))
    torch.testing.assert_close(z2.grad, z1.grad, **_tol(name))


@pytest.mark.parametrize("which", ["hidden", "weight", "none"])
@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_fused_partial_requires_grad(cfg, which):
    name, params = cfg
    N, V, d = 7, 11, 5
    hidden, weight, labels = make_fused(N, V, d, seed=241)
    params = with_emb(name, params, make_cost_embedding(V, 4, seed=241))
    h = hidden.clone().requires_grad_(which == "hidden")
    w = weight.clone().requires_grad_(which == "weight")
    loss = fused_token_loss(name, h, w, labels, **params)
    orc = O.oracle(name, hidden @ weight.T, labels, **params)
    torch.testing.assert_close(loss.detach(), orc.value, **_tol(name))
    if which == "none":
        assert not loss.requires_grad
        return
    g = upstream("random", N, 241, F64)
    (loss * g).sum().backward()
    G = g[:, None] * orc.grad
    if which == "hidden":
        torch.testing.assert_close(h.grad, G @ weight, **_tol(name))
        assert w.grad is None
    else:
        torch.testing.assert_close(w.grad, G.T @ hidden, **_tol(name))
        assert h.grad is None


@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_no_grad_mode(cfg):
    name, params = cfg
    logits, labels = make_logits(seed=251)
    params = with_emb(name, params, make_cost_embedding(13, 5, seed=251))
    z = logits.clone().requires_grad_(True)
    with torch.no_grad():
        out = token_loss(name, z, labels, **params)
    torch.testing.assert_close(out, O.oracle(name, logits, labels, **params).value, **_tol(name))


def test_backward_twice_accumulates():
    """Calling backward on two independent losses accumulates like plain autograd."""
    logits, labels = make_logits(seed=261)
    z = logits.clone().requires_grad_(True)
    token_loss("gem_ls", z, labels).sum().backward()
    token_loss("gem_ls", z, labels).sum().backward()
    torch.testing.assert_close(z.grad, 2 * O.oracle("gem_ls", logits, labels).grad, **TIGHT)


# ---------------------------------------------------------------------------------------------
# Bad input -> ValueError
# ---------------------------------------------------------------------------------------------


def _good():
    logits, labels = make_logits(6, 8, seed=271, dtype=F32)
    hidden, weight, flabels = make_fused(6, 8, 4, seed=271, dtype=F32)
    emb = make_cost_embedding(8, 3, seed=271, big=False, dtype=F32)
    return logits, labels, hidden, weight, flabels, emb


def test_bad_input_fixture_is_valid():
    logits, labels, hidden, weight, flabels, emb = _good()
    for name in LOSS_NAMES:
        p = {"cost_embedding": emb} if name == "emo" else {}
        assert torch.isfinite(token_loss(name, logits, labels, **p)).all()
        assert torch.isfinite(fused_token_loss(name, hidden, weight, flabels, **p)).all()
        assert torch.isfinite(reference_token_loss(name, logits, labels, **p)).all()


@pytest.mark.parametrize("path", ["token", "fused", "reference"])
def test_unknown_loss_name(path):
    logits, labels, hidden, weight, flabels, _ = _good()
    for bad in ("crossentropy", "GEM", "emo3", ""):
        with pytest.raises(ValueError) as ei:
            if path == "fused":
                fused_token_loss(bad, hidden, weight, flabels)
            elif path == "token":
                token_loss(bad, logits, labels)
            else:
                reference_token_loss(bad, logits, labels)
        msg = str(ei.value)
        for valid in LOSS_NAMES:
            assert valid in msg, (valid, msg)


UNKNOWN_PARAM_CASES = [
    ("ce", {"beta": 0.5}, []),
    ("ce", {"gamma": 0.5}, []),
    ("gem_linear", {"gamma": 0.5}, ["beta"]),
    ("gem_linear", {"temperature": 0.5}, ["beta"]),
    ("gem_ls", {"entropy_coef": 0.1}, ["beta"]),
    ("emo", {"beta": 0.7}, ["cost_embedding", "weighting"]),
    ("ce_entropy", {"coef": 0.1}, ["entropy_coef"]),
    ("tailr", {"beta": 0.5}, ["gamma"]),
    ("mixce", {"mixing_ratio": 0.5}, ["gamma"]),
    ("gem_linear", {"cost_embedding": "EMB"}, ["beta"]),
    ("ce", {"weighting": "emo1"}, []),
    ("dft", {"gamma": 0.5}, []),
    ("eaft", {"beta": 0.5}, ["alpha", "k"]),
    ("eaft", {"eaft_alpha": 0.5}, ["alpha", "k"]),
]


@pytest.mark.parametrize("path", ["token", "fused", "reference"])
@pytest.mark.parametrize("name,params,must_mention", UNKNOWN_PARAM_CASES)
def test_unknown_param(name, params, must_mention, path):
    logits, labels, hidden, weight, flabels, emb = _good()
    params = {k: (emb if v == "EMB" else v) for k, v in params.items()}
    if name == "emo":
        params = {"cost_embedding": emb, **params}
    with pytest.raises(ValueError) as ei:
        if path == "fused":
            fused_token_loss(name, hidden, weight, flabels, **params)
        elif path == "token":
            token_loss(name, logits, labels, **params)
        else:
            reference_token_loss(name, logits, labels, **params)
    for word in must_mention:
        assert word in str(ei.value), (word, str(ei.value))


BAD_PARAM_VALUES = [
    ("gem_linear", "beta", [0.0, -0.5, float("nan"), float("inf"), float("-inf")]),
    ("gem_ls", "beta", [0.0, -1.0, float("nan"), float("inf")]),
    ("tailr", "gamma", [-0.01, 1.01, -1.0, 2.0, float("inf")]),
    ("mixce", "gamma", [-0.01, 1.01, float("-inf"), float("inf")]),
    ("ce_entropy", "entropy_coef", [-0.1, -1e-9, float("nan"), float("inf")]),
    ("emo", "weighting", ["emo3", "EMO1", "", "emo"]),
    ("eaft", "alpha", [-0.5, -1e-9, float("nan"), float("inf"), "1"]),
    ("eaft", "k", [0, -3, 2.5, True, "20"]),
]


@pytest.mark.parametrize("path", ["token", "fused"])
@pytest.mark.parametrize(
    "name,param,values", BAD_PARAM_VALUES, ids=[c[0] + "-" + c[1] for c in BAD_PARAM_VALUES]
)
def test_bad_param_values(name, param, values, path):
    logits, labels, hidden, weight, flabels, emb = _good()
    base = {"cost_embedding": emb} if name == "emo" else {}
    for v in values:
        with pytest.raises(ValueError) as ei:
            if path == "fused":
                fused_token_loss(name, hidden, weight, flabels, **base, **{param: v})
            else:
                token_loss(name, logits, labels, **base, **{param: v})
        msg = str(ei.value)
        if param == "weighting":
            assert "emo1" in msg and "emo2" in msg, msg
        else:
            assert param in msg, (param, msg)


@pytest.mark.parametrize("name", ["tailr", "mixce"])
def test_gamma_nan_rejected(name):
    """NaN is not in [0, 1]."""
    logits, labels, *_ = _good()
    with pytest.raises(ValueError):
        token_loss(name, logits, labels, gamma=float("nan"))


@pytest.mark.parametrize(
    "name,param,value",
    [
        ("tailr", "gamma", 0.0),
        ("tailr", "gamma", 1.0),
        ("mixce", "gamma", 0.0),
        ("mixce", "gamma", 1.0),
        ("ce_entropy", "entropy_coef", 0.0),
        ("gem_linear", "beta", 1e-3),
        ("gem_linear", "beta", 100.0),
        ("gem_ls", "beta", 1e-3),
    ],
)
def test_boundary_param_values_accepted(name, param, value):
    logits, labels, *_ = _good()
    out = token_loss(name, logits.double(), labels, **{param: value})
    torch.testing.assert_close(
        out, O.oracle(name, logits, labels, **{param: value}).value, atol=1e-8, rtol=1e-8
    )


def _emb_cases(emb):
    return {
        "missing": None,
        "1d": emb[:, 0].contiguous(),
        "3d": emb[None],
        "wrong_vocab_small": emb[:-1],
        "wrong_vocab_big": torch.cat([emb, emb[:1]]),
        "int": (emb * 10).long(),
        "bool": emb > 0,
        "meta_device": torch.empty(emb.shape, device="meta"),
    }


@pytest.mark.parametrize("case", list(_emb_cases(torch.zeros(8, 3)).keys()))
@pytest.mark.parametrize("path", ["token", "fused", "reference"])
def test_bad_cost_embedding(case, path):
    logits, labels, hidden, weight, flabels, emb = _good()
    bad = _emb_cases(emb)[case]
    params = {} if bad is None else {"cost_embedding": bad}
    with pytest.raises(ValueError):
        if path == "fused":
            fused_token_loss("emo", hidden, weight, flabels, **params)
        elif path == "token":
            token_loss("emo", logits, labels, **params)
        else:
            reference_token_loss("emo", logits, labels, **params)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_bad_logits_and_labels_token(name):
    logits, labels, _, _, _, emb = _good()
    p = {"cost_embedding": emb} if name == "emo" else {}
    N, V = logits.shape
    cases = {
        "logits_1d": (logits[0], labels[:1]),
        "logits_3d": (logits[None], labels),
        "logits_int": ((logits * 10).long(), labels),
        "logits_bool": (logits > 0, labels),
        "labels_2d": (logits, labels[None]),
        "labels_float": (logits, labels.float()),
        "labels_short": (logits, labels[:-1]),
        "labels_long": (logits, torch.cat([labels, labels[:1]])),
        "label_eq_V": (logits, torch.where(torch.arange(N) == 0, torch.tensor(V), labels)),
        "label_big": (logits, torch.where(torch.arange(N) == 1, torch.tensor(10 * V), labels)),
        "label_minus1": (logits, torch.where(torch.arange(N) == 2, torch.tensor(-1), labels)),
        "label_minus101": (logits, torch.where(torch.arange(N) == 2, torch.tensor(-101), labels)),
    }
    for case, (lg, lb) in cases.items():
        with pytest.raises(ValueError):
            token_loss(name, lg, lb, **p)
            pytest.fail(f"no ValueError for {case}")


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_bad_inputs_fused(name):
    _, _, hidden, weight, labels, emb = _good()
    p = {"cost_embedding": emb} if name == "emo" else {}
    N, V = hidden.shape[0], weight.shape[0]
    cases = {
        "hidden_1d": (hidden[0], weight, labels[:1]),
        "hidden_3d": (hidden[None], weight, labels),
        "weight_1d": (hidden, weight[0], labels),
        "weight_3d": (hidden, weight[None], labels),
        "d_mismatch": (hidden[:, :-1], weight, labels),
        "d_mismatch2": (hidden, weight[:, :-1], labels),
        "dtype_mismatch": (hidden, weight.double(), labels),
        "dtype_mismatch_half": (hidden.half(), weight, labels),
        "hidden_int": ((hidden * 10).long(), (weight * 10).long(), labels),
        "hidden_int_only": ((hidden * 10).long(), weight, labels),
        "labels_2d": (hidden, weight, labels[None]),
        "labels_float": (hidden, weight, labels.float()),
        "labels_short": (hidden, weight, labels[:-1]),
        "label_eq_V": (hidden, weight, torch.where(torch.arange(N) == 0, torch.tensor(V), labels)),
        "label_minus1": (hidden, weight, torch.where(torch.arange(N) == 2, torch.tensor(-1), labels)),
    }
    for case, (h, w, lb) in cases.items():
        with pytest.raises(ValueError):
            fused_token_loss(name, h, w, lb, **p)
            pytest.fail(f"no ValueError for {case}")


@pytest.mark.parametrize("bad", [0, -1, -7, 1.5, 2.0, "4", float("nan")])
@pytest.mark.parametrize("path", ["token", "fused"])
def test_bad_chunk_size(bad, path):
    logits, labels, hidden, weight, flabels, _ = _good()
    with pytest.raises(ValueError):
        if path == "fused":
            fused_token_loss("ce", hidden, weight, flabels, chunk_size=bad)
        else:
            token_loss("ce", logits, labels, chunk_size=bad)


@pytest.mark.parametrize("path", ["token", "reference", "fused"])
def test_tailr_variants_differ_at_the_default_gamma(path):
    """At p_y = 0.1 and gamma 0.5 TaiLr's criterion weights CE by 0.20 (its floor; 0.18 unclamped) and the EMO
    code's `tvd` baseline by 0.60 (0.59 unclamped): the two formulas are not the same at the default."""
    z = torch.log(torch.tensor([[0.1, 0.9]], dtype=F64))
    y = torch.tensor([0])
    ce = -math.log(0.1)
    expected = {
        ("tailr", 0.2): 0.2,
        ("tailr", 0.0): 0.1 / 0.55,
        ("emo_code", 0.2): 0.6,
        ("emo_code", 0.0): 0.5 + 0.5 * 0.1 / 0.55,
    }
    for (variant, floor), weight in expected.items():
        params = {"variant": variant, "min_weight": floor}
        if path == "fused":
            loss = fused_token_loss("tailr", z, torch.eye(2, dtype=F64), y, **params)
        else:
            loss = call_logits_path(path, "tailr", z, y, params)
        assert loss.item() == pytest.approx(weight * ce, rel=1e-12), (variant, floor)
