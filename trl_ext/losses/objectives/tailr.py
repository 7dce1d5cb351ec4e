"""`tailr`: TaiLr (EMO paper appendix A.1, eq. 16), w = sg(p_y) / (gamma + (1 - gamma) sg(p_y)); gamma = 0 is CE."""

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
    p_y = torch.exp(-ce)
    denominator = gamma + (1.0 - gamma) * p_y
    # gamma = 0 is exactly CE (weight 1), also where p_y underflows to 0.
    return torch.where(denominator > 0, p_y / denominator.clamp_min(torch.finfo(z.dtype).tiny), 1.0)


SPEC = ce_weighted(
    "tailr",
    "sg(p_y) / (gamma + (1 - gamma) sg(p_y)) * l (TaiLr; EMO paper appendix A.1, eq. 16; gamma = 0 is CE)",
    weight,
    params=(GAMMA,),
    options=(
        option(
            GAMMA,
            "tailr_gamma",
            "TaiLr coefficient in [0, 1]: CE weighted by sg(p) / (gamma + (1 - gamma) sg(p)); 0 is CE.",
        ),
    ),
)
