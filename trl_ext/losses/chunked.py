"""Memory-efficient paths: chunked from logits, and fused from (hidden, lm_head weight).

Both run the closed-form row math (`rows.chunk_math`, or its Triton kernel on CUDA, see `row_backends.py`) on chunks
of *valid* rows (ignored rows cost nothing) in float32, so no more than one chunk of vocabulary-sized temporaries
exists at a time. On CUDA with 16-bit inputs the fused path's matmuls take 16-bit operands with float32 results
(accumulators, statistics and gradients stay float32).

* `token_loss` (logits given): the forward keeps no gradient; the backward recomputes each chunk's closed-form
  gradient and writes it, scaled by the per-token upstream gradient, into the logits' gradient.
* `fused_token_loss` (hidden, weight): logits are built chunk by chunk with one matmul and never held beyond a
  chunk. Gradients are computed in the forward (one logits matmul instead of two): d hidden for a unit upstream
  gradient is exact per row, so the backward only rescales it; d weight sums over rows, so it is rescaled when
  the upstream gradient is the same for every valid row (the usual `sum / num_items` reduction) and recomputed
  chunk by chunk otherwise. With `grad_weight_accum="tiles"` the forward keeps no d weight, only each row's
  gradient coefficients, and the backward forms d weight one vocabulary tile at a time from recomputed logits.

How they run (chunk budget, the chunk's logit dtype, the d-weight accumulator, the kernels) is a `FusedSettings`
(`settings.py`), given as `settings=` or read from the environment once at the entry point.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .registry import resolve
from .row_backends import RowMath, check_kernel, check_tile_kernel, select_row_math
from .rows import chunk_math
from .settings import ENV, FusedSettings
from .spec import BASE_STATS, N_COEF, TokenStats
from .validation import (
    IGNORE_INDEX,
    check_chunk_size,
    check_floating,
    check_labels,
    check_reference,
    checked_cost_embedding,
    compute_dtype,
    cost_inverse_norms,
)

# The settings' environment fallbacks, by their historical names (benchmarks and tests set them).
CHUNK_MEMORY_ENV = ENV["chunk_memory_mb"]
GRAD_WEIGHT_ACCUM_ENV = ENV["grad_weight_accum"]
CHUNK_LOGITS_ENV = ENV["chunk_logits"]
# The lower-precision d-weight accumulator off CUDA adds each chunk's product per vocabulary tile of this many rows.
GRAD_WEIGHT_VOCAB_TILE = 4096


def auto_chunk_size(
    vocab_size: int,
    dtype: torch.dtype,
    buffers: int,
    device: torch.device | None = None,
    settings: FusedSettings | None = None,
) -> int:
    """Rows per chunk so that `buffers` [rows, V] temporaries fit the chunk budget (`settings.chunk_memory_mb`;
    without settings the environment's, else 128 MiB, 512 MiB on CUDA)."""
    settings = FusedSettings.from_env() if settings is None else settings
    bytes_per_row = vocab_size * torch.finfo(dtype).bits // 8 * buffers
    return max(1, settings.budget_bytes(None if device is None else device.type) // bytes_per_row)


@dataclass
class _Plan:
    """Everything a chunked call needs besides the differentiable tensors; also carries the stats out."""

    name: str
    params: dict[str, Any]
    stat_keys: tuple[str, ...]  # the statistics the loss reports
    cdtype: torch.dtype
    chunk_size: int
    want_stats: bool
    cost_embedding: Tensor | None  # EMO: the raw cost embedding in the matmul dtype (no normalised copy) ...
    cost_inv_norm: Tensor | None  # ... and 1 / its row norms, applied to each chunk's similarity rows
    row_math: RowMath
    matmul_dtype: torch.dtype  # the matmul operands' dtype (float32 results either way)
    # The chunk's logits (and their gradient): the compute dtype, or the inputs' with chunk_logits="input".
    logits_dtype: torch.dtype
    grad_weight_mode: str  # one of GRAD_WEIGHT_ACCUM ("float32" on the logits path, which has no d weight)
    settings: FusedSettings
    # Anchored losses: the reference model's logits (logits path), or its hidden states and head (fused path).
    reference_logits: Tensor | None = None
    reference_hidden: Tensor | None = None
    reference_weight: Tensor | None = None  # in the matmul dtype
    grad_enabled: bool = field(default_factory=torch.is_grad_enabled)
    stats: dict[str, Tensor] = field(default_factory=dict)

    def operand(self, t: Tensor) -> Tensor:
        return t.to(self.matmul_dtype)

    def mm(self, a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
        """a @ b (operands in `matmul_dtype`) with a float32 (compute-dtype) result."""
        if self.matmul_dtype == self.cdtype:
            return torch.mm(a, b, out=out)
        return torch.mm(a, b, out_dtype=self.cdtype, out=out)

    def logits(self, h: Tensor, w: Tensor) -> Tensor:
        """h @ w^T in `logits_dtype`: a float32 product, rounded once when the logits are kept in a 16-bit dtype."""
        if self.logits_dtype == self.cdtype:
            return self.mm(h, w.T)
        if self.matmul_dtype == self.logits_dtype:
            return torch.mm(h, w.T)  # cuBLAS: float32 accumulation, one rounding to the output dtype
        return self.mm(h, w.T).to(self.logits_dtype)

    def grad_weight_buffer(self, weight: Tensor) -> Tensor:
        """A zero accumulator for d weight: compute dtype, or the weight's dtype (grad_weight_accum "weight" or
        "tiles")."""
        dtype = weight.dtype if self.grad_weight_mode != "float32" else self.cdtype
        return torch.zeros(weight.shape, dtype=dtype, device=weight.device)

    def tile_shape(self, n_rows: int, width: int, vocab: int, device: torch.device) -> tuple[int, int]:
        """(rows per block, vocabulary columns per tile) of the `tiles` backward within the chunk budget: a block
        holds its rows of h (EMO: and of the cost embedding), half the budget at most, and a [rows, tile] logits
        block (EMO: and its float32 similarity; a float32 block its 16-bit copy for the products)."""
        budget = self.settings.budget_bytes(device.type)
        per_row = width * self.matmul_dtype.itemsize * (2 if self.cost_embedding is not None else 1)
        rows = max(1, min(n_rows, budget // 2 // per_row))
        per_cell = self.logits_dtype.itemsize + (
            self.cdtype.itemsize if self.cost_embedding is not None else 0
        )
        per_cell += self.matmul_dtype.itemsize if self.matmul_dtype != self.logits_dtype else 0
        tile = max(1, (budget - rows * per_row) // (rows * per_cell))
        return rows, min(vocab, tile // 128 * 128 if tile >= 128 else tile)

    def add_grad_weight(self, grad_weight: Tensor, grad: Tensor, h: Tensor) -> None:
        """grad_weight += grad^T h: in place for a compute-dtype accumulator; for a lower-precision one, in place
        when it is the matmul dtype (CUDA), else per vocabulary tile of GRAD_WEIGHT_VOCAB_TILE rows (a [tile, d]
        float32 product, added and rounded once)."""
        if grad_weight.dtype != self.cdtype and grad_weight.dtype == self.matmul_dtype:
            # cuBLAS adds the float32 product to the accumulator in float32 and rounds once: no [tile, d] temporary.
            torch.addmm(grad_weight, grad.T, h, out=grad_weight)
            return
        if grad_weight.dtype != self.cdtype:
            for v0 in range(0, grad_weight.shape[0], GRAD_WEIGHT_VOCAB_TILE):
                tile = grad[:, v0 : v0 + GRAD_WEIGHT_VOCAB_TILE]
                grad_weight[v0 : v0 + tile.shape[1]].add_(self.mm(tile.T, h))
            return
        if self.matmul_dtype == self.cdtype:
            grad_weight.addmm_(grad.T, h)
        else:
            torch.addmm(grad_weight, grad.T, h, out_dtype=self.cdtype, out=grad_weight)

    def similarity(self, y: Tensor, cols: slice = slice(None), rows: Tensor | None = None) -> dict[str, Any]:
        """The row math's similarity keywords for labels y (none without a cost embedding), over the vocabulary
        columns `cols` (all by default); `rows`: the cost embedding's rows e_y, when the caller already gathered them."""
        if self.cost_embedding is None or self.cost_inv_norm is None:
            return {"similarity": None}
        # s_ij = cos(e_{y_i}, e_j) = (e_{y_i} . e_j) / (|e_{y_i}| |e_j|): one [n, V] matmul and the inverse norms;
        # the Triton kernel applies them as it reads the rows, the closed forms in place (no extra passes here).
        rows = self.cost_embedding[y] if rows is None else rows
        sim = self.mm(rows, self.cost_embedding[cols].T)
        return {"similarity": sim, "similarity_scales": (self.cost_inv_norm[y], self.cost_inv_norm[cols])}

    def reference(self, rows: Tensor) -> dict[str, Tensor]:
        """The row math's `reference=` keyword for these rows (a fresh compute-dtype chunk), or nothing."""
        if self.reference_logits is not None:
            return {"reference": self.reference_logits[rows].to(self.cdtype)}
        if self.reference_hidden is not None and self.reference_weight is not None:
            h = self.operand(self.reference_hidden[rows])
            return {"reference": self.mm(h, self.reference_weight.T)}
        return {}

    def chunks(self, valid_rows: Tensor):
        for start in range(0, valid_rows.numel(), self.chunk_size):
            yield start, valid_rows[start : start + self.chunk_size]

    def init_stats(self, rows: int, device: torch.device) -> None:
        if self.want_stats:
            self.stats = {k: torch.zeros(rows, dtype=self.cdtype, device=device) for k in self.stat_keys}

    def store_stats(self, rows: Tensor, result: Any) -> None:
        for key, buf in self.stats.items():
            buf[rows] = getattr(result, key)


def _plan(
    name: str,
    params: dict[str, Any],
    vocab_size: int,
    inputs: Tensor,
    chunk_size: int | None,
    want_stats: bool,
    matmul_dtype: torch.dtype | None = None,
    reference: dict[str, Tensor | None] | None = None,
    settings: FusedSettings = FusedSettings(),
    fused: bool = False,
) -> _Plan:
    spec, resolved = resolve(name, params)
    reference = check_reference(name, spec.needs_reference, reference or {}, inputs, vocab_size)
    check_chunk_size(chunk_size)
    cdtype = compute_dtype(inputs.dtype)
    row_math = select_row_math(name, inputs.device, cdtype, settings.kernels)
    logits_dtype = cdtype
    if fused and settings.chunk_logits == "input" and inputs.dtype != cdtype:
        if row_math is chunk_math:
            raise ValueError(
                f"chunk_logits='input' (loss_chunk_logits, {CHUNK_LOGITS_ENV}) needs the Triton row kernel ({name!r} "
                f"on {inputs.device.type} runs the PyTorch closed forms, which take float32 chunks); set it to "
                "'float32'."
            )
        logits_dtype = inputs.dtype
        check_kernel(row_math, inputs.device, logits_dtype)
    grad_weight_mode = settings.grad_weight_accum if fused else "float32"  # the logits path has no d weight
    if grad_weight_mode == "tiles" and row_math is chunk_math:
        raise ValueError(
            f"grad_weight_accum='tiles' (loss_grad_weight_accum, {GRAD_WEIGHT_ACCUM_ENV}) needs the Triton row "
            f"kernel ({name!r} on {inputs.device.type} runs the PyTorch closed forms); set it to 'float32' or 'weight'."
        )
    cost_embedding = cost_inv_norm = None
    if spec.needs_cost_embedding:
        raw = checked_cost_embedding(resolved.pop("cost_embedding"), vocab_size, inputs.device)
        cost_inv_norm = cost_inverse_norms(raw, cdtype)
        cost_embedding = raw.to(matmul_dtype or cdtype)  # no copy when it already has that dtype
    if chunk_size is None:
        # The torch closed forms keep ~3 (EMO 4) [rows, V] float32 buffers per chunk, the Triton kernel 1 (EMO 2):
        # a cost embedding adds the similarity rows (always float32). Counted in logits-dtype buffers.
        cost, in_place = cost_embedding is not None, row_math is not chunk_math
        similarity = cdtype.itemsize // logits_dtype.itemsize if cost else 0
        buffers = 1 + similarity if in_place else (4 if cost else 3)
        buffers += 2 if spec.needs_reference else 0  # the reference's logits and softmax
        chunk_size = auto_chunk_size(vocab_size, logits_dtype, buffers, inputs.device, settings)
    ref_weight = reference.get("reference_weight")
    return _Plan(
        name=name,
        params=resolved,
        stat_keys=BASE_STATS + spec.stats,
        cdtype=cdtype,
        chunk_size=chunk_size,
        want_stats=want_stats,
        cost_embedding=cost_embedding,
        cost_inv_norm=cost_inv_norm,
        row_math=row_math,
        matmul_dtype=matmul_dtype or cdtype,
        logits_dtype=logits_dtype,
        grad_weight_mode=grad_weight_mode,
        settings=settings,
        reference_logits=reference.get("reference_logits"),
        reference_hidden=reference.get("reference_hidden"),
        reference_weight=None if ref_weight is None else ref_weight.to(matmul_dtype or cdtype),
    )


def _matmul_dtype(hidden: Tensor) -> torch.dtype | None:
    """On CUDA, 16-bit products stay 16-bit with float32 outputs: no float32 copy of the head, tensor-core speed.

    Elsewhere (and for 32/64-bit inputs, or a torch without `mm(..., out_dtype=)`, added in 2.8) None: the
    operands are converted to the compute dtype.
    """
    mixed_mm = hasattr(torch.ops.aten.mm, "dtype") and hasattr(torch.ops.aten.addmm, "dtype_out")
    if mixed_mm and hidden.is_cuda and hidden.dtype in (torch.float16, torch.bfloat16):
        return hidden.dtype
    return None


def _fp32_math(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run `fn` with autocast off: under mixed precision the chunk matmuls would otherwise drop to bf16/fp16."""

    @functools.wraps(fn)
    def wrapper(ctx: Any, first: Tensor, *args: Any) -> Any:
        with torch.autocast(first.device.type, enabled=False):
            return fn(ctx, first, *args)

    return wrapper


def _valid_rows(labels: Tensor) -> Tensor:
    return (labels != IGNORE_INDEX).nonzero().view(-1)


class _ChunkedFromLogits(torch.autograd.Function):
    @staticmethod
    @_fp32_math
    def forward(ctx: Any, logits: Tensor, labels: Tensor, plan: _Plan) -> Tensor:
        valid = _valid_rows(labels)
        loss = torch.zeros(logits.shape[0], dtype=plan.cdtype, device=logits.device)
        plan.init_stats(logits.shape[0], logits.device)
        for _, rows in plan.chunks(valid):
            y = labels[rows]
            z = logits[rows].to(plan.cdtype)
            result = plan.row_math(
                plan.name,
                plan.params,
                z,
                y,
                **plan.similarity(y),
                want_grad=False,
                want_stats=plan.want_stats,
                **plan.reference(rows),
            )
            loss[rows] = result.loss
            plan.store_stats(rows, result)
        ctx.save_for_backward(logits, labels, valid)
        ctx.plan = plan
        return loss

    @staticmethod
    @_fp32_math
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, None, None]:
        logits, labels, valid = ctx.saved_tensors
        plan: _Plan = ctx.plan
        grad_logits = torch.zeros_like(logits)
        upstream = grad_loss.to(plan.cdtype)
        for _, rows in plan.chunks(valid):
            y = labels[rows]
            z = logits[rows].to(plan.cdtype)
            grad = plan.row_math(
                plan.name, plan.params, z, y, **plan.similarity(y), want_grad=True, want_stats=False,
                **plan.reference(rows),
            ).grad  # fmt: skip
            assert grad is not None
            grad_logits[rows] = grad.mul_(upstream[rows].unsqueeze(1)).to(logits.dtype)
        return grad_logits, None, None


class _FusedLinear(torch.autograd.Function):
    @staticmethod
    @_fp32_math
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, labels: Tensor, plan: _Plan) -> Tensor:
        # Inside forward grad mode is off and needs_input_grad ignores an outer no_grad(): ask the plan.
        need_hidden = plan.grad_enabled and ctx.needs_input_grad[0]
        need_weight = plan.grad_enabled and ctx.needs_input_grad[1]
        valid = _valid_rows(labels)
        w = plan.operand(weight)
        loss = torch.zeros(hidden.shape[0], dtype=plan.cdtype, device=hidden.device)
        plan.init_stats(hidden.shape[0], hidden.device)
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
        # `tiles`: no d weight here; each row's gradient coefficients, for the backward's tiles.
        tiles = need_weight and plan.grad_weight_mode == "tiles"
        coefficients = hidden.new_empty((valid.numel(), N_COEF), dtype=torch.float32) if tiles else None
        grad_weight_unit = plan.grad_weight_buffer(weight) if need_weight and not tiles else None
        for start, rows in plan.chunks(valid):
            y = labels[rows]
            h = plan.operand(hidden[rows])
            coef = (
                {}
                if coefficients is None
                else {"grad_coefficients": coefficients[start : start + rows.numel()]}
            )
            result = plan.row_math(
                plan.name,
                plan.params,
                plan.logits(h, w),
                y,
                **plan.similarity(y),
                want_grad=need_hidden or need_weight,
                want_stats=plan.want_stats,
                **plan.reference(rows),
                **coef,
            )
            loss[rows] = result.loss
            plan.store_stats(rows, result)
            grad = None if result.grad is None else plan.operand(result.grad)
            if grad is not None and grad_hidden_unit is not None:
                if full_hidden_grad:
                    grad_hidden_unit[rows] = plan.mm(grad, w).to(hidden.dtype)
                else:
                    plan.mm(grad, w, out=grad_hidden_unit[start : start + rows.numel()])
            if grad is not None and grad_weight_unit is not None:
                plan.add_grad_weight(grad_weight_unit, grad, h)
            # Free this chunk's [rows, V] buffers before the next chunk's logits are allocated.
            result = grad = None
        ctx.save_for_backward(hidden, weight, labels, valid)
        ctx.plan = plan
        ctx.grad_hidden_unit = grad_hidden_unit
        ctx.full_hidden_grad = full_hidden_grad
        ctx.grad_weight_unit = grad_weight_unit
        ctx.coefficients = coefficients
        return loss

    @staticmethod
    @_fp32_math
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        hidden, weight, labels, valid = ctx.saved_tensors
        plan: _Plan = ctx.plan
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

        if need_weight and ctx.coefficients is not None:  # kept: a second backward forms d weight again
            grad_weight = _tile_grad_weight(hidden, weight, labels, valid, upstream, ctx.coefficients, plan)
        unit = ctx.grad_weight_unit
        if need_weight and unit is not None and uniform:
            # Rescale in place; the buffer is consumed (a second backward recomputes below). By a Python float: a
            # 0-dim CUDA tensor would be rounded to a 16-bit accumulator's dtype first (bf16(1/n): up to 2^-9 off).
            ctx.grad_weight_unit = None
            if upstream.numel() and float(upstream[0]) != 1.0:
                unit.mul_(float(upstream[0]))
            grad_weight = unit.to(weight.dtype)

        redo_hidden, redo_weight = need_hidden and grad_hidden is None, need_weight and grad_weight is None
        if redo_hidden or redo_weight:
            again = _recompute_grads(hidden, weight, labels, valid, upstream, plan, redo_hidden, redo_weight)
            grad_hidden = again[0] if redo_hidden else grad_hidden
            grad_weight = again[1].to(weight.dtype) if redo_weight else grad_weight
        return grad_hidden, grad_weight, None, None


def _recompute_grads(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    valid: Tensor,
    upstream: Tensor,
    plan: _Plan,
    need_hidden: bool,
    need_weight: bool,
) -> tuple[Tensor | None, Tensor | None]:
    """d hidden (row i: g_i G_i W) and/or d weight (sum_i g_i G_i^T h_i), chunk by chunk, for a per-token upstream
    gradient g that differs between rows, or for a second backward after the forward's buffers were consumed."""
    w = plan.operand(weight)
    grad_hidden = torch.zeros_like(hidden) if need_hidden else None
    grad_weight = plan.grad_weight_buffer(weight) if need_weight else None
    for start, rows in plan.chunks(valid):
        y = labels[rows]
        h = plan.operand(hidden[rows])
        grad = plan.row_math(
            plan.name, plan.params, plan.logits(h, w), y, **plan.similarity(y), want_grad=True, want_stats=False,
            **plan.reference(rows),
        ).grad  # fmt: skip
        assert grad is not None
        grad = plan.operand(grad.mul_(upstream[start : start + rows.numel()].unsqueeze(1)))
        if grad_hidden is not None:
            grad_hidden[rows] = plan.mm(grad, w).to(hidden.dtype)
        if grad_weight is not None:
            plan.add_grad_weight(grad_weight, grad, h)
        grad = None
    return grad_hidden, grad_weight


def _tile_grad_weight(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    valid: Tensor,
    upstream: Tensor,
    coefficients: Tensor,
    plan: _Plan,
) -> Tensor:
    """d weight = sum_i g_i G_i^T h_i by [row block, vocabulary tile]: each tile's logits (EMO: similarities)
    recomputed, its gradient written over them from the forward's per-row coefficients, times the upstream
    gradient g, then added to the tile of d weight (float32 products, rounded once per row block)."""
    from .triton_rows import triton_tile_gradient

    check_tile_kernel(weight.device, plan.logits_dtype)
    w = plan.operand(weight)
    grad_weight = plan.grad_weight_buffer(weight)
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
            plan.add_grad_weight(grad_weight[v0:v1], plan.operand(grad), h)
            grad = sim = None
    return grad_weight


def _finish(loss: Tensor, plan: _Plan, return_stats: bool) -> Tensor | tuple[Tensor, TokenStats]:
    if not return_stats:
        return loss
    return loss, TokenStats(**plan.stats)


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
    plan = _plan(
        name,
        params,
        logits.shape[1],
        logits,
        chunk_size,
        return_stats,
        reference=reference,
        settings=settings,
    )
    loss = _ChunkedFromLogits.apply(logits, labels.long(), plan)
    return _finish(loss, plan, return_stats)


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
    reference = {"reference_hidden": reference_hidden, "reference_weight": reference_weight}
    plan = _plan(
        name,
        params,
        weight.shape[0],
        hidden,
        chunk_size,
        return_stats,
        _matmul_dtype(hidden),
        reference,
        settings=settings,
        fused=True,
    )
    loss = _FusedLinear.apply(hidden, weight, labels.long(), plan)
    return _finish(loss, plan, return_stats)
