"""`dft`: Dynamic Fine-Tuning (Wu et al., 2025), w = sg(p_y): CE scaled by the detached target probability.

The same objective as TRL's `loss_type="dft"` and Axolotl's `use_dft`, computed here fused and chunked.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .ce_weighted import ce_weighted


def weight(z: Tensor, ce: Tensor, params: dict[str, Any]) -> Tensor:
    return torch.exp(-ce)  # p_y


SPEC = ce_weighted(
    "dft",
    "sg(p_y) * l (Dynamic Fine-Tuning, Wu et al., 2025; the same objective as TRL's `loss_type=dft` and Axolotl's "
    "`use_dft`)",
    weight,
)
