"""A measurement prototype, not a library path: fused cross-entropy whose weight gradient is formed by vocabulary
tile in the backward (the tile's logits recomputed), instead of accumulated chunk by chunk in the forward.

Why (docs/losses.md "Liger's memory at our speed"): within Liger's memory a row chunk holds about 256 rows of a
128k vocabulary, and every chunk adds one read and one write of the whole [V, d] weight gradient (26 ms of Liger's
54 at Llama-3-8B's head). Here the forward keeps only d hidden and each row's log-sum-exp; the backward rebuilds
the logits one [rows, tile] block at a time and writes each tile of d weight with one product over its rows (no
pass over the whole gradient per chunk). It pays one more logits product. Only `ce`, and only to measure: the
`dw_tiles` row of bench_fused_memory.py decides on a GPU whether the Triton row kernel should learn this.

Numerics: logits and their gradient in the inputs' dtype (each rounded once, as with DISTMATCH_CHUNK_LOGITS=input
and in Liger), d weight accumulated by cuBLAS in float32 and rounded once per row block of ROW_BLOCK valid rows.
Elsewhere (CPU dry runs) the same steps in float32.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

IGNORE_INDEX = -100
ROW_BLOCK = 4096  # the backward's rows per block: one d-weight rounding per block


@functools.cache  # one kernel object per process: Triton compiles (or loads) it once
def _triton_tile_grad():
    """The tile kernel: g = (exp(z - lse) - [col == y]) * scale, in float32 registers, written over z (one
    rounding). None where Triton cannot run (a CPU without TRITON_INTERPRET=1)."""
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def kernel(z_ptr, lse_ptr, scale_ptr, y_ptr, cols, z_stride, col0, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < cols
        z = tl.load(z_ptr + row * z_stride + offs, mask=mask, other=0.0).to(tl.float32)
        p = tl.exp(z - tl.load(lse_ptr + row))
        g = tl.where(offs + col0 == tl.load(y_ptr + row), p - 1.0, p) * tl.load(scale_ptr + row)
        tl.store(z_ptr + row * z_stride + offs, g, mask=mask)

    def run(z: Tensor, lse: Tensor, scale: Tensor, y: Tensor, col0: int) -> None:
        block = 1024
        kernel[(z.shape[0], triton.cdiv(z.shape[1], block))](
            z, lse, scale, y, z.shape[1], z.stride(0), col0, BLOCK=block
        )

    return run


def _torch_tile_grad(z: Tensor, lse: Tensor, scale: Tensor, y: Tensor, col0: int) -> None:
    """The same in float32 PyTorch (a [rows, tile] float32 temporary: for CPU dry runs)."""
    g = (z.float() - lse[:, None]).exp_()
    at = ((y >= col0) & (y < col0 + z.shape[1])).nonzero().view(-1)
    g[at, y[at] - col0] -= 1.0
    z.copy_(g.mul_(scale[:, None]))


def _sizes(n: int, vocab: int, d: int, item: int, budget: int) -> tuple[int, int]:
    """(rows per forward chunk, vocabulary columns per backward tile) within `budget` bytes of temporaries: a
    forward chunk holds its logits and, per row, its h and d h; a backward block its h and a [rows, tile] block."""
    chunk = max(1, budget // (vocab * item + 2 * d * item))
    block = max(1, min(n, ROW_BLOCK))
    tile = max(128, (budget - block * d * item) // (block * item) // 128 * 128)
    return chunk, tile


def _forward_rows(z: Tensor, y: Tensor) -> Tensor:
    """Per-row CE of the chunk's logits z, whose gradient (unit upstream) it writes over z: the production Triton
    row kernel where it runs, else float32 PyTorch."""
    if _triton_tile_grad() is not None:
        from trl_ext.losses.triton_rows import triton_chunk_math

        return triton_chunk_math("ce", {}, z, y, None, want_grad=True, want_stats=False).loss
    lse = torch.logsumexp(z.float(), dim=1)
    loss = lse - z.gather(1, y[:, None]).squeeze(1).float()
    _torch_tile_grad(z, lse, torch.ones_like(lse), y, 0)
    return loss


def _is_cuda16(t: Tensor) -> bool:
    return t.is_cuda and t.dtype in (torch.bfloat16, torch.float16)


class DWTilesCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, labels: Tensor, budget_mb: float) -> Tensor:
        cuda16 = _is_cuda16(hidden)
        w = weight if cuda16 else weight.float()
        valid = (labels != IGNORE_INDEX).nonzero().view(-1)
        item = hidden.element_size() if cuda16 else 4
        chunk, tile = _sizes(valid.numel(), weight.shape[0], weight.shape[1], item, int(budget_mb * 2**20))
        loss = torch.zeros(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty(valid.numel(), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.zeros_like(hidden)
        for start in range(0, valid.numel(), chunk):
            rows = valid[start : start + chunk]
            y = labels[rows]
            h = hidden[rows] if cuda16 else hidden[rows].float()
            z = h @ w.T  # cuBLAS: float32 accumulation, one rounding to the inputs' dtype
            z_y = z.gather(1, y[:, None]).squeeze(1).float()
            rows_loss = _forward_rows(z, y)  # z now holds the gradient
            loss[rows] = rows_loss
            lse[start : start + rows.numel()] = rows_loss + z_y
            grad_hidden[rows] = (z @ w).to(hidden.dtype)
            z = h = None
        ctx.save_for_backward(hidden, weight, labels, valid, lse)
        ctx.grad_hidden, ctx.tile = grad_hidden, tile
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, Tensor, None, None]:
        hidden, weight, labels, valid, lse = ctx.saved_tensors
        cuda16 = _is_cuda16(hidden)
        w = weight if cuda16 else weight.float()
        upstream = grad_loss[valid].float()
        grad_hidden, ctx.grad_hidden = ctx.grad_hidden, None
        scale = torch.zeros(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        grad_hidden.mul_(scale.index_copy_(0, valid, upstream)[:, None])  # in place: no float32 copy
        grad_weight = torch.zeros_like(weight)
        tile_grad = _triton_tile_grad() or _torch_tile_grad
        for start in range(0, valid.numel(), ROW_BLOCK):
            rows = valid[start : start + ROW_BLOCK]
            y, lse_b, up_b = (
                labels[rows],
                lse[start : start + rows.numel()],
                upstream[start : start + rows.numel()],
            )
            h = hidden[rows] if cuda16 else hidden[rows].float()
            for v0 in range(0, weight.shape[0], ctx.tile):
                w_t = w[v0 : v0 + ctx.tile]
                g_t = grad_weight[v0 : v0 + w_t.shape[0]]
                z = h @ w_t.T
                tile_grad(z, lse_b, up_b, y, v0)
                if cuda16:  # cuBLAS adds the float32 product to the tile and rounds once
                    torch.addmm(g_t, z.T, h, out=g_t)
                else:
                    g_t += (z.T @ h).to(weight.dtype)
                z = None
        return grad_hidden, grad_weight, None, None


def dw_tiles_ce(hidden: Tensor, weight: Tensor, labels: Tensor, budget_mb: float = 60.0) -> Tensor:
    """Per-token CE of hidden @ weight.T (0 on ignored rows), d weight by vocabulary tile. `budget_mb` bounds the
    temporaries (60 MiB: at Llama-3-8B's head in bf16, 230-row forward chunks and [4096, 3584] backward blocks, below
    the 63 MiB Liger's fused linear CE takes beside the gradients)."""
    return DWTilesCE.apply(hidden, weight, labels, budget_mb)
