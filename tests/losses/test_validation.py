"""Input handling and validation (`trl_ext/losses/validation.py`): shapes, dtypes, ignored labels, bad input raises
ValueError.

Independent oracle tests for trl_ext.losses (written from the API spec, not from the implementation), against
hand-written float64 formulas in tests/helpers/loss_oracles.py; shared cases and builders: tests/helpers/loss_cases.py.
"""

from __future__ import annotations

import math

import pytest
import torch

import tests.helpers.loss_oracles as O  # noqa: E402
from tests.helpers.loss_cases import (  # noqa: E402
    BASIC,
    BASIC_IDS,
    F32,
    F64,
    TIGHT,
    _tol,
    call_logits_path,
    logits_params,
    make_cost_embedding,
    make_fused,
    make_logits,
    upstream,
    with_inputs,
)
from trl_ext.losses import (  # noqa: E402
    LOSS_NAMES,
    fused_token_loss,
    token_loss,
)
from trl_ext.losses.reference import reference_token_loss  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Misc input handling
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", BASIC, ids=BASIC_IDS)
def test_noncontiguous_logits_and_int32_labels(cfg):
    name, params = cfg
    logits, labels = make_logits(9, 13, seed=231)
    params = logits_params(with_inputs(name, params, make_cost_embedding(13, 5, seed=231), rows=9, seed=231))
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
    params = with_inputs(name, params, make_cost_embedding(V, 4, seed=241), rows=N, seed=241)
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
    params = logits_params(with_inputs(name, params, make_cost_embedding(13, 5, seed=251), rows=9, seed=251))
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


def _anchor(name: str, **tensors: torch.Tensor) -> dict:
    """A valid reference model's keywords for the anchored losses (the inputs halved), else none."""
    if name not in ("asft", "sft_kl"):
        return {}
    return {f"reference_{key}": value.detach() * 0.5 for key, value in tensors.items()}


def test_bad_input_fixture_is_valid():
    logits, labels, hidden, weight, flabels, emb = _good()
    for name in LOSS_NAMES:
        p = {"cost_embedding": emb} if name == "emo" else {}
        r, f = _anchor(name, logits=logits), _anchor(name, hidden=hidden, weight=weight)
        assert torch.isfinite(token_loss(name, logits, labels, **p, **r)).all()
        assert torch.isfinite(fused_token_loss(name, hidden, weight, flabels, **p, **f)).all()
        assert torch.isfinite(reference_token_loss(name, logits, labels, **p, **r)).all()


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
    p |= _anchor(name, logits=logits)  # valid: each case is refused for its own input
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
    p |= _anchor(name, hidden=hidden, weight=weight)
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
