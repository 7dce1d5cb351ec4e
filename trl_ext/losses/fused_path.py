"""The fused path: a per-token loss from (hidden [N, d], LM head weight [V, d]) without the [N, V] logits.

Logits are built chunk by chunk with one matmul and never held beyond a chunk. Gradients are computed in the forward
(one logits matmul instead of two): d hidden for a unit upstream gradient is exact per row, so the backward only
rescales it; d weight is the `grad_weight` module's business (rescaled, recomputed, or formed by vocabulary tile,
by the settings' `grad_weight_accum`). On CUDA with 16-bit inputs the matmuls take 16-bit operands with float32
results (accumulators, statistics and gradients stay float32).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .grad_weight import WeightGradient, add_product, new_buffer
from .plan import ChunkPlan, fp32_math, make_plan, store_stats, valid_rows
from .settings import FusedSettings
from .spec import TokenStats
from .validation import check_floating, check_labels


class _FusedLinear(torch.autograd.Function):
    @staticmethod
    @fp32_math
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, labels: Tensor, plan: ChunkPlan, stats: dict[str, Tensor]
    ) -> Tensor:
        # Inside forward grad mode is off and needs_input_grad ignores an outer no_grad(): ask the plan.
        need_hidden = plan.grad_enabled and ctx.needs_input_grad[0]
        need_weight = plan.grad_enabled and ctx.needs_input_grad[1]
        valid = valid_rows(labels)
        w = plan.operand(weight)
        loss = torch.zeros(hidden.shape[0], dtype=plan.cdtype, device=hidden.device)
        stats.update(plan.new_stats(hidden.shape[0], hidden.device))
        # d hidden for a unit upstream gradient: the valid rows in float32, or, with input-dtype logits, the whole
        # gradient in the hidden's dtype (rounded once per element; the backward rescales it in place).
        full_hidden_grad = plan.logits_dtype != plan.cdtype
        grad_hidden_unit = None
        if need_hidden:
            grad_hidden_unit = (
                torch.zeros_like(hidden)
                if full_hidden_grad
                else hidden.new_empty((valid.numel(), hidden.shape[1]), dtype=plan.cdtype)
            )
        weight_gradient = WeightGradient(plan, weight, valid.numel()) if need_weight else None
        for start, rows in plan.chunks(valid):
            y = labels[rows]
            h = plan.operand(hidden[rows])
            result = plan.run_rows(
                plan.logits(h, w),
                y,
                rows,
                want_grad=need_hidden or need_weight,
                want_stats=plan.want_stats,
                **(weight_gradient.row_keywords(start, rows.numel()) if weight_gradient else {}),
            )
            loss[rows] = result.loss
            store_stats(stats, rows, result)
            grad = None if result.grad is None else plan.operand(result.grad)
            if grad is not None and grad_hidden_unit is not None:
                if full_hidden_grad:
                    grad_hidden_unit[rows] = plan.mm(grad, w).to(hidden.dtype)
                else:
                    plan.mm(grad, w, out=grad_hidden_unit[start : start + rows.numel()])
            if grad is not None and weight_gradient is not None:
                weight_gradient.add_chunk(plan, grad, h)
            # Free this chunk's [rows, V] buffers before the next chunk's logits are allocated.
            result = grad = None
        ctx.save_for_backward(hidden, weight, labels, valid)
        ctx.plan = plan
        ctx.grad_hidden_unit = grad_hidden_unit
        ctx.full_hidden_grad = full_hidden_grad
        ctx.weight_gradient = weight_gradient
        return loss

    @staticmethod
    @fp32_math
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        hidden, weight, labels, valid = ctx.saved_tensors
        plan: ChunkPlan = ctx.plan
        upstream = grad_loss[valid].to(plan.cdtype)
        uniform = upstream.numel() == 0 or bool((upstream == upstream[0]).all())
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = grad_weight = None

        unit = ctx.grad_hidden_unit
        if need_hidden and unit is not None:
            # Consumed (freed before d weight is converted); a second backward recomputes it.
            ctx.grad_hidden_unit = None
            if ctx.full_hidden_grad:
                # The whole gradient in the hidden's dtype: rescaled in place (formed in float32, rounded once).
                if not uniform:
                    scale = torch.zeros(hidden.shape[0], dtype=plan.cdtype, device=hidden.device)
                    unit.mul_(scale.index_copy_(0, valid, upstream).unsqueeze(1))
                elif upstream.numel() and float(upstream[0]) != 1.0:
                    unit.mul_(float(upstream[0]))
                grad_hidden = unit
            else:
                grad_hidden = torch.zeros_like(hidden)
                grad_hidden[valid] = (unit * upstream.unsqueeze(1)).to(hidden.dtype)

        if need_weight and ctx.weight_gradient is not None:
            grad_weight = ctx.weight_gradient.finish(plan, (hidden, weight, labels, valid), upstream, uniform)

        redo_hidden, redo_weight = need_hidden and grad_hidden is None, need_weight and grad_weight is None
        if redo_hidden or redo_weight:
            again = _recompute_grads(hidden, weight, labels, valid, upstream, plan, redo_hidden, redo_weight)
            grad_hidden = again[0] if redo_hidden else grad_hidden
            grad_weight = again[1].to(weight.dtype) if redo_weight else grad_weight
        return grad_hidden, grad_weight, None, None, None


def _recompute_grads(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    valid: Tensor,
    upstream: Tensor,
    plan: ChunkPlan,
    need_hidden: bool,
    need_weight: bool,
) -> tuple[Tensor | None, Tensor | None]:
    """d hidden (row i: g_i G_i W) and/or d weight (sum_i g_i G_i^T h_i), chunk by chunk, for a per-token upstream
    gradient g that differs between rows, or for a second backward after the forward's buffers were consumed."""
    w = plan.operand(weight)
    grad_hidden = torch.zeros_like(hidden) if need_hidden else None
    grad_weight = new_buffer(plan, weight) if need_weight else None
    for start, rows in plan.chunks(valid):
        h = plan.operand(hidden[rows])
        grad = plan.run_rows(plan.logits(h, w), labels[rows], rows, want_grad=True).grad
        assert grad is not None
        grad = plan.operand(grad.mul_(upstream[start : start + rows.numel()].unsqueeze(1)))
        if grad_hidden is not None:
            grad_hidden[rows] = plan.mm(grad, w).to(hidden.dtype)
        if grad_weight is not None:
            add_product(plan, grad_weight, grad, h)
        grad = None
    return grad_hidden, grad_weight


