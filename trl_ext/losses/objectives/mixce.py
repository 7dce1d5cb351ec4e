"""`mixce`: MixCE (EMO paper eq. 17), w = gamma + (1 - gamma) sg(p_y); gamma = 1 is CE."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import validation
from ..spec import Param, option
from .ce_weighted import ce_weighted

GAMMA = Param("gamma", 0.5, validation.unit_interval, "interpolation coefficient (EMO paper appendix A.1)")


def weight(z: Tensor, ce: Tensor, params: dict[str, Any]) -> Tensor:
    gamma = params["gamma"]
    return gamma + (1.0 - gamma) * torch.exp(-ce)


SPEC = ce_weighted(
    "mixce",
    "(gamma + (1 - gamma) sg(p_y)) * l (MixCE; EMO paper eq. 17; gamma = 1 is CE)",
    weight,
    params=(GAMMA,),
    options=(
        option(
            GAMMA,
            "mixce_gamma",
            "MixCE coefficient in [0, 1]: CE weighted by gamma + (1 - gamma) sg(p); 1 is CE.",
        ),
    ),
)
