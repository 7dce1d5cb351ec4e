"""`emo`: EMO (Ren et al., ICLR 2024), CE dynamically weighted with the differentiable earth mover distance.

s_i = cos(e_i, e_y) from the cost embedding, c = 1 - s, DEMD = sum_i p_i c_i = 1 - sum_i p_i s_i. The value uses
the official code's `gt_q` trick (the target's own mass left out: e = DEMD + p_y s_y), the gradient the true DEMD.
emo1 = 0.5 (l + sg(l / e) e); emo2 = sg(e / l) l + e.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import validation
from ..rowops import rowdot, subtract_at_target
from ..spec import REQUIRED, ChunkResult, FullLogits, LossSpec, Option, Param, Rows, option

EMO_EPS = 1e-10  # the official code's epsilon in the detached ratios; safe because the math runs in fp32/fp64
WEIGHTINGS = ("emo1", "emo2")

COST_EMBEDDING = Param(
    "cost_embedding",
    REQUIRED,
    validation.tensor,
    "[V, d'] embedding whose cosine distance is the transport cost (normalised inside, never trained)",
    type=torch.Tensor,
)
WEIGHTING = Param(
    "weighting",
    "emo1",
    validation.one_of(*WEIGHTINGS),
    "'emo1': 0.5 * (CE + sg(CE / D) * D), logged value = CE; 'emo2': sg(D / CE) * CE + D, value = 2D",
    type=str,
    choices=WEIGHTINGS,
)


def rows(r: Rows) -> ChunkResult:
    assert r.p is not None and r.ce is not None and r.similarity is not None
    p, ce, similarity, y = r.p, r.ce, r.similarity, r.y
    index = torch.arange(r.z.shape[0], device=r.z.device)
    s_mean = rowdot(p, similarity)  # sum_i p_i s_i
    demd = 1.0 - s_mean
    # The official `gt_q` trick: the target's own mass is left out of the value (gradient unchanged).
    # Clamped at 0 against rounding: mathematically e >= p_y * s_y >= 0.
    e = (demd + p[index, y] * similarity[index, y]).clamp_min_(0.0)
    if r.params["weighting"] == "emo1":
        ratio = ce / (e + EMO_EPS)
        loss = 0.5 * (ce + ratio * e)
        ce_weight, demd_weight = 0.5, 0.5 * ratio
    else:
        ce_weight = e / (ce + EMO_EPS)
        loss = ce_weight * ce + e
        demd_weight = None
    if r.want_stats:
        r.stats["demd"] = demd
    grad = None
    if r.want_grad:
        # dDEMD/dz = p * (c - DEMD) = p * (s_mean - s); grad = a (p - 1_y) + b dDEMD
        grad_demd = similarity.neg_().add_(s_mean.unsqueeze(1)).mul_(p)
        if demd_weight is not None:
            grad_demd.mul_(demd_weight.unsqueeze(1))
        grad = p.mul_(ce_weight if isinstance(ce_weight, float) else ce_weight.unsqueeze(1)).add_(grad_demd)
        subtract_at_target(grad, y, ce_weight)
    return ChunkResult(loss, grad, **r.stats)


def reference(f: FullLogits) -> tuple[Tensor, dict[str, Tensor]]:
    z, p, ce = f.z, f.p, f.ce
    cost_hat = validation.normalized_cost_embedding(f.params["cost_embedding"], z.shape[1], z.device, z.dtype)
    target_emb = cost_hat[f.y]
    one_hot = F.one_hot(f.y, z.shape[1]).to(z.dtype)
    demd = 1.0 - ((p @ cost_hat) * target_emb).sum(-1)
    # Official `gt_q`: the target's mass is removed from the value of p, not from its gradient.
    p_without_target = p - (p * one_hot).detach()
    e = 1.0 - ((p_without_target @ cost_hat) * target_emb).sum(-1)
    e = e + (e.clamp_min(0.0) - e).detach()  # rounding guard, value only (e >= 0 mathematically)
    if f.params["weighting"] == "emo1":
        token = 0.5 * (ce + (ce / (e + EMO_EPS)).detach() * e)
    else:
        token = (e / (ce + EMO_EPS)).detach() * ce + e
    return token, {"demd": demd}


SPEC = LossSpec(
    "emo",
    "`emo1`: 0.5 (l + sg(l / D) D); `emo2`: sg(D / l) l + D, where D = 1 - sum_{i != y} p_i cos(e_i, e_y) in value "
    '(the official code\'s "target mass excluded" trick) and the true DEMD = 1 - sum_i p_i cos(e_i, e_y) in '
    "gradient (EMO, Ren et al., ICLR 2024)",
    rows,
    reference,
    params=(COST_EMBEDDING, WEIGHTING),
    options=(
        Option(
            "emo_cost_embedding",
            COST_EMBEDDING.name,
            "frozen",
            "EMO transport-cost embedding: 'frozen' (a copy of the model's output embedding taken before training, "
            "the paper's choice), 'live' (the current LM head, detached, every step) or a path / hub id of another "
            "model with the same vocabulary whose output embedding is used.",
            validation.model_source,
            type=str,
            from_model=True,
        ),
        option(
            WEIGHTING,
            "emo_weighting",
            "EMO's dynamic weighting: 'emo1' = 0.5 * (CE + sg(CE / DEMD) * DEMD) (logged value equals CE; the "
            "official instruction-tuning code) or 'emo2' = sg(DEMD / CE) * CE + DEMD (the official continual "
            "fine-tuning code).",
        ),
    ),
    stats=("demd",),
    needs_cost_embedding=True,
    triton=True,
)
