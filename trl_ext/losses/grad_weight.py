"""How the fused path produces the LM head's weight gradient, d W = sum_i g_i G_i^T h_i.

G_i is row i's logit gradient for a unit upstream gradient (what the row math returns), g_i the upstream gradient
of its per-token loss, h_i its hidden state. The mode is the settings' `grad_weight_accum`:

| mode | forward | backward, upstream uniform over the valid rows (`sum / n`) | otherwise |
|---|---|---|---|
| `float32` | G^T h added chunk by chunk into a float32 [V, d] buffer | the buffer times g, cast to W's dtype | recomputed chunk by chunk (`fused_path`) |
| `weight` | the same buffer in W's dtype (each chunk's float32 product added per vocabulary tile, rounded once) | the same | the same |
| `tiles` | no [V, d] buffer: each row's `N_COEF` gradient coefficients (Triton kernel) | d W by [row block, vocabulary tile] from recomputed logits, the coefficients and g | the same |

`WeightGradient` is that table for one call: the forward asks it for the row math's extra keywords and hands it
each chunk's gradient; the backward asks it to finish d W (None: recompute).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .plan import ChunkPlan
from .row_backends import check_tile_kernel
from .spec import N_COEF

# The lower-precision d-weight accumulator off CUDA adds each chunk's product per vocabulary tile of this many rows.
GRAD_WEIGHT_VOCAB_TILE = 4096


def new_buffer(plan: ChunkPlan, weight: Tensor) -> Tensor:
    """A zero accumulator for d weight: compute dtype, or the weight's dtype (modes "weight" and "tiles")."""
    dtype = weight.dtype if plan.grad_weight_mode != "float32" else plan.cdtype
    return torch.zeros(weight.shape, dtype=dtype, device=weight.device)


def add_product(plan: ChunkPlan, grad_weight: Tensor, grad: Tensor, h: Tensor) -> None:
    """grad_weight += grad^T h: in place for a compute-dtype accumulator; for a lower-precision one, in place
    when it is the matmul dtype (CUDA), else per vocabulary tile of GRAD_WEIGHT_VOCAB_TILE rows (a [tile, d]
    float32 product, added and rounded once)."""
    if grad_weight.dtype != plan.cdtype and grad_weight.dtype == plan.matmul_dtype:
        # cuBLAS adds the float32 product to the accumulator in float32 and rounds once: no [tile, d] temporary.
        torch.addmm(grad_weight, grad.T, h, out=grad_weight)
        return
    if grad_weight.dtype != plan.cdtype:
        for v0 in range(0, grad_weight.shape[0], GRAD_WEIGHT_VOCAB_TILE):
            tile = grad[:, v0 : v0 + GRAD_WEIGHT_VOCAB_TILE]
            grad_weight[v0 : v0 + tile.shape[1]].add_(plan.mm(tile.T, h))
        return
    if plan.matmul_dtype == plan.cdtype:
        grad_weight.addmm_(grad.T, h)
    else:
        torch.addmm(grad_weight, grad.T, h, out_dtype=plan.cdtype, out=grad_weight)


class WeightGradient:
    """The forward's part of d weight for one fused call, and how its backward finishes it (module table)."""

    def __init__(self, plan: ChunkPlan, weight: Tensor, n_valid: int) -> None:
        self.tiled = plan.grad_weight_mode == "tiles"
        # `tiles`: each valid row's gradient coefficients, kept for every backward (a second one forms d W again).
        self.coefficients = weight.new_empty((n_valid, N_COEF), dtype=torch.float32) if self.tiled else None
        # Otherwise the unit-upstream d W, consumed by the first backward that can rescale it.
        self.unit = None if self.tiled else new_buffer(plan, weight)

    def row_keywords(self, start: int, n: int) -> dict[str, Any]:
        """The row math's extra keywords for the chunk of valid rows [start, start + n)."""
        if self.coefficients is None:
            return {}
        return {"grad_coefficients": self.coefficients[start : start + n]}

    def add_chunk(self, plan: ChunkPlan, grad: Tensor, h: Tensor) -> None:
        if self.unit is not None:
            add_product(plan, self.unit, grad, h)

    def finish(
        self,
        plan: ChunkPlan,
        tensors: tuple[Tensor, Tensor, Tensor, Tensor],
        upstream: Tensor,
        uniform: bool,
    ) -> Tensor | None:
        """d W for the valid rows' `upstream` gradient (`tensors`: hidden, weight, labels, valid rows), or None
        when the caller must recompute it chunk by chunk."""
        hidden, weight, labels, valid = tensors
        if self.coefficients is not None:
            return tile_grad_weight(hidden, weight, labels, valid, upstream, self.coefficients, plan)
        unit = self.unit
        if unit is None or not uniform:
            return None
        # Rescale in place; the buffer is consumed (a second backward recomputes). By a Python float: a 0-dim CUDA
        # tensor would be rounded to a 16-bit accumulator's dtype first (bf16(1/n): up to 2^-9 off).
        self.unit = None
        if upstream.numel() and float(upstream[0]) != 1.0:
            unit.mul_(float(upstream[0]))
        return unit.to(weight.dtype)


def tile_grad_weight(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    valid: Tensor,
    upstream: Tensor,
    coefficients: Tensor,
    plan: ChunkPlan,
) -> Tensor:
    """d weight = sum_i g_i G_i^T h_i by [row block, vocabulary tile]: each tile's logits (EMO: similarities)
    recomputed, its gradient written over them from the forward's per-row coefficients, times the upstream
    gradient g, then added to the tile of d weight (float32 products, rounded once per row block)."""
    from .triton_rows import triton_tile_gradient

    check_tile_kernel(weight.device, plan.logits_dtype)
    w = plan.operand(weight)
    grad_weight = new_buffer(plan, weight)
    block, tile = plan.tile_shape(valid.numel(), weight.shape[1], weight.shape[0], weight.device)
    for start in range(0, valid.numel(), block):
        rows = valid[start : start + block]
        y, end = labels[rows], start + rows.numel()
        h = plan.operand(hidden[rows])
        coef, scale = coefficients[start:end], upstream[start:end].contiguous()
        cost_rows = None if plan.cost_embedding is None else plan.cost_embedding[y]  # once per block
        for v0 in range(0, weight.shape[0], tile):
            v1 = min(weight.shape[0], v0 + tile)
            sim = plan.similarity(y, slice(v0, v1), cost_rows)
            grad = triton_tile_gradient(
                plan.name, plan.params, plan.logits(h, w[v0:v1]), y, coef, scale, v0, **sim
            )
            add_product(plan, grad_weight[v0:v1], plan.operand(grad), h)
            grad = sim = None
    return grad_weight


__all__ = ["GRAD_WEIGHT_VOCAB_TILE", "WeightGradient", "add_product", "new_buffer", "tile_grad_weight"]
