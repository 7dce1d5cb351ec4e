"""Shared cases of the loss oracle tests (tests/losses/): the (loss, params) configurations, tolerances, and builders
of logits, fused inputs, labels, cost embeddings, reference problems and upstream gradients; the path callers.
Oracles: `loss_oracles`."""

from __future__ import annotations

import math

import torch

from trl_ext.losses import IGNORE_INDEX, token_loss
from trl_ext.losses.reference import reference_token_loss

F64 = torch.float64
F32 = torch.float32
HALF_DTYPES = [torch.float16, torch.bfloat16]

# (name, params) pairs; what a loss takes besides logits and labels (EMO's cost_embedding, the anchored losses'
# reference problem) is added per test by `with_inputs` (it depends on N and V).
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
    ("emo", {"target_mass": "included"}),  # e = DEMD: the EMO code's language modeling (gpt2.py, mode `emo`)
    ("emo", {"weighting": "emo2", "target_mass": "included"}),
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
    ("prob", {}),
    ("prob", {"q": 0.0}),  # exactly CE
    ("prob", {"q": 0.5}),
    ("prob", {"q": 2.0}),
    ("prob", {"min_p": 0.1}),  # the authors' OnlyTopP-0.1
    ("prob", {"max_p": 0.1}),  # OnlyBottomP-0.1
    ("prob", {"q": 0.0, "min_p": 0.1}),  # OnlyTopLogP-0.1
    ("prob", {"q": 0.5, "min_p": 0.02, "max_p": 0.3}),
    ("asft", {}),
    ("asft", {"kl_weight": 0.05}),  # the ASFT README's example command
    ("asft", {"kl_weight": 0.0}),  # DFT
    ("sft_kl", {}),
    ("sft_kl", {"kl_weight": 1.0}),
    ("sft_kl", {"kl_weight": 0.0}),  # CE
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
    ("prob", {}),
    ("asft", {}),
    ("sft_kl", {}),
]
# The anchored losses: their cases carry a reference problem (`with_inputs`), the frozen reference model's
# `reference_hidden` [N, d_ref] + `reference_weight` [V, d_ref] (`logits_params` turns them into `reference_logits`).
REFERENCE_LOSSES = ("asft", "sft_kl")
D_REF = 4  # the reference model's width, another than the policy's in every case


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


def make_reference(N=9, V=13, d_ref=4, seed=0, scale=1.5, dtype=F64):
    """A reference model's hidden states [N, d_ref] and head [V, d_ref] (another width than the policy's)."""
    gen = _gen(seed + 333)
    hidden = (torch.randn(N, d_ref, generator=gen, dtype=F64) * scale / math.sqrt(d_ref)).to(dtype)
    return hidden, torch.randn(V, d_ref, generator=gen, dtype=F64).to(dtype)


def with_inputs(name, params, emb, *, rows, seed, requires_grad=False):
    """`params` plus what loss `name` takes besides logits and labels, for a case of `rows` rows over emb's vocabulary
    in emb's dtype: EMO's cost embedding `emb`; the anchored losses' reference problem (`make_reference` of the case's
    seed; `requires_grad`: the reference tensors ask for a gradient, so a test can assert that none reaches them)."""
    if name == "emo":
        return {**params, "cost_embedding": emb}
    if name in REFERENCE_LOSSES:
        hidden, weight = make_reference(rows, emb.shape[0], D_REF, seed=seed, dtype=emb.dtype)
        hidden, weight = hidden.requires_grad_(requires_grad), weight.requires_grad_(requires_grad)
        return {**params, "reference_hidden": hidden, "reference_weight": weight}
    return dict(params)


def logits_params(params):
    """The params of a logits path (token_loss, reference_token_loss): a reference problem enters as the reference
    model's logits, multiplied in float64 and rounded once to the reference's dtype (what a 16-bit model hands over);
    the oracle of a logits path takes these too."""
    if "reference_hidden" not in params:
        return params
    rest = {k: v for k, v in params.items() if k not in ("reference_hidden", "reference_weight")}
    hidden, weight = params["reference_hidden"], params["reference_weight"]
    return {**rest, "reference_logits": (hidden.double() @ weight.double().T).to(hidden.dtype)}


def as_float64(params):
    """The params with every floating tensor upcast exactly to float64 (for the oracle of 16/32-bit inputs)."""
    return {
        k: v.detach().double() if torch.is_tensor(v) and v.is_floating_point() else v
        for k, v in params.items()
    }


def reference_untouched(params):
    """True when no gradient reached the case's reference tensors (the reference model is frozen)."""
    return all(params[k].grad is None for k in ("reference_hidden", "reference_weight") if k in params)


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
    params = logits_params(params)
    if path == "token":
        return token_loss(name, logits, labels, chunk_size=chunk_size, return_stats=return_stats, **params)
    if path == "reference":
        assert chunk_size is None
        return reference_token_loss(name, logits, labels, return_stats=return_stats, **params)
    raise AssertionError(path)


def assert_close(actual, expected, **tol):
    torch.testing.assert_close(actual, expected.to(actual.dtype), **tol)


def _float32_level(ref):
    """Float32 rounding only (a few ulps of the largest value): far below what 16-bit rounding of the logits moves
    (bf16 at logit scale 50: up to ~0.7 nats)."""
    return {"atol": 2e-6 * (1.0 + float(ref.abs().max())), "rtol": 1e-5}
