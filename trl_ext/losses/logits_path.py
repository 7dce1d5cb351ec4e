"""The logits path: a per-token loss from given logits [N, V], in row chunks.

The forward keeps no gradient; the backward recomputes each chunk's closed-form gradient and writes it, scaled by
the per-token upstream gradient, into the logits' gradient. Only one chunk of [rows, V] temporaries exists at a time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .plan import ChunkPlan, fp32_math, make_plan, store_stats, valid_rows
from .settings import FusedSettings
from .spec import TokenStats
from .validation import check_floating, check_labels


class _ChunkedFromLogits(torch.autograd.Function):
    @staticmethod
    @fp32_math
    def forward(
        ctx: Any, logits: Tensor, labels: Tensor, plan: ChunkPlan, stats: dict[str, Tensor]
    ) -> Tensor:
        valid = valid_rows(labels)
        loss = torch.zeros(logits.shape[0], dtype=plan.cdtype, device=logits.device)
        stats.update(plan.new_stats(logits.shape[0], logits.device))
        for _, rows in plan.chunks(valid):
            z = logits[rows].to(plan.cdtype)
            result = plan.run_rows(z, labels[rows], rows, want_grad=False, want_stats=plan.want_stats)
            loss[rows] = result.loss
            store_stats(stats, rows, result)
        ctx.save_for_backward(logits, labels, valid)
        ctx.plan = plan
        return loss

    @staticmethod
    @fp32_math
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, None, None, None]:
        logits, labels, valid = ctx.saved_tensors
        plan: ChunkPlan = ctx.plan
        grad_logits = torch.zeros_like(logits)
        upstream = grad_loss.to(plan.cdtype)
        for _, rows in plan.chunks(valid):
            z = logits[rows].to(plan.cdtype)
            grad = plan.run_rows(z, labels[rows], rows, want_grad=True).grad
            assert grad is not None
            grad_logits[rows] = grad.mul_(upstream[rows].unsqueeze(1)).to(logits.dtype)
        return grad_logits, None, None, None


def token_loss(
    name: str,
    logits: Tensor,
    labels: Tensor,
    *,
    chunk_size: int | None = None,
    return_stats: bool = False,
    reference_logits: Tensor | None = None,
    settings: FusedSettings | None = None,
    **params: Any,
) -> Tensor | tuple[Tensor, TokenStats]:
    """Per-token loss `name` of `logits` [N, V] against aligned `labels` [N] (-100 = ignored -> 0).

    Chunked over rows; differentiable w.r.t. `logits`. Returns float32 (float64 for float64 logits); with
    `return_stats=True` also a `TokenStats` of detached per-token CE, entropy, top-1 correctness (and DEMD for EMO,
    the KL for the anchored losses). `reference_logits` [N, V]: the frozen reference model's logits of the same
    rows (anchored losses only; never differentiated). `settings`: how the chunks run (`FusedSettings`; None: from
    the environment); its chunk budget and kernels apply here.
    """
    settings = FusedSettings.from_env() if settings is None else settings
    check_floating("logits", logits, 2)
    check_labels(labels, logits.shape[0], logits.shape[1], logits.device)
    reference = {"reference_logits": reference_logits}
    plan = make_plan(
        name,
        params,
        logits.shape[1],
        logits,
        chunk_size,
        return_stats,
        reference=reference,
        settings=settings,
    )
    stats: dict[str, Tensor] = {}
    loss = _ChunkedFromLogits.apply(logits, labels.long(), plan, stats)
    return (loss, TokenStats(**stats)) if return_stats else loss


__all__ = ["token_loss"]
