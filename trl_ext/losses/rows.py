"""Closed-form per-token values and logit gradients of every loss, for one chunk of rows.

Both memory-efficient paths (`chunked.py`) call `chunk_math` on a chunk of valid rows whose fp32 logits they
own; it returns the per-token loss, optionally dL/dz for each row (the gradient of that row's loss w.r.t. its
logits, computed in closed form instead of by autograd) and the logging statistics. Buffers are reused in place
so a chunk costs about three (EMO: four) `rows x V` temporaries. Notation follows `reference/losses.md`:
z logits, y target, p = softmax(z), l = -log p_y, q = softmax(z / beta), s_i = cosine(e_i, e_y), c = 1 - s.

`reference.py` computes the same quantities by autograd on full logits; tests hold the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

EMO_EPS = 1e-10  # the official code's epsilon in the detached ratios; safe because the math runs in fp32/fp64


@dataclass
class ChunkResult:
    loss: Tensor  # [n]
    grad: Tensor | None  # [n, V] dL_i/dz_i, or None when not requested
    ce: Tensor | None = None  # [n] statistics, when requested
    entropy: Tensor | None = None
    top1_correct: Tensor | None = None
    demd: Tensor | None = None


def rowdot(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise dot product without an [n, V] temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def _softmax(z: Tensor, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """softmax(scale * z) in a new buffer, and logsumexp(scale * z)."""
    scaled_max = z.amax(dim=1, keepdim=True) * scale  # scale > 0, so max commutes with scaling
    p = torch.mul(z, scale) if scale != 1.0 else z.clone()
    p.sub_(scaled_max).exp_()
    total = p.sum(dim=1, keepdim=True)
    p.div_(total)
    return p, (scaled_max + total.log()).view(-1)


def _subtract_at_target(grad: Tensor, y: Tensor, amount: Tensor | float) -> None:
    """grad[i, y_i] -= amount_i (the -1_y part of every gradient)."""
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad[rows, y] -= amount


def chunk_math(
    name: str,
    params: dict[str, Any],
    z: Tensor,
    y: Tensor,
    similarity: Tensor | None,
    *,
    want_grad: bool,
    want_stats: bool,
) -> ChunkResult:
    """Loss (and gradient, statistics) of valid rows `z` [n, V] with targets `y` [n].

    `z` is owned by the caller's chunk and may be overwritten. `similarity` ([n, V], EMO only, also overwritten)
    holds s_ij = cos(e_{y_i}, e_j) from the normalised cost embedding.
    """
    z_y = z.gather(1, y.unsqueeze(1)).view(-1)
    stats: dict[str, Tensor] = {}
    if want_stats:
        stats["top1_correct"] = (z.argmax(dim=1) == y).to(z.dtype)

    needs_p = name not in ("gem_linear", "gem_ls") or want_stats
    p = lse = ce = None
    if needs_p:
        p, lse = _softmax(z)
        ce = lse - z_y
        if want_stats or name == "ce_entropy":
            stats["entropy"] = lse - rowdot(p, z)
        if want_stats:
            stats["ce"] = ce

    if name in ("gem_linear", "gem_ls"):
        # L = sum_i q_i w_i (z_i - z_y): lse(z) cancels, so only q = softmax(z / beta) is needed.
        q, _ = _softmax(z, 1.0 / params["beta"])
        if name == "gem_linear":
            loss = rowdot(q, z) - z_y
            total = 1.0
        else:
            weight = torch.sub(z, z_y.unsqueeze(1)).mul_(0.01).sigmoid_()  # sg(sigmoid(0.01 (z_i - z_y)))
            q.mul_(weight)  # r = q * w
            del weight
            total = q.sum(dim=1)  # R
            loss = rowdot(q, z) - z_y * total
        grad = None
        if want_grad:  # q - 1_y   /   r - R 1_y
            grad = q
            _subtract_at_target(grad, y, total)
        return ChunkResult(loss, grad, **stats)

    assert p is not None and ce is not None and lse is not None
    if name == "emo":
        assert similarity is not None
        rows = torch.arange(z.shape[0], device=z.device)
        s_mean = rowdot(p, similarity)  # sum_i p_i s_i
        demd = 1.0 - s_mean
        # The official `gt_q` trick: the target's own mass is left out of the value (gradient unchanged).
        # Clamped at 0 against rounding: mathematically e >= p_y * s_y >= 0.
        e = (demd + p[rows, y] * similarity[rows, y]).clamp_min_(0.0)
        if params["weighting"] == "emo1":
            ratio = ce / (e + EMO_EPS)
            loss = 0.5 * (ce + ratio * e)
            ce_weight, demd_weight = 0.5, 0.5 * ratio
        else:
            ce_weight = e / (ce + EMO_EPS)
            loss = ce_weight * ce + e
            demd_weight = None
        if want_stats:
            stats["demd"] = demd
        grad = None
        if want_grad:
            # dDEMD/dz = p * (c - DEMD) = p * (s_mean - s); grad = a (p - 1_y) + b dDEMD
            grad_demd = similarity.neg_().add_(s_mean.unsqueeze(1)).mul_(p)
            if demd_weight is not None:
                grad_demd.mul_(demd_weight.unsqueeze(1))
            grad = p.mul_(ce_weight if isinstance(ce_weight, float) else ce_weight.unsqueeze(1)).add_(
                grad_demd
            )
            _subtract_at_target(grad, y, ce_weight)
        return ChunkResult(loss, grad, **stats)

    if name == "ce":
        loss, weight = ce, None
    elif name == "mixce":
        gamma = params["gamma"]
        weight = gamma + (1.0 - gamma) * torch.exp(-ce)
        loss = weight * ce
    elif name == "tailr":
        gamma = params["gamma"]
        p_y = torch.exp(-ce)
        denominator = gamma + (1.0 - gamma) * p_y
        # gamma = 0 is exactly CE (weight 1), also where p_y underflows to 0.
        weight = torch.where(denominator > 0, p_y / denominator.clamp_min(torch.finfo(z.dtype).tiny), 1.0)
        loss = weight * ce
    elif name == "ce_entropy":
        coef = params["entropy_coef"]
        entropy = stats["entropy"] if want_stats else stats.pop("entropy")
        loss, weight = ce - coef * entropy, None
        if want_grad:
            # d(-H)/dz = p * (log p + H) = p * (z - lse + H); z is no longer needed, so reuse it.
            grad_entropy = z.sub_((lse - entropy).unsqueeze(1)).mul_(p).mul_(coef)
            grad = p.add_(grad_entropy)
            _subtract_at_target(grad, y, 1.0)
            return ChunkResult(loss, grad, **stats)
    else:  # pragma: no cover - the registry rejects unknown names first
        raise ValueError(f"no closed form for loss {name!r}")

    grad = None
    if want_grad:  # weight * (p - 1_y), the CE gradient scaled by the detached per-token weight
        grad = p
        if weight is not None:
            grad.mul_(weight.unsqueeze(1))
        _subtract_at_target(grad, y, 1.0 if weight is None else weight)
    return ChunkResult(loss, grad, **stats)
