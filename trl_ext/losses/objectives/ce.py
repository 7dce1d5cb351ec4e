"""`ce`: cross-entropy, l = -log p_y (weight 1)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .ce_weighted import ce_weighted


def weight(z: Tensor, ce: Tensor, params: dict[str, Any]) -> None:
    return None


SPEC = ce_weighted("ce", "l (cross-entropy, maximum likelihood)", weight, triton=True)
