"""`emo`: EMO (Ren et al., ICLR 2024), CE dynamically weighted with the differentiable earth mover distance.

s_i = cos(e_i, e_y) from the cost embedding, c = 1 - s, DEMD = sum_i p_i c_i = 1 - sum_i p_i s_i.
`target_mass` says what the value e of the EMO term is; its gradient is always the true DEMD's:
'excluded' (default): the official instruction-tuning / continual code's `gt_q` trick, the target's own mass left
out of the value, e = DEMD + p_y s_y; 'included': e = DEMD in value too, the official language-modeling code
(`language_modeling/gpt2.py`, mode `emo`, behind the paper's Table 1) and the paper's formula.
emo1 = 0.5 (l + sg(l / e) e); emo2 = sg(e / l) l + e. `ratio_clamp` c (emo1 only) caps the detached ratio:
0.5 (l + min(sg(l / e), c) e), the `emo` mode of the EMO repository's continual fine-tuning code (c = 3.0 there).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import validation
from ..rowops import rowdot, subtract_at_target
from ..spec import REQUIRED, ChunkResult, FullLogits, LossSpec, Option, Param, Rows, option

EMO_EPS = 1e-10  # the official code's epsilon in the detached ratios; safe because the math runs in fp32/fp64
WEIGHTINGS = ("emo1", "emo2")
TARGET_MASSES = ("excluded", "included")

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


TARGET_MASS = Param(
    "target_mass",
    "excluded",
    validation.one_of(*TARGET_MASSES),
    "the value of D: 'excluded' = 1 - sum_{i != y} p_i s_i (the official instruction-tuning / continual code's "
    "`gt_q` trick), 'included' = the true DEMD 1 - sum_i p_i s_i (the official language-modeling code); the "
    "gradient is the true DEMD's either way",
    type=str,
    choices=TARGET_MASSES,
)


def target_coefficient(params: dict[str, Any]) -> float:
    """The factor of p_y s_y added to DEMD in the value of e: 1.0 'excluded' (`gt_q`), 0.0 'included'."""
    return 1.0 if params.get("target_mass", "excluded") == "excluded" else 0.0


def _ratio_clamp(value: Any) -> str | None:
    if value is None:
        return None
    return validation.positive(value)


RATIO_CLAMP = Param(
    "ratio_clamp",
    None,
    _ratio_clamp,
    "emo1 only: upper bound c of the detached ratio, 0.5 * (CE + min(sg(CE / D), c) * D) (the EMO repository's "
    "continual fine-tuning mode `emo` uses 3.0); None = no bound (the paper's emo1)",
    type=float | None,  # type: ignore[arg-type]
)


def check(params: dict[str, Any]) -> str | None:
    """ratio_clamp bounds emo1's ratio: refused with emo2."""
    if params.get("ratio_clamp") is not None and params["weighting"] != "emo1":
        return (
            f"ratio_clamp={params['ratio_clamp']!r} bounds emo1's ratio sg(CE / D) and has no meaning with "
            f"weighting={params['weighting']!r}; use weighting='emo1' or leave ratio_clamp unset (None)."
        )
    return None


def _clamp(params: dict[str, Any]) -> float | None:
    clamp = params.get("ratio_clamp")
    return None if clamp is None else float(clamp)


def rows(r: Rows) -> ChunkResult:
    assert r.p is not None and r.ce is not None and r.similarity is not None
    p, ce, similarity, y = r.p, r.ce, r.similarity, r.y
    index = torch.arange(r.z.shape[0], device=r.z.device)
    s_mean = rowdot(p, similarity)  # sum_i p_i s_i
    demd = 1.0 - s_mean
    # 'excluded': the official `gt_q` trick, the target's own mass left out of the value (gradient unchanged);
    # 'included': e = DEMD. Clamped at 0 against rounding: mathematically e >= 0 (s_i <= 1).
    if target_coefficient(r.params):
        e = (demd + p[index, y] * similarity[index, y]).clamp_min_(0.0)
    else:
        e = demd.clamp_min(0.0)
    clamp = _clamp(r.params)
    if r.params["weighting"] == "emo1":
        ratio = ce / (e + EMO_EPS)
        if clamp is not None:
            ratio = ratio.clamp_max(clamp)
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
    # Official `gt_q` ('excluded'): the target's mass is removed from the value of p, not from its gradient.
    p_without_target = p - (p * one_hot).detach() if target_coefficient(f.params) else p
    e = 1.0 - ((p_without_target @ cost_hat) * target_emb).sum(-1)
    e = e + (e.clamp_min(0.0) - e).detach()  # rounding guard, value only (e >= 0 mathematically)
    clamp = _clamp(f.params)
    if f.params["weighting"] == "emo1":
        ratio = (ce / (e + EMO_EPS)).detach()
        token = 0.5 * (ce + (ratio if clamp is None else ratio.clamp_max(clamp)) * e)
    else:
        token = (e / (ce + EMO_EPS)).detach() * ce + e
    return token, {"demd": demd}


SPEC = LossSpec(
    "emo",
    "`emo1`: 0.5 (l + sg(l / D) D); `emo2`: sg(D / l) l + D, where D = 1 - sum_{i != y} p_i cos(e_i, e_y) in value "
    '(`target_mass` "excluded", the default: the official instruction-tuning code\'s trick) or the true DEMD '
    '1 - sum_i p_i cos(e_i, e_y) (`target_mass` "included": the official language-modeling code), and the true '
    "DEMD in gradient (EMO, Ren et al., ICLR 2024)",
    rows,
    reference,
    params=(COST_EMBEDDING, WEIGHTING, RATIO_CLAMP, TARGET_MASS),
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
        option(
            RATIO_CLAMP,
            "emo_ratio_clamp",
            "emo1 only: cap c on the detached ratio, 0.5 * (CE + min(sg(CE / DEMD), c) * DEMD), the official "
            "continual fine-tuning code's mode `emo` (c = 3.0); unset = no cap.",
        ),
        option(
            TARGET_MASS,
            "emo_target_mass",
            "EMO's value of DEMD in the detached ratio (emo1) or weight (emo2): 'excluded' = 1 - sum_{i != y} p_i "
            "s_i, the target's own mass left out (the official instruction-tuning and continual fine-tuning code, "
            "its `gt_q`) or 'included' = the true DEMD (the official language-modeling code behind the paper's "
            "Table 1, and the paper's formula); the gradient is the true DEMD's either way.",
        ),
    ),
    stats=("demd",),
    check=check,
    needs_cost_embedding=True,
    triton=True,
)
