"""`tailr`: TaiLr (Ji et al., ICLR 2023), CE weighted by the detached, clamped density-ratio estimate.

``variant="tailr"`` (default): TaiLr's released criterion (thu-coai/TaiLr ``fairseq/criterions/tailr.py``),
w = clamp(sg(p_y) / (gamma + (1 - gamma) sg(p_y)), min_weight, 1); gamma = 0 is CE (w = 1). `min_weight` defaults to
0.2, the value of TaiLr's released training scripts for open-ended generation, summarisation and the synthetic
experiment (``examples/bart/long``, ``examples/bart/summarization``, ``examples/synthetic``; its translation script
uses 0.3; the criterion's own command-line default is 0); ``min_weight=0`` is the unclamped weight of the EMO
paper's appendix A.1 (eq. 16).

``variant="emo_code"``: the ``tvd`` baseline of the EMO repository (``language_modeling/gpt2.py``), behind the TaiLr
rows of EMO's tables: w = gamma + (1 - gamma) clamp(sg(p_y) / ((1 - gamma) + gamma sg(p_y)), min_weight, 1), with
the EMO code's gamma convention (its ``mixing_ratio``: gamma = 1 is CE) and its fixed clamp at 0.2 = the default
`min_weight`. At gamma = 0.5 the two variants differ: at p_y = 0.1 the weights are 0.20 (TaiLr) and 0.60 (EMO
code) with min_weight 0.2, 0.18 and 0.59 unclamped.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import validation
from ..spec import Param, option
from .ce_weighted import ce_weighted

VARIANTS = ("tailr", "emo_code")
#: TaiLr's released training scripts (open-ended generation, summarisation, synthetic data): --density-min-weight 0.2.
DEFAULT_MIN_WEIGHT = 0.2

GAMMA = Param(
    "gamma",
    0.5,
    validation.unit_interval,
    "TaiLr's gamma (variant 'tailr': 0 is CE) or the EMO code's mixing ratio (variant 'emo_code': 1 is CE)",
)
MIN_WEIGHT = Param(
    "min_weight",
    DEFAULT_MIN_WEIGHT,
    validation.unit_interval,
    "lower clamp of the density-ratio weight (TaiLr's released scripts: 0.2; 0 = no clamp)",
)
VARIANT = Param(
    "variant",
    "tailr",
    validation.one_of(*VARIANTS),
    "'tailr': TaiLr's released criterion; 'emo_code': the EMO repository's `tvd` baseline (its gamma convention)",
    type=str,
    choices=VARIANTS,
)


def _ratio(p_y: Tensor, a: float, b: float) -> Tensor:
    """p_y / (a + b p_y), and 1 where the denominator is 0 (a = 0 and p_y underflowed: the limit is 1)."""
    denominator = a + b * p_y
    return torch.where(denominator > 0, p_y / denominator.clamp_min(torch.finfo(p_y.dtype).tiny), 1.0)


def weight(z: Tensor, ce: Tensor, params: dict[str, Any]) -> Tensor:
    gamma, floor = params["gamma"], params["min_weight"]
    p_y = torch.exp(-ce)
    if params["variant"] == "emo_code":
        return gamma + (1.0 - gamma) * _ratio(p_y, 1.0 - gamma, gamma).clamp(floor, 1.0)
    return _ratio(p_y, gamma, 1.0 - gamma).clamp(floor, 1.0)


SPEC = ce_weighted(
    "tailr",
    "clamp(sg(p_y) / (gamma + (1 - gamma) sg(p_y)), min_weight, 1) * l (TaiLr's released criterion; gamma = 0 is "
    "CE); variant 'emo_code': (gamma + (1 - gamma) clamp(sg(p_y) / ((1 - gamma) + gamma sg(p_y)), min_weight, 1)) "
    "* l (the EMO repository's `tvd` baseline; gamma = 1 is CE)",
    weight,
    params=(GAMMA, MIN_WEIGHT, VARIANT),
    options=(
        option(
            GAMMA,
            "tailr_gamma",
            "TaiLr coefficient in [0, 1]: CE weighted by clamp(sg(p) / (gamma + (1 - gamma) sg(p)), "
            "tailr_min_weight, 1); 0 is CE. With tailr_variant=emo_code it is the EMO code's mixing ratio (1 is CE).",
        ),
        option(
            MIN_WEIGHT,
            "tailr_min_weight",
            "TaiLr's lower clamp of the weight, in [0, 1] (default 0.2, TaiLr's released scripts; 0 = unclamped, "
            "the EMO paper's eq. 16).",
        ),
        option(
            VARIANT,
            "tailr_variant",
            "'tailr' (TaiLr's released criterion) or 'emo_code' (the EMO repository's `tvd` baseline behind the "
            "TaiLr rows of EMO's tables, with its gamma convention).",
        ),
    ),
)
