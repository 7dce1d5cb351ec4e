"""Outside audit "mutation score round": the losses' documented defaults, edges and paths, against values computed
by hand in plain Python from the papers' and official code's formulas (the objectives'
docstrings, docs/losses.md), not from the code under test."""

from __future__ import annotations

import math

import pytest
import torch

from trl_ext.losses import LOSSES, FusedSettings, fused_token_loss, token_loss
from trl_ext.losses.settings import env_values, triton_interpreter

# --- helpers: plain-Python softmax and friends on one row -----------------------------------------------------


def _softmax(z: list[float], t: float = 1.0) -> list[float]:
    m = max(x / t for x in z)
    e = [math.exp(x / t - m) for x in z]
    s = sum(e)
    return [x / s for x in e]


def _ce(z: list[float], y: int) -> float:
    return -math.log(_softmax(z)[y])


def _entropy(z: list[float]) -> float:
    return -sum(p * math.log(p) for p in _softmax(z))


def _loss(name: str, z: list[float], y: int, **params) -> float:
    out = token_loss(name, torch.tensor([z], dtype=torch.float64), torch.tensor([y]), **params)
    return float(out[0])


Z, Y = [0.0, 1.0, 2.0, -0.5], 0

# --- GEM (official code: beta 0.7, h = log-sigmoid weight sigmoid(0.01 (z_i - z_y))) ---------------------------


def test_gem_defaults_are_the_papers() -> None:
    q = _softmax(Z, 0.7)
    linear = sum(qi * zi for qi, zi in zip(q, Z, strict=True)) - Z[Y]
    ls = sum(qi / (1 + math.exp(-0.01 * (zi - Z[Y]))) * (zi - Z[Y]) for qi, zi in zip(q, Z, strict=True))
    assert _loss("gem_linear", Z, Y) == pytest.approx(linear, rel=1e-10)
    assert _loss("gem_ls", Z, Y) == pytest.approx(ls, rel=1e-10)


def test_gem_statistics_are_the_tokens_ce_and_entropy() -> None:
    _, stats = token_loss(
        "gem_linear", torch.tensor([Z], dtype=torch.float64), torch.tensor([Y]), return_stats=True
    )
    assert float(stats.ce[0]) == pytest.approx(_ce(Z, Y), rel=1e-10)
    assert float(stats.entropy[0]) == pytest.approx(_entropy(Z), rel=1e-10)


# --- TaiLr: w = clamp(p / (g + (1 - g) p), min_weight, 1); emo_code: g + (1 - g) clamp(p / ((1 - g) + g p), ...) ----

P01 = [math.log(0.1), math.log(0.9)]  # p_y = 0.1 for y = 0


def test_tailr_docstring_example_at_p_01() -> None:
    ce = -math.log(0.1)
    assert _loss("tailr", P01, 0) == pytest.approx(0.2 * ce, rel=1e-9)  # 0.18 clamped at the default 0.2
    assert _loss("tailr", P01, 0, variant="emo_code") == pytest.approx(0.6 * ce, rel=1e-9)


@pytest.mark.parametrize("gamma", [0.2, 0.8])
def test_tailr_emo_code_uses_the_emo_codes_gamma_convention(gamma: float) -> None:
    p, ce = 0.1, -math.log(0.1)
    w = gamma + (1 - gamma) * min(1.0, max(0.2, p / ((1 - gamma) + gamma * p)))
    assert _loss("tailr", P01, 0, variant="emo_code", gamma=gamma) == pytest.approx(w * ce, rel=1e-9)


# --- Anchored SFT: asft = sg(p_y) l + 0.1 KL(p_ref || p); sft_kl = l + 0.1 KL ------------------------------------

ZREF = [1.0, 0.0, 0.0, 0.5]


def _kl(zref: list[float], z: list[float]) -> float:
    pr, p = _softmax(zref), _softmax(z)
    return sum(a * math.log(a / b) for a, b in zip(pr, p, strict=True))


@pytest.mark.parametrize("name", ["asft", "sft_kl"])
def test_anchored_losses_at_their_default_kl_weight(name: str) -> None:
    ce = _ce(Z, Y)
    base = math.exp(-ce) * ce if name == "asft" else ce
    got = float(
        token_loss(
            name,
            torch.tensor([Z], dtype=torch.float64),
            torch.tensor([Y]),
            reference_logits=torch.tensor([ZREF], dtype=torch.float64),
        )[0]
    )
    assert got == pytest.approx(base + 0.1 * _kl(ZREF, Z), rel=1e-9)


def test_anchored_kl_weight_1000_is_accepted_and_above_refused() -> None:
    z, zref = torch.tensor([Z], dtype=torch.float64), torch.tensor([ZREF], dtype=torch.float64)
    got = float(token_loss("sft_kl", z, torch.tensor([Y]), reference_logits=zref, kl_weight=1000.0)[0])
    assert got == pytest.approx(_ce(Z, Y) + 1000.0 * _kl(ZREF, Z), rel=1e-9)
    with pytest.raises(ValueError, match="kl_weight"):
        token_loss("sft_kl", z, torch.tensor([Y]), reference_logits=zref, kl_weight=1000.5)


