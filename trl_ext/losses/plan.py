"""The plan of one chunked call: what it computes, in which dtypes, and in how much memory.

`make_plan` resolves a call's loss and parameters, picks the row math (`row_backends.select_row_math`), the chunk's
logit dtype and the d-weight mode from the `FusedSettings`, and sizes the chunks to the settings' memory budget.
The resulting `ChunkPlan` is immutable: the autograd Functions of the logits path (`logits_path.py`) and the fused
path (`fused_path.py`) read it in their forward and backward; per-token statistics travel in a separate holder.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .registry import resolve
from .row_backends import RowMath, check_kernel, select_row_math
from .rows import chunk_math
from .settings import ENV, FusedSettings
from .spec import BASE_STATS, ChunkResult
from .validation import (
    IGNORE_INDEX,
    check_chunk_size,
    check_reference,
    checked_cost_embedding,
    compute_dtype,
    cost_inverse_norms,
)


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


@dataclass(frozen=True)
class ChunkPlan:
    """Everything a chunked call needs besides the differentiable tensors."""

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

    def run_rows(
        self, z: Tensor, y: Tensor, rows: Tensor, *, want_grad: bool, want_stats: bool = False, **extra: Any
    ) -> ChunkResult:
        """The row math on one chunk: logits `z` of the valid rows `rows` (indices into the call's rows, for the
        reference model's), targets `y`; `extra`: the fused path's coefficient output."""
        return self.row_math(
            self.name,
            self.params,
            z,
            y,
            **self.similarity(y),
            want_grad=want_grad,
            want_stats=want_stats,
            **self.reference(rows),
            **extra,
        )

    def chunks(self, valid_rows: Tensor) -> Iterator[tuple[int, Tensor]]:
        for start in range(0, valid_rows.numel(), self.chunk_size):
            yield start, valid_rows[start : start + self.chunk_size]

    def new_stats(self, rows: int, device: torch.device) -> dict[str, Tensor]:
        """Zeroed per-token statistics for `rows` rows (none unless asked for)."""
        if not self.want_stats:
            return {}
        return {k: torch.zeros(rows, dtype=self.cdtype, device=device) for k in self.stat_keys}


def store_stats(stats: dict[str, Tensor], rows: Tensor, result: ChunkResult) -> None:
    for key, buf in stats.items():
        buf[rows] = getattr(result, key)


def make_plan(
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
) -> ChunkPlan:
    """The plan of one call (validated: the loss's parameters, the reference, the settings against the kernel)."""
    spec, resolved = resolve(name, params)
    reference = check_reference(name, spec.needs_reference, reference or {}, inputs, vocab_size)
    check_chunk_size(chunk_size)
    cdtype = compute_dtype(inputs.dtype)
    row_math = select_row_math(name, inputs.device, cdtype, settings.kernels)
    logits_dtype = cdtype
    if fused and settings.chunk_logits == "input" and inputs.dtype != cdtype:
        if row_math is chunk_math:
            raise ValueError(
                f"chunk_logits='input' (loss_chunk_logits, {ENV['chunk_logits']}) needs the Triton row kernel "
                f"({name!r} on {inputs.device.type} runs the PyTorch closed forms, which take float32 chunks); set it "
                "to 'float32'."
            )
        logits_dtype = inputs.dtype
        check_kernel(row_math, inputs.device, logits_dtype)
    grad_weight_mode = settings.grad_weight_accum if fused else "float32"  # the logits path has no d weight
    if grad_weight_mode == "tiles" and row_math is chunk_math:
        raise ValueError(
            f"grad_weight_accum='tiles' (loss_grad_weight_accum, {ENV['grad_weight_accum']}) needs the Triton row "
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
    return ChunkPlan(
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


def fp32_math(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run `fn` with autocast off: under mixed precision the chunk matmuls would otherwise drop to bf16/fp16."""

    @functools.wraps(fn)
    def wrapper(ctx: Any, first: Tensor, *args: Any) -> Any:
        with torch.autocast(first.device.type, enabled=False):
            return fn(ctx, first, *args)

    return wrapper


def valid_rows(labels: Tensor) -> Tensor:
    return (labels != IGNORE_INDEX).nonzero().view(-1)


__all__ = ["ChunkPlan", "auto_chunk_size", "fp32_math", "make_plan", "store_stats", "valid_rows"]
