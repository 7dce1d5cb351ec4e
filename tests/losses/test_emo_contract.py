"""EMO (trl_ext/losses/objectives/emo.py) and the CE-weighted family's closed form (objectives/ce_weighted.py)
against their contract, for what the oracle tests leave open.

EMO, from the official code (`tok = 0.5 * (ell + sg(ell / (e + 1e-10)) * e)`,
emo2 `sg(e / (ell + 1e-10)) * ell + e`) and the module's docstrings: the epsilon sits where the official code puts
it, so the ratios stay finite and the values right where D or CE is near 0; D >= 0 (a rounding below 0 is cut, in
value); a cost-embedding row of zeros costs 1 to every token (no NaN, also when it is the target's); `ratio_clamp`
bounds emo1's ratio and is refused with emo2; `target_mass` gives the factor of p_y s_y in D's value (1 'excluded',
the default, 0 'included'). CE-weighted: a spec built by `ce_weighted` is L = sg(w) l with the gradient w (p - 1_y).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from trl_ext.losses import LOSSES, fused_token_loss, resolve, token_loss
from trl_ext.losses.objectives import emo
from trl_ext.losses.objectives.ce_weighted import _reference, _rows, ce_weighted
from trl_ext.losses.reference import reference_token_loss
from trl_ext.losses.rows import chunk_math
from trl_ext.losses.spec import FullLogits, Rows
from trl_ext.options import loss_params

F64 = torch.float64
EPS = 1e-10  # the official code's epsilon in both ratios
PATHS = ["token", "fused", "reference"]


def _emo(path: str, z: torch.Tensor, y: torch.Tensor, **params) -> torch.Tensor:
    if path == "token":
        return token_loss("emo", z, y, **params)
    if path == "fused":  # hidden = z, head = identity: the same logits, built by the fused path
        return fused_token_loss("emo", z, torch.eye(z.shape[1], dtype=z.dtype), y, **params)
    return reference_token_loss("emo", z, y, **params)


# --- the epsilon of the detached ratios, where it matters: D or CE near 0 -----------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_emo1_with_a_distance_near_zero_follows_the_official_ratio(path: str) -> None:
    """All mass but p_o = 2e-10 on the target and a token of the same direction (s = 1), p_o on an orthogonal one:
    the true DEMD ('included') is p_o, and emo1's value is 0.5 (l + l D / (D + 1e-10)), finite, between l / 2 and l."""
    z = torch.tensor([[0.0, 0.0, math.log(4e-10)]], dtype=F64)
    y = torch.tensor([0])
    cost = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]], dtype=F64)
    p = torch.softmax(z, dim=1)[0]
    ce, demd = -math.log(p[0].item()), p[2].item()
    assert demd == pytest.approx(2e-10, rel=1e-6)
    value = _emo(path, z, y, cost_embedding=cost, target_mass="included").item()
    assert value == pytest.approx(0.5 * (ce + ce * demd / (demd + EPS)), rel=1e-5)
    assert 0.5 * ce < value < ce


@pytest.mark.parametrize("path", PATHS)
def test_emo2_with_a_cross_entropy_near_zero_follows_the_official_weight(path: str) -> None:
    """p_y = 1 - 2e-10, the rest on an orthogonal token: CE = 2e-10, D = 1 ('excluded'), and emo2's value is
    sg(D / (CE + 1e-10)) CE + D: finite, between D and 2 D."""
    z = torch.tensor([[0.0, math.log(2e-10)]], dtype=F64)
    y = torch.tensor([0])
    cost = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64)
    ce = -torch.log_softmax(z, dim=1)[0, 0].item()
    assert ce == pytest.approx(2e-10, rel=1e-6)
    value = _emo(path, z, y, cost_embedding=cost, weighting="emo2").item()
    assert value == pytest.approx(1.0 * ce / (ce + EPS) + 1.0, rel=1e-5)
    assert 1.0 < value < 2.0


