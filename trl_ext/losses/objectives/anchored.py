"""`asft` and `sft_kl`: a KL anchor to a frozen reference model (Anchored SFT, Zhu et al., ICLR 2026), as the authors'
code (zhuchichi56/ASFT `train_v2.py`, modes `asft` and `sft+kl`) computes it.

Per token, with p = softmax(z) the policy's and p_ref = softmax(z_ref) the reference model's distribution:
KL = KL(p_ref || p) = sum_i p_ref_i (log p_ref_i - log p_i) (their `F.kl_div(log_softmax(z), softmax(z_ref))`), the
gradient flowing through the policy only (their reference runs under `no_grad`):

* `asft`: sg(p_y) * l + kl_weight * KL (DFT plus the anchor);
* `sft_kl`: l + kl_weight * KL.

d/dz: w (p - 1_y) + kl_weight (p - p_ref), w = p_y (asft) or 1 (sft_kl). KL needs no logarithm of p_ref:
KL = sum_i p_ref_i (z_ref_i - z_i) - lse(z_ref) + lse(z). `kl_weight` defaults to 0.1 (their trainer and
`train_v2.sh`; their README's example command uses 0.05).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from .. import validation
from ..rowops import rowdot, softmax, subtract_at_target
from ..spec import ChunkResult, FullLogits, LossSpec, Option, Param, Rows, option

#: The largest KL weight: the KL's gradient is kl_weight * (p - p_ref) per logit, and 1e30 gives an infinite
#: gradient norm at every step; the ASFT authors use 0.1 - 1.
MAX_KL_WEIGHT = 1000.0


def _kl_weight(value: Any) -> str | None:
    ok = validation.non_negative(value) is None and value <= MAX_KL_WEIGHT
    return (
        None
        if ok
        else (
            f"a number >= 0 and <= {MAX_KL_WEIGHT:g} (the KL's gradient grows with it: 1e30 gives an infinite gradient "
            "norm; the ASFT authors use 0.1 - 1)"
        )
    )


KL_WEIGHT = Param(
    "kl_weight",
    0.1,
    _kl_weight,
    "weight of the KL to the reference model, sum p_ref log(p_ref / p) per token",
)

#: The starting model as the reference (a frozen copy; with LoRA the model with its adapters off).
INITIAL = "initial"
#: Where the reference model comes from: not a parameter of the loss math (the reference enters the functional API
#: as `reference_logits` / `reference_hidden`), resolved by the integrations (`trl_ext.anchor`).
REFERENCE = Option(
    "anchor_reference",
    "reference_model",
    INITIAL,
    "The frozen reference model of 'asft' / 'sft_kl': 'initial' (the model as training starts; with LoRA the model "
    "with its adapters off, no copy) or the folder of another checkpoint with the same vocabulary (config.json "
    "vocab_size and tokenizer), loaded once, frozen, in the training dtype.",
    validation.reference_source,
    type=str,
    from_model=True,
)


def _rows(dft: bool, r: Rows) -> ChunkResult:
    assert r.p is not None and r.ce is not None and r.lse is not None and r.reference is not None
    lam = float(r.params["kl_weight"])
    p_ref, lse_ref = softmax(r.reference)
    # KL(p_ref || p) = sum p_ref (z_ref - z) - lse_ref + lse, before z is overwritten.
    kl = rowdot(p_ref, r.reference.sub_(r.z)).sub_(lse_ref).add_(r.lse)
    w = torch.exp(-r.ce) if dft else None  # sg(p_y)
    loss = (r.ce if w is None else w * r.ce) + lam * kl
    if r.want_stats:
        r.stats["kl"] = kl
    grad = None
    if r.want_grad:  # (w + lam) p - lam p_ref - w 1_y
        grad = r.p.mul_((1.0 + lam) if w is None else (w + lam).unsqueeze(1))
        grad.sub_(p_ref.mul_(lam))
        subtract_at_target(grad, r.y, 1.0 if w is None else w)
    return ChunkResult(loss, grad, **r.stats)


def _reference(dft: bool, f: FullLogits) -> tuple[Tensor, dict[str, Tensor]]:
    assert f.reference is not None
    p_ref = torch.softmax(f.reference.detach().to(f.z.dtype), dim=-1)
    # The authors' form: F.kl_div(log_softmax(z), softmax(z_ref), reduction="none").sum(-1).
    kl = torch.nn.functional.kl_div(f.log_p, p_ref, reduction="none").sum(-1)
    base = f.log_p_y.detach().exp() * f.ce if dft else f.ce
    return base + f.params["kl_weight"] * kl, {"kl": kl}


def _spec(name: str, dft: bool, summary: str) -> LossSpec:
    return LossSpec(
        name,
        summary,
        rows=functools.partial(_rows, dft),
        reference=functools.partial(_reference, dft),
        params=(KL_WEIGHT,),
        options=(
            REFERENCE,
            option(
                KL_WEIGHT,
                "anchor_kl_weight",
                "Weight (>= 0) of the KL from the reference model, sum p_ref log(p_ref / p) per token, in 'asft' / 'sft_kl' (0.1: the ASFT authors' "
                "default; their README example uses 0.05).",
            ),
        ),
        stats=("kl",),
        needs_reference=True,
    )


ASFT = _spec(
    "asft",
    True,
    "sg(p_y) * l + kl_weight * sum p_ref log(p_ref / p), p_ref a frozen reference model's distribution (Anchored SFT, Zhu et al., ICLR 2026, as "
    "the authors' `train_v2.py` mode `asft`)",
)
SFT_KL = _spec(
    "sft_kl",
    False,
    "l + kl_weight * sum p_ref log(p_ref / p), p_ref a frozen reference model's distribution (the ASFT authors' "
    "mode `sft+kl`)",
)