# --- prob: (1 - p_y^q) / q on min_p <= p_y <= max_p ---------------------------------------------------------------

HALF = [0.0, 0.0]  # p_y = 1/2 exactly


def test_prob_keeps_a_token_exactly_at_min_p_and_at_max_p() -> None:
    assert _loss("prob", HALF, 0, min_p=0.5) == pytest.approx(0.5, rel=1e-12)
    assert _loss("prob", HALF, 0, max_p=0.5) == pytest.approx(0.5, rel=1e-12)
    assert _loss("prob", HALF, 0, min_p=0.6) == 0.0


def test_prob_refuses_equal_bounds() -> None:
    with pytest.raises(ValueError, match="keeps no token"):
        _loss("prob", HALF, 0, min_p=0.5, max_p=0.5)


# --- EAFT: w = (H_k / 3) ** alpha, H_k over the min(k, V) largest logits ---------------------------------------


def test_eaft_weight_is_the_topk_entropy_over_three() -> None:
    # V = 4 < k = 20: the entropy of the whole distribution
    assert _loss("eaft", Z, Y) == pytest.approx(_entropy(Z) / 3.0 * _ce(Z, Y), rel=1e-9)
    # k = 2: the softmax of the two largest logits (2 and 1)
    h2 = _entropy([2.0, 1.0])
    assert _loss("eaft", Z, Y, k=2, alpha=2.0) == pytest.approx((h2 / 3.0) ** 2 * _ce(Z, Y), rel=1e-9)


def test_ce_entropy_default_coefficient_is_the_papers_01() -> None:
    assert _loss("ce_entropy", Z, Y) == pytest.approx(_ce(Z, Y) - 0.1 * _entropy(Z), rel=1e-10)


# --- settings: MiB, the largest budget, empty variables, TRITON_INTERPRET=on ------------------------------------


def test_chunk_budget_is_in_mib_and_one_tib_is_accepted() -> None:
    assert FusedSettings(chunk_memory_mb=3).budget_bytes("cpu") == 3 * 1024 * 1024
    assert FusedSettings().budget_bytes("cpu") == 128 * 1024 * 1024
    assert FusedSettings().budget_bytes("cuda") == 512 * 1024 * 1024
    assert FusedSettings(chunk_memory_mb=1024 * 1024).chunk_memory_mb == 1024 * 1024
    with pytest.raises(ValueError):
        FusedSettings(chunk_memory_mb=1024 * 1024 + 1)


def test_an_empty_variable_is_unset() -> None:
    assert env_values({"DISTMATCH_CHUNK_MEMORY_MB": "", "DISTMATCH_KERNELS": ""}) == {}
    assert FusedSettings.from_env({"DISTMATCH_CHUNK_LOGITS": ""}) == FusedSettings()


@pytest.mark.parametrize(
    ("value", "on"), [("1", True), ("true", True), ("ON", True), ("on", True), ("0", False), ("", False)]
)
def test_triton_interpret_read_as_triton_reads_booleans(value: str, on: bool) -> None:
    assert triton_interpreter({"TRITON_INTERPRET": value}) is on


# --- the fused path's gradients with per-token upstream gradients (against autograd on the full logits) ---------


def test_fused_gradients_with_differing_upstream_and_a_second_backward() -> None:
    torch.manual_seed(0)
    n, d, v = 6, 5, 7
    hidden = torch.randn(n, d, dtype=torch.float64)
    weight = torch.randn(v, d, dtype=torch.float64)
    labels = torch.tensor([1, 3, -100, 0, 6, 2])
    # some rows share the first row's upstream gradient, not all; then a second, different one
    ups = [
        torch.tensor([1.0, 1.0, 4.0, 2.0, -1.0, 0.5], dtype=torch.float64),
        torch.tensor([0.3, 2.0, 1.0, 1.0, 5.0, -2.0], dtype=torch.float64),
    ]

    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = fused_token_loss("ce", h1, w1, labels, settings=FusedSettings(kernels="torch"))
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(h2 @ w2.T, labels, reduction="none", ignore_index=-100)
    torch.testing.assert_close(loss.detach(), ref.detach())
    for i, g in enumerate(ups):
        last = i == len(ups) - 1
        h1.grad = w1.grad = h2.grad = w2.grad = None
        (loss * g).sum().backward(retain_graph=not last)
        (ref * g).sum().backward(retain_graph=not last)
        torch.testing.assert_close(h1.grad, h2.grad)
        torch.testing.assert_close(w1.grad, w2.grad)


# --- options: each keeps its parameter's type ----------------------------------------------------------------


def test_loss_options_keep_their_parameters_types() -> None:
    options = {o.name: o for spec in LOSSES.values() for o in spec.options}
    assert options["eaft_k"].type is int
    assert options["tailr_variant"].type is str
    assert options["tailr_variant"].choices == ("tailr", "emo_code")
    assert options["gem_beta"].type is float
