"""Small in-place building blocks of the closed forms (`objectives/*`), on [n, V] float chunks."""

from __future__ import annotations

import torch
from torch import Tensor


def rowdot(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise dot product without an [n, V] temporary."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def softmax(z: Tensor, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """softmax(scale * z) in a new buffer, and logsumexp(scale * z)."""
    scaled_max = z.amax(dim=1, keepdim=True) * scale  # scale > 0, so max commutes with scaling
    p = torch.mul(z, scale) if scale != 1.0 else z.clone()
    p.sub_(scaled_max).exp_()
    total = p.sum(dim=1, keepdim=True)
    p.div_(total)
    return p, (scaled_max + total.log()).view(-1)


def subtract_at_target(grad: Tensor, y: Tensor, amount: Tensor | float) -> None:
    """grad[i, y_i] -= amount_i (the -1_y part of every gradient)."""
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad[rows, y] -= amount