@pytest.mark.parametrize("path", PATHS)
def test_a_distance_rounded_below_zero_counts_as_zero(path: str) -> None:
    """D >= 0 in exact arithmetic. A prediction all on the target (p_y = 1 exactly, CE = 0) with a cost row whose
    normalised square norm rounds to 1 + 2^-52: the true DEMD 1 - ||e_y||^2 rounds below 0; the value is 0."""
    row = torch.tensor([[1.0, 9.0, 3.0]], dtype=F64)
    assert (F.normalize(row, dim=1) ** 2).sum().item() > 1.0  # the rounding this test is about
    cost = torch.cat([row, torch.tensor([[1.0, 0.0, 0.0]], dtype=F64)])
    z = torch.tensor([[0.0, -1000.0]], dtype=F64)
    y = torch.tensor([0])
    for weighting in ("emo1", "emo2"):
        value = _emo(path, z, y, cost_embedding=cost, weighting=weighting, target_mass="included")
        assert value.item() == 0.0, weighting


@pytest.mark.parametrize("target_mass", ["excluded", "included"])
@pytest.mark.parametrize("path", PATHS)
def test_a_zero_cost_row_costs_one_to_every_token_also_as_the_target(path: str, target_mass: str) -> None:
    """docs/losses.md and COST_NORM_EPS: an all-zero cost row stays zero, costing 1 to every token instead of NaN. As
    the target's row: s_i = 0 for every i, so D = 1 in value and gradient (dD/dz = p (c - D) = 0)."""
    gen = torch.Generator().manual_seed(17)
    z = torch.randn(3, 5, generator=gen, dtype=F64)
    y = torch.tensor([2, 0, 2])
    cost = torch.randn(5, 4, generator=gen, dtype=F64)
    cost[2] = 0.0
    ce = -torch.log_softmax(z, dim=1)[torch.arange(3), y]
    p = torch.softmax(z, dim=1)
    for weighting in ("emo1", "emo2"):
        leaf = z.clone().requires_grad_(True)
        loss = _emo(path, leaf, y, cost_embedding=cost, weighting=weighting, target_mass=target_mass)
        loss.sum().backward()
        if weighting == "emo1":
            want, ce_weight = 0.5 * (ce + ce / (1.0 + EPS)), 0.5
        else:
            want, ce_weight = ce / (ce + EPS) + 1.0, (1.0 / (ce + EPS)).unsqueeze(1)
        targets = torch.tensor([0, 2])  # the rows whose target's cost row is zero
        torch.testing.assert_close(loss[targets], want[targets])
        grad = ce_weight * (p - F.one_hot(y, 5).to(F64))
        torch.testing.assert_close(leaf.grad[targets], grad[targets])
        assert torch.isfinite(loss).all() and torch.isfinite(leaf.grad).all()


# --- ratio_clamp: emo1 only; target_mass: the factor of p_y s_y in D's value --------------------------------------


def test_ratio_clamp_with_emo2_is_refused_naming_both_settings() -> None:
    z = torch.randn(4, 6, dtype=F64)
    y = torch.tensor([0, 1, 2, 3])
    cost = torch.randn(6, 3, dtype=F64)
    with pytest.raises(ValueError) as err:
        token_loss("emo", z, y, cost_embedding=cost, weighting="emo2", ratio_clamp=3.0)
    assert str(err.value) == (
        "Loss 'emo': ratio_clamp=3.0 bounds emo1's ratio sg(CE / D) and has no meaning with weighting='emo2'; use "
        "weighting='emo1' or leave ratio_clamp unset (None)."
    )
    with pytest.raises(ValueError) as err:
        loss_params("emo", {"emo_weighting": "emo2", "emo_ratio_clamp": 2})
    assert str(err.value).startswith(
        "Loss 'emo': emo_ratio_clamp=2 bounds emo1's ratio sg(CE / D) and has no meaning with emo_weighting='emo2'"
    )
    assert loss_params("emo", {"emo_weighting": "emo1", "emo_ratio_clamp": 3.0})["ratio_clamp"] == 3.0
    assert loss_params("emo", {"emo_weighting": "emo2"})["ratio_clamp"] is None


