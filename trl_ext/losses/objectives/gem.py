"""`gem_linear`, `gem_ls`: GEM (Li et al., 2024) as its official code computes it.

L = -sum_i q_i h'(.) (log p_y - log p_i) with q = sg(softmax(z / beta)); h linear (weight 1) or log-sigmoid
(weight w_i = sg(sigmoid(0.01 (z_i - z_y)))). lse(z) cancels, so the closed form needs only q.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import validation
from ..rowops import rowdot, softmax, subtract_at_target
from ..spec import ChunkResult, FullLogits, LossSpec, Param, Rows, option

SIGMOID_SLOPE = 0.01

BETA = Param(
    "beta", 0.7, validation.beta, "GEM temperature of the detached target distribution softmax(z / beta)"
)
BETA_OPTION = option(
    BETA,
    "gem_beta",
    "GEM temperature beta (> 0) of the detached target distribution softmax(z / beta); 1.0 gives the CE "
    "gradient, smaller keeps more diversity (the GEM paper uses 0.7).",
)


def _rows(log_sigmoid: bool, r: Rows) -> ChunkResult:
    # L = sum_i q_i w_i (z_i - z_y): only q = softmax(z / beta) is needed.
    q, _ = softmax(r.z, 1.0 / r.params["beta"])
    if not log_sigmoid:
        loss = rowdot(q, r.z) - r.z_y
        total = 1.0
    else:
        # w = sg(sigmoid(0.01 (z_i - z_y)))
        weight = torch.sub(r.z, r.z_y.unsqueeze(1)).mul_(SIGMOID_SLOPE).sigmoid_()
        q.mul_(weight)  # r = q * w
        del weight
        total = q.sum(dim=1)  # R
        loss = rowdot(q, r.z) - r.z_y * total
    grad = None
    if r.want_grad:  # q - 1_y   /   r - R 1_y
        grad = q
        subtract_at_target(grad, r.y, total)
    return ChunkResult(loss, grad, **r.stats)


def _reference(log_sigmoid: bool, f: FullLogits) -> tuple[Tensor, dict[str, Tensor]]:
    q = F.softmax(f.z / f.params["beta"], dim=-1).detach()
    if log_sigmoid:
        z_y = f.z.gather(1, f.y.unsqueeze(1))
        weight = torch.sigmoid(SIGMOID_SLOPE * (f.z - z_y)).detach()
    else:
        weight = torch.ones_like(q)
    return -(q * weight * (f.log_p_y.unsqueeze(1) - f.log_p)).sum(-1), {}


def linear_rows(r: Rows) -> ChunkResult:
    return _rows(False, r)


def ls_rows(r: Rows) -> ChunkResult:
    return _rows(True, r)


def linear_reference(f: FullLogits) -> tuple[Tensor, dict[str, Tensor]]:
    return _reference(False, f)


def ls_reference(f: FullLogits) -> tuple[Tensor, dict[str, Tensor]]:
    return _reference(True, f)


_COMMON = {"params": (BETA,), "options": (BETA_OPTION,), "uses_softmax": False, "triton": True}
LINEAR = LossSpec(
    "gem_linear",
    "sum_i q_i z_i - z_y with q = sg(softmax(z / beta)); gradient q - onehot(y) (GEM with h(u) = u, Li et al., 2024)",
    linear_rows,
    linear_reference,
    **_COMMON,
)
LS = LossSpec(
    "gem_ls",
    "sum_i q_i w_i (z_i - z_y), w_i = sg(sigmoid(0.01 (z_i - z_y))) (GEM with h = log-sigmoid, Li et al., 2024)",
    ls_rows,
    ls_reference,
    **_COMMON,
)
