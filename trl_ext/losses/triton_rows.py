"""Triton row kernel: the closed-form math of `rows.chunk_math` for ce, gem_linear, gem_ls and emo, one program
per row of a chunk of fp32 logits.

Same contract as `rows.chunk_math` (so `chunked.py` drives both): the chunk's logits ``z`` [n, V] are overwritten
in place with dL/dz (for a unit upstream gradient) when a gradient is wanted, and the per-token loss and the
logging statistics come back as [n] vectors. The matrix products around it (logits = h W^T, dh = G W,
dW += G^T h, EMO's similarity) stay cuBLAS calls made by the caller.

Two passes over the row, tile by tile (BLOCK columns, everything in fp32):

1. online statistics: running max and sum of exp for softmax(z) (CE, entropy, EMO) and for softmax(z / beta)
   (GEM); the sums weighted by z (GEM: by z - z_y), by GEM-LS's detached sigmoid weight, or by EMO's
   similarity; the argmax.
2. the gradient, written over the logits; the -1_y term is applied inside its tile (no store-then-load of the
   same address across threads), in fp32 before anything is rounded.

For `DISTMATCH_GRAD_WEIGHT_ACCUM=tiles` (chunked.py) pass 1 also stores each row's N_COEF gradient coefficients
(mode COEF_OUT), and a later call runs pass 2 alone over a tile of vocabulary columns from them, times a per-row scale
(mode GRAD_ONLY, `triton_tile_gradient`): the same gradient, column by column, without the row's other columns.
The loss ids, the modes and the coefficient slots are named once, in `kernel_contract.py`.

Notation as in `rows.py`: p = softmax(z), q = softmax(z / beta), s_j = cos(e_y, e_j), l = -log p_y.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from .kernel_contract import LOSS_IDS, N_COEF, Coef, Mode
from .objectives.emo import EMO_EPS, target_coefficient
from .registry import LOSSES, TRITON_LOSSES
from .spec import ChunkResult

if set(LOSS_IDS) != set(TRITON_LOSSES):  # pragma: no cover - a spec claims a kernel that does not exist
    raise ImportError(f"the Triton row kernel implements {sorted(LOSS_IDS)}, the specs say {TRITON_LOSSES}")
CHUNK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_BLOCK = 8192  # columns per tile; a row of V = 128256 takes 16 tiles per pass
EMO_EPS_ = tl.constexpr(EMO_EPS)

# The contract's ints as the constexpr globals the kernel can read (kernel_contract.py says what each means).
LOSS_CE_ = tl.constexpr(LOSS_IDS["ce"])
LOSS_GEM_LINEAR_ = tl.constexpr(LOSS_IDS["gem_linear"])
LOSS_GEM_LS_ = tl.constexpr(LOSS_IDS["gem_ls"])
LOSS_EMO_ = tl.constexpr(LOSS_IDS["emo"])
MODE_COEF_OUT_ = tl.constexpr(int(Mode.COEF_OUT))
MODE_GRAD_ONLY_ = tl.constexpr(int(Mode.GRAD_ONLY))
N_COEF_ = tl.constexpr(N_COEF)
COEF_LSE_ = tl.constexpr(int(Coef.LSE))
COEF_CE_WEIGHT_ = tl.constexpr(int(Coef.CE_WEIGHT))
COEF_DEMD_WEIGHT_ = tl.constexpr(int(Coef.DEMD_WEIGHT))
COEF_S_MEAN_ = tl.constexpr(int(Coef.S_MEAN))
COEF_MB_ = tl.constexpr(int(Coef.MB))
COEF_SUM_Q_ = tl.constexpr(int(Coef.SUM_Q))
COEF_TOTAL_R_ = tl.constexpr(int(Coef.TOTAL_R))
COEF_Z_Y_ = tl.constexpr(int(Coef.Z_Y))


@triton.jit
def _online_add(m, total, tile_values, mask):
    """Fold one tile into a running (max, sum of exp(x - max)); returns the new pair and the tile's exp(x - max)."""
    new_m = tl.maximum(m, tl.max(tl.where(mask, tile_values, float("-inf")), axis=0))
    e = tl.where(mask, tl.exp(tile_values - new_m), 0.0)
    return new_m, total * tl.exp(m - new_m) + tl.sum(e, axis=0), e, tl.exp(m - new_m)