def _matmul_dtype(hidden: Tensor) -> torch.dtype | None:
    """On CUDA, 16-bit products stay 16-bit with float32 outputs: no float32 copy of the head, tensor-core speed.

    Elsewhere (and for 32/64-bit inputs, or a torch without `mm(..., out_dtype=)`, added in 2.8) None: the
    operands are converted to the compute dtype.
    """
    mixed_mm = hasattr(torch.ops.aten.mm, "dtype") and hasattr(torch.ops.aten.addmm, "dtype_out")
    if mixed_mm and hidden.is_cuda and hidden.dtype in (torch.float16, torch.bfloat16):
        return hidden.dtype
    return None


def fused_token_loss(
    name: str,
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    chunk_size: int | None = None,
    return_stats: bool = False,
    reference_hidden: Tensor | None = None,
    reference_weight: Tensor | None = None,
    settings: FusedSettings | None = None,
    **params: Any,
) -> Tensor | tuple[Tensor, TokenStats]:
    """Per-token loss `name` of the logits `hidden @ weight.T` without materialising them.

    `hidden` [N, d] (final hidden states, rows aligned with `labels` [N]), `weight` [V, d] (the LM head).
    Differentiable w.r.t. `hidden` and `weight`; same values and gradients as `token_loss` on the full logits.
    Anchored losses: `reference_hidden` [N, d_ref] and `reference_weight` [V, d_ref], the frozen reference model's
    final hidden states and head, whose logits are built chunk by chunk like the policy's (never differentiated).
    `settings`: how the chunks run (`FusedSettings`: chunk budget, logit dtype, d-weight accumulator, kernels;
    None: from the environment).
    """
    settings = FusedSettings.from_env() if settings is None else settings
    check_floating("hidden", hidden, 2)
    check_floating("weight", weight, 2)
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden has width {hidden.shape[1]} but weight is {tuple(weight.shape)}; weight must be [vocab_size, "
            f"{hidden.shape[1]}] (the LM head's weight, not its transpose)."
        )
    if hidden.dtype != weight.dtype or hidden.device != weight.device:
        raise ValueError(
            f"hidden ({hidden.dtype}, {hidden.device}) and weight ({weight.dtype}, {weight.device}) must share "
            "dtype and device."
        )
    check_labels(labels, hidden.shape[0], weight.shape[0], hidden.device)
    plan = make_plan(
        name,
        params,
        weight.shape[0],
        hidden,
        chunk_size,
        return_stats,
        _matmul_dtype(hidden),
        {"reference_hidden": reference_hidden, "reference_weight": reference_weight},
        settings=settings,
        fused=True,
    )
    stats: dict[str, Tensor] = {}
    loss = _FusedLinear.apply(hidden, weight, labels.long(), plan, stats)
    return (loss, TokenStats(**stats)) if return_stats else loss


__all__ = ["fused_token_loss"]