def test_target_mass_is_the_factor_of_the_targets_own_mass_in_the_value() -> None:
    assert emo.target_coefficient({"target_mass": "excluded"}) == 1.0
    assert emo.target_coefficient({"target_mass": "included"}) == 0.0
    default = emo.TARGET_MASS.default
    assert default == "excluded"
    # Parameters without target_mass mean its default (the kernel's self-check cases, row_backends.SELF_CHECK_CASES,
    # pass {"weighting": "emo1"} to the closed forms and the kernel alike).
    assert emo.target_coefficient({"weighting": "emo1"}) == emo.target_coefficient({"target_mass": default})
    gen = torch.Generator().manual_seed(23)
    z, raw = torch.randn(4, 7, generator=gen, dtype=F64), torch.randn(7, 3, generator=gen, dtype=F64)
    y = torch.tensor([6, 0, 3, 3])
    unit = F.normalize(raw, dim=1)
    similarity = unit[y] @ unit.T

    def rows(params: dict) -> torch.Tensor:
        return chunk_math(
            "emo", params, z.clone(), y, similarity.clone(), want_grad=False, want_stats=False
        ).loss

    full = resolve("emo", {"cost_embedding": raw})[1]
    full.pop("cost_embedding")
    torch.testing.assert_close(rows({"weighting": "emo1"}), rows(full), rtol=0, atol=0)
    assert not torch.equal(rows({**full, "target_mass": "included"}), rows(full))


# --- the CE-weighted family: L = sg(w) l, gradient w (p - 1_y) ----------------------------------------------------


CE_WEIGHTED = [name for name, spec in LOSSES.items() if spec.weight is not None]


def test_the_ce_weighted_family_is_the_documented_one() -> None:
    assert sorted(CE_WEIGHTED) == ["ce", "dft", "eaft", "mixce", "tailr"]


@pytest.mark.parametrize("name", CE_WEIGHTED)
def test_a_spec_built_by_ce_weighted_is_sg_w_times_ce(name: str) -> None:
    registered = LOSSES[name]
    rest = {
        f.name: getattr(registered, f.name)
        for f in dataclasses.fields(registered)
        if f.name not in ("name", "summary", "rows", "reference", "weight")
    }
    built = ce_weighted(name, registered.summary, registered.weight, **rest)
    assert (built.name, built.summary) == (name, registered.summary)
    assert built.weight is registered.weight
    for key, value in rest.items():
        assert getattr(built, key) == value, key
    for field, function in (("rows", _rows), ("reference", _reference)):
        assert (getattr(built, field).func, getattr(built, field).args) == (function, (registered.weight,))

    gen = torch.Generator().manual_seed(29)
    z = torch.randn(5, 9, generator=gen, dtype=F64) * 2
    y = torch.tensor([8, 0, 4, 4, 1])
    params = resolve(name, {})[1]
    p = torch.softmax(z, dim=1)
    ce = -torch.log_softmax(z, dim=1)[torch.arange(5), y]
    w = registered.weight(z, ce, params)
    w = torch.ones(5, dtype=F64) if w is None else w
    want_grad = w.unsqueeze(1) * (p - F.one_hot(y, 9).to(F64))

    lse = torch.logsumexp(z, dim=1)
    z_y = z[torch.arange(5), y]
    r = Rows(z.clone(), y, z_y, params, None, True, False, {}, p=p.clone(), lse=lse, ce=lse - z_y)
    result = built.rows(r)
    torch.testing.assert_close(result.loss, w * ce)
    torch.testing.assert_close(result.grad, want_grad)

    leaf = z.clone().requires_grad_(True)
    log_p = torch.log_softmax(leaf, dim=1)
    log_p_y = log_p[torch.arange(5), y]
    entropy = -(log_p.exp() * log_p).sum(dim=1)
    token, extra = built.reference(
        FullLogits(leaf, y, log_p, log_p.exp(), log_p_y, -log_p_y, entropy, params)
    )
    assert extra == {}
    torch.testing.assert_close(token.detach(), w * ce)
    token.sum().backward()
    torch.testing.assert_close(leaf.grad, want_grad)  # w is detached: no gradient through it