@triton.jit
def _distmatch_row_kernel(
    z_ptr,
    sim_ptr,
    sim_row_scale_ptr,  # EMO: s = sim * row_scale[row] * col_scale[col] (the cosine's 1 / norms; ones when pre-scaled)
    sim_col_scale_ptr,
    y_ptr,
    loss_ptr,
    ce_ptr,
    entropy_ptr,
    top1_ptr,
    demd_ptr,
    coef_ptr,  # [n, N_COEF] float32, columns `Coef`: the rows' gradient coefficients (COEF_OUT writes, GRAD_ONLY reads)
    grad_scale_ptr,  # GRAD_ONLY: [n] float32, each row's gradient times this (the upstream gradient)
    vocab,  # columns of z (and of sim) in this call: the vocabulary, or a tile of it (GRAD_ONLY)
    col0,  # GRAD_ONLY: the vocabulary index of z's first column
    z_stride,
    sim_stride,
    inv_beta,
    ratio_max,  # EMO emo1: upper bound of the detached ratio (inf: none)
    target_coef,  # EMO: factor of p_y s_y added to DEMD in the value (1 target mass excluded, 0 included)
    LOSS: tl.constexpr,  # LOSS_IDS[name]
    EMO1: tl.constexpr,  # EMO weighting: True emo1, False emo2
    WANT_GRAD: tl.constexpr,
    WANT_STATS: tl.constexpr,
    MODE: tl.constexpr,  # a `Mode`: FULL, COEF_OUT (also store the coefficients) or GRAD_ONLY (pass 2 from them)
    BLOCK: tl.constexpr,
):
    COEF_OUT: tl.constexpr = MODE == MODE_COEF_OUT_
    GRAD_ONLY: tl.constexpr = MODE == MODE_GRAD_ONLY_  # no pass 1; pass 2 over a column tile, from coef_ptr
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_stride
    sim_row = sim_ptr + row * sim_stride
    coef_row = coef_ptr + row * N_COEF_
    y = tl.load(y_ptr + row).to(tl.int32)
    row_scale = 1.0
    if LOSS == LOSS_EMO_:
        row_scale = tl.load(sim_row_scale_ptr + row)
    cols0 = tl.arange(0, BLOCK)

    NEEDS_P: tl.constexpr = (LOSS == LOSS_CE_) or (LOSS == LOSS_EMO_) or WANT_STATS
    IS_GEM: tl.constexpr = (LOSS == LOSS_GEM_LINEAR_) or (LOSS == LOSS_GEM_LS_)

    # The coefficients pass 2 needs: p = exp(z - lse) and g = a (p - 1_y) + b p (s_mean - s) (CE, EMO); q =
    # exp(z / beta - mb) / sum_q, r = q w(z - z_y) and g = r - R 1_y (GEM).
    lse = 0.0
    ce_weight = 1.0  # the "a" of a (p - 1_y); EMO changes it
    demd_weight = 0.0  # the "b" of b p (s_mean - s)
    s_mean = 0.0
    mb = float("-inf")  # softmax(z / beta): running max, sum exp, its sums times d = z - z_y, w and w * d
    sum_q = 0.0
    total_r = 1.0  # GEM-LS: R = sum_i r_i, subtracted at the target
    if GRAD_ONLY:
        lse = tl.load(coef_row + COEF_LSE_)
        ce_weight = tl.load(coef_row + COEF_CE_WEIGHT_)
        demd_weight = tl.load(coef_row + COEF_DEMD_WEIGHT_)
        s_mean = tl.load(coef_row + COEF_S_MEAN_)
        mb = tl.load(coef_row + COEF_MB_)
        sum_q = tl.load(coef_row + COEF_SUM_Q_)
        total_r = tl.load(coef_row + COEF_TOTAL_R_)
        z_y = tl.load(coef_row + COEF_Z_Y_)
    else:
        z_y = tl.load(z_row + y).to(tl.float32)

    # ---- pass 1: statistics (not in GRAD_ONLY calls) ---------------------------------------------------------
    if not GRAD_ONLY:
        m = float("-inf")  # softmax(z): running max, sum exp, sum exp * z, sum exp * s
        sum_e = 0.0
        sum_ez = 0.0
        sum_es = 0.0
        best = float("-inf")  # argmax
        best_idx = 0
        sum_qd = 0.0
        sum_qw = 0.0
        sum_qwd = 0.0
        for start in range(0, vocab, BLOCK):
            cols = start + cols0
            mask = cols < vocab
            z = tl.load(z_row + cols, mask=mask, other=0.0).to(tl.float32)
            if NEEDS_P:
                m, sum_e, e, rescale = _online_add(m, sum_e, z, mask)
                sum_ez = sum_ez * rescale + tl.sum(e * z, axis=0)
                if LOSS == LOSS_EMO_:
                    s = tl.load(sim_row + cols, mask=mask, other=0.0).to(tl.float32) * row_scale
                    s = s * tl.load(sim_col_scale_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                    sum_es = sum_es * rescale + tl.sum(e * s, axis=0)
            if WANT_STATS:
                tile_max = tl.max(tl.where(mask, z, float("-inf")), axis=0)
                tile_arg = tl.argmax(tl.where(mask, z, float("-inf")), axis=0).to(tl.int32)
                better = tile_max > best
                best_idx = tl.where(better, start + tile_arg, best_idx)
                best = tl.maximum(best, tile_max)
            if IS_GEM:
                mb, sum_q, eq, rescale_q = _online_add(mb, sum_q, z * inv_beta, mask)
                # z - z_y, not z: E_q[z] - z_y cancels in float32 when q peaks at the target (failed on an H200 at |z| ~ 1e4)
                d = tl.where(mask, z - z_y, 0.0)
                sum_qd = sum_qd * rescale_q + tl.sum(eq * d, axis=0)
                if LOSS == LOSS_GEM_LS_:
                    w = tl.sigmoid(0.01 * d)
                    sum_qw = sum_qw * rescale_q + tl.sum(eq * w, axis=0)
                    sum_qwd = sum_qwd * rescale_q + tl.sum(eq * w * d, axis=0)

        ce = 0.0
        if NEEDS_P:
            lse = m + tl.log(sum_e)
            ce = lse - z_y
        if LOSS == LOSS_EMO_:
            s_mean = sum_es / sum_e
        if LOSS == LOSS_CE_:
            loss = ce
        elif LOSS == LOSS_GEM_LINEAR_:
            loss = sum_qd / sum_q  # E_q[z - z_y]
        elif LOSS == LOSS_GEM_LS_:
            total_r = sum_qw / sum_q
            loss = sum_qwd / sum_q  # E_q[w (z - z_y)]
        else:  # LOSS_EMO_
            demd = 1.0 - s_mean
            p_y = tl.exp(z_y - lse)
            s_y = tl.load(sim_row + y).to(tl.float32) * row_scale * tl.load(sim_col_scale_ptr + y)
            # target_coef 1: the official `gt_q` trick, the target's own mass left out of the value, not of the
            # gradient; 0: e = DEMD.
            e_val = tl.maximum(demd + target_coef * (p_y * s_y), 0.0)
            if EMO1:
                ratio = tl.minimum(ce / (e_val + EMO_EPS_), ratio_max)
                loss = 0.5 * (ce + ratio * e_val)
                ce_weight = 0.5
                demd_weight = 0.5 * ratio
            else:
                ce_weight = e_val / (ce + EMO_EPS_)
                loss = ce_weight * ce + e_val
                demd_weight = 1.0
            if WANT_STATS:
                tl.store(demd_ptr + row, demd)
        tl.store(loss_ptr + row, loss)
        if WANT_STATS:
            tl.store(ce_ptr + row, ce)
            tl.store(entropy_ptr + row, lse - sum_ez / sum_e)
            tl.store(top1_ptr + row, (best_idx == y).to(tl.float32))
        if COEF_OUT:
            tl.store(coef_row + COEF_LSE_, lse)
            tl.store(coef_row + COEF_CE_WEIGHT_, ce_weight)
            tl.store(coef_row + COEF_DEMD_WEIGHT_, demd_weight)
            tl.store(coef_row + COEF_S_MEAN_, s_mean)
            tl.store(coef_row + COEF_MB_, mb)
            tl.store(coef_row + COEF_SUM_Q_, sum_q)
            tl.store(coef_row + COEF_TOTAL_R_, total_r)
            tl.store(coef_row + COEF_Z_Y_, z_y)

    # ---- pass 2: dL/dz over the logits -------------------------------------------------------------------------
    if WANT_GRAD:
        for start in range(0, vocab, BLOCK):
            cols = start + cols0
            mask = cols < vocab
            z = tl.load(z_row + cols, mask=mask, other=0.0).to(tl.float32)
            at_target = cols + col0 == y
            if IS_GEM:
                g = tl.exp(z * inv_beta - mb) / sum_q  # q
                if LOSS == LOSS_GEM_LS_:
                    g = g * tl.sigmoid(0.01 * (z - z_y))  # r = q * w
                g = tl.where(at_target, g - total_r, g)
            else:
                p = tl.exp(z - lse)
                g = ce_weight * tl.where(at_target, p - 1.0, p)
                if LOSS == LOSS_EMO_:
                    s = tl.load(sim_row + cols, mask=mask, other=0.0).to(tl.float32) * row_scale
                    s = s * tl.load(sim_col_scale_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                    g += demd_weight * p * (s_mean - s)  # b * dDEMD/dz, dDEMD/dz = p (c - DEMD)
            if GRAD_ONLY:
                g = g * tl.load(grad_scale_ptr + row)
            tl.store(z_row + cols, g, mask=mask)


def launch_config(vocab: int) -> tuple[int, int]:
    """(BLOCK columns per tile, num_warps) for a row of `vocab` logits.

    16 warps at the 8192-wide tile keep every variant at <= 128 registers per thread without spills on sm_90
    (8 warps would need up to 242 for EMO with statistics); `tests/helpers/triton_compile_check.py` checks both.
    """
    block = min(MAX_BLOCK, triton.next_power_of_2(vocab))
    return block, 16 if block >= 8192 else 8 if block >= 2048 else 4


def _launch(
    mode: Mode,
    name: str,
    params: dict[str, Any],
    z: Tensor,
    y: Tensor,
    similarity: Tensor | None,
    similarity_scales: tuple[Tensor, Tensor] | None,
    *,
    loss: Tensor | None = None,
    stats: dict[str, Tensor] | None = None,
    want_grad: bool = True,
    coef: Tensor | None = None,
    grad_scale: Tensor | None = None,
    col0: int = 0,
) -> None:
    """One launch of the kernel over z's rows in `mode`, which decides the buffers it takes:

    * FULL: writes `loss` and `stats` (the keys given), and the gradient over z when `want_grad`;
    * COEF_OUT: the same, and each row's gradient coefficients into `coef` [n, N_COEF];
    * GRAD_ONLY: reads `coef` and `grad_scale` [n]; writes the gradient over z, the vocabulary columns col0 .. col0 +
      z's width; no loss, no statistics.
    """
    stats = stats or {}
    if mode is Mode.GRAD_ONLY:
        assert loss is None and not stats and want_grad and coef is not None and grad_scale is not None
    else:
        assert loss is not None and grad_scale is None and col0 == 0
        assert (coef is not None) == (mode is Mode.COEF_OUT)
    n, vocab = z.shape
    if coef is not None:
        assert coef.shape == (n, N_COEF) and coef.dtype == torch.float32 and coef.is_contiguous()
    if grad_scale is not None:
        assert grad_scale.shape == (n,) and grad_scale.dtype == torch.float32
    if LOSSES[name].needs_cost_embedding:
        assert similarity is not None and similarity.shape == z.shape
        similarity = similarity if similarity.stride(1) == 1 else similarity.contiguous()
        if similarity_scales is None:
            row_scale, col_scale = z.new_ones(n, dtype=torch.float32), z.new_ones(vocab, dtype=torch.float32)
        else:
            row_scale, col_scale = similarity_scales
            assert row_scale.shape == (n,) and col_scale.shape == (vocab,)
        sim = similarity
    else:
        sim = row_scale = col_scale = z  # never read
    if not n:
        return
    # The pointer of a buffer the mode never touches still gets a float32 [n] tensor (Triton's launcher on a GPU
    # could refuse a null one).
    unused = grad_scale if mode is Mode.GRAD_ONLY else loss
    block, num_warps = launch_config(vocab)
    _distmatch_row_kernel[(n,)](
        z,
        sim,
        row_scale,
        col_scale,
        y,
        unused if loss is None else loss,
        stats.get("ce", unused),
        stats.get("entropy", unused),
        stats.get("top1_correct", unused),
        stats.get("demd", unused),
        unused if coef is None else coef,
        unused if grad_scale is None else grad_scale,
        vocab,
        col0,
        z.stride(0),
        sim.stride(0),
        1.0 / params["beta"] if "beta" in params else 1.0,
        float("inf") if params.get("ratio_clamp") is None else float(params["ratio_clamp"]),
        target_coefficient(params),
        LOSS=LOSS_IDS[name],
        EMO1=params.get("weighting", "emo1") == "emo1",
        WANT_GRAD=want_grad,
        WANT_STATS=bool(stats),
        MODE=int(mode),
        BLOCK=block,
        num_warps=num_warps,
    )


def _check_chunk(name: str, z: Tensor) -> Tensor:
    if name not in LOSS_IDS:
        raise ValueError(f"the Triton kernels implement {TRITON_LOSSES}, not {name!r}")
    if z.dtype not in CHUNK_DTYPES:
        raise ValueError(f"the Triton kernels take float32, bfloat16 or float16 logits chunks, got {z.dtype}")
    return z if z.stride(1) == 1 else z.contiguous()


def triton_chunk_math(
    name: str,
    params: dict[str, Any],
    z: Tensor,
    y: Tensor,
    similarity: Tensor | None,
    *,
    want_grad: bool,
    want_stats: bool,
    similarity_scales: tuple[Tensor, Tensor] | None = None,
    grad_coefficients: Tensor | None = None,
) -> ChunkResult:
    """`rows.chunk_math` for the losses in `TRITON_LOSSES`, on a chunk of float32 logits, or 16-bit ones (read in
    float32; the gradient written over them is rounded once). z is overwritten by the gradient; loss and statistics
    are float32. `similarity_scales` (row [n], column [V], float32): the kernel uses similarity * row x column (the
    cosine from raw dot products, without two scaling passes over the [n, V] rows). `grad_coefficients` ([n,
    N_COEF] float32, contiguous): filled with each row's gradient coefficients, for `triton_tile_gradient` later."""
    z = _check_chunk(name, z)
    n = z.shape[0]
    loss = z.new_empty(n, dtype=torch.float32)
    stats = (
        {k: z.new_empty(n, dtype=torch.float32) for k in ("ce", "entropy", "top1_correct")}
        if want_stats
        else {}
    )
    for key in LOSSES[name].stats if want_stats else ():
        stats[key] = z.new_empty(n, dtype=torch.float32)
    mode = Mode.FULL if grad_coefficients is None else Mode.COEF_OUT
    _launch(
        mode,
        name,
        params,
        z,
        y,
        similarity,
        similarity_scales,
        loss=loss,
        stats=stats,
        want_grad=want_grad,
        coef=grad_coefficients,
    )
    return ChunkResult(loss, z if want_grad else None, **stats)


def triton_tile_gradient(
    name: str,
    params: dict[str, Any],
    z: Tensor,
    y: Tensor,
    grad_coefficients: Tensor,
    grad_scale: Tensor,
    col0: int,
    similarity: Tensor | None = None,
    similarity_scales: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The gradient of rows' losses w.r.t. a tile of their logits, `z` [n, tile] holding vocabulary columns col0 ..
    col0 + tile, written over z and times each row's `grad_scale` ([n] float32); from the coefficients an earlier
    `triton_chunk_math(..., grad_coefficients=)` call stored for the same rows (pass 2 alone, no statistics). EMO:
    `similarity` is the tile's [n, tile] raw dot products, `similarity_scales` the rows' and the tile's columns'."""
    z = _check_chunk(name, z)
    _launch(
        Mode.GRAD_ONLY,
        name,
        params,
        z,
        y,
        similarity,
        similarity_scales,
        coef=grad_coefficients,
        grad_scale=grad_scale,
        col0=col0,
    )
    return z
