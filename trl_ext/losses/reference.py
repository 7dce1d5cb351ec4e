"""Readable full-logits implementations, written the way the papers' official code computes them.

Plain autograd on the whole [N, V] logits (several full-size temporaries): the ground truth the chunked and
fused paths are tested against, and the place to read the math. Not meant for training at scale.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .chunked import TokenStats
from .registry import (
    IGNORE_INDEX,
    check_floating,
    check_labels,
    compute_dtype,
    normalized_cost_embedding,
    resolve,
)
from .rows import EMO_EPS


def reference_token_loss(
    name: str, logits: Tensor, labels: Tensor, *, return_stats: bool = False, **params: Any
) -> Tensor | tuple[Tensor, TokenStats]:
    """Per-token loss `name` (0 where labels == -100), by autograd on full logits."""
    check_floating("logits", logits, 2)
    check_labels(labels, logits.shape[0], logits.shape[1], logits.device)
    _, params = resolve(name, params)
    z = logits.to(compute_dtype(logits.dtype))
    valid = labels != IGNORE_INDEX
    y = torch.where(valid, labels.long(), 0).unsqueeze(1)

    log_p = F.log_softmax(z, dim=-1)
    p = log_p.exp()
    log_p_y = log_p.gather(1, y).squeeze(1)
    ce = -log_p_y
    entropy = -(p * log_p).sum(-1)
    demd = None

    if name == "ce":
        token = ce
    elif name in ("gem_linear", "gem_ls"):
        # GEM as coded: -sum_i q_i h'(.) (log p_y - log p_i) with q = sg(softmax(z / beta)).
        q = F.softmax(z / params["beta"], dim=-1).detach()
        if name == "gem_linear":
            weight = torch.ones_like(q)
        else:
            z_y = z.gather(1, y)
            weight = torch.sigmoid(0.01 * (z - z_y)).detach()
        token = -(q * weight * (log_p_y.unsqueeze(1) - log_p)).sum(-1)
    elif name == "emo":
        cost_hat = normalized_cost_embedding(params["cost_embedding"], z.shape[1], z.device, z.dtype)
        target_emb = cost_hat[y.squeeze(1)]
        one_hot = F.one_hot(y.squeeze(1), z.shape[1]).to(z.dtype)
        demd = 1.0 - ((p @ cost_hat) * target_emb).sum(-1)
        # Official `gt_q`: the target's mass is removed from the value of p, not from its gradient.
        p_without_target = p - (p * one_hot).detach()
        e = 1.0 - ((p_without_target @ cost_hat) * target_emb).sum(-1)
        e = e + (e.clamp_min(0.0) - e).detach()  # rounding guard, value only (e >= 0 mathematically)
        if params["weighting"] == "emo1":
            token = 0.5 * (ce + (ce / (e + EMO_EPS)).detach() * e)
        else:
            token = (e / (ce + EMO_EPS)).detach() * ce + e
    elif name == "ce_entropy":
        token = ce - params["entropy_coef"] * entropy
    elif name == "mixce":
        gamma = params["gamma"]
        token = (gamma + (1.0 - gamma) * log_p_y.exp().detach()) * ce
    elif name == "tailr":
        gamma = params["gamma"]
        p_y = log_p_y.exp().detach()
        denominator = gamma + (1.0 - gamma) * p_y
        weight = torch.where(denominator > 0, p_y / denominator.clamp_min(torch.finfo(z.dtype).tiny), 1.0)
        token = weight * ce
    else:  # pragma: no cover - resolve() rejects unknown names
        raise ValueError(name)

    token = torch.where(valid, token, 0.0)
    if not return_stats:
        return token

    def masked(x: Tensor) -> Tensor:
        return torch.where(valid, x.detach(), 0.0)

    stats = TokenStats(
        ce=masked(ce),
        entropy=masked(entropy),
        top1_correct=masked((z.argmax(-1) == y.squeeze(1)).to(z.dtype)),
        demd=None if demd is None else masked(demd),
    )
    return token, stats
