"""DISTMATCH_GRAD_WEIGHT_ACCUM: the fused path's weight-gradient accumulator in the weight's own dtype.

Against float64 closed forms: the default (float32 accumulator) is as close as bf16 can be (the rounding of the exact
result); `weight` stays within a few of those roundings, at every chunk size; a float32 head is unaffected; a bad
value is refused in one line.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trl_ext.losses import fused_token_loss, token_loss
from trl_ext.losses.chunked import CHUNK_LOGITS_ENV, GRAD_WEIGHT_ACCUM_ENV
from trl_ext.losses.plan import ChunkPlan
from trl_ext.losses.settings import FusedSettings


def _inputs(dtype: torch.dtype, n: int = 512, d: int = 32, v: int = 5000):  # v > one vocabulary tile (4096)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, d, generator=gen).to(dtype)
    weight = (torch.randn(v, d, generator=gen) * 0.1).to(dtype)
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[::7] = -100
    return hidden, weight, labels


def _exact(hidden, weight, labels) -> torch.Tensor:
    h, w = hidden.double(), weight.double()
    valid = labels != -100
    p = torch.softmax(h[valid] @ w.T, -1)
    p[torch.arange(int(valid.sum())), labels[valid]] -= 1
    return (p / int(valid.sum())).T @ h[valid]


def _grad(hidden, weight, labels, chunk: int | None) -> torch.Tensor:
    w = weight.clone().requires_grad_()
    loss = fused_token_loss("ce", hidden, w, labels, chunk_size=chunk)
    (loss.sum() / int((labels != -100).sum())).backward()
    return w.grad


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("chunk", [None, 64])
def test_weight_dtype_accumulator_stays_near_bf16_rounding(monkeypatch, chunk):
    hidden, weight, labels = _inputs(torch.bfloat16)
    exact = _exact(hidden, weight, labels)
    floor = _rel(exact.bfloat16(), exact)
    monkeypatch.setenv(GRAD_WEIGHT_ACCUM_ENV, "float32")
    default = _grad(hidden, weight, labels, chunk)
    monkeypatch.setenv(GRAD_WEIGHT_ACCUM_ENV, "weight")
    low = _grad(hidden, weight, labels, chunk)
    assert default.dtype == low.dtype == torch.bfloat16
    assert _rel(default, exact) <= 1.01 * floor
    assert floor < _rel(low, exact) <= 6 * floor  # measurably lower precision, still bf16-sized


def test_float32_head_is_unaffected(monkeypatch):
    hidden, weight, labels = _inputs(torch.float32)
    monkeypatch.setenv(GRAD_WEIGHT_ACCUM_ENV, "weight")
    got = _grad(hidden, weight, labels, 64)
    assert _rel(got, _exact(hidden, weight, labels)) < 1e-6


def test_bad_value_is_refused(monkeypatch):
    hidden, weight, labels = _inputs(torch.bfloat16, n=8, v=16)
    monkeypatch.setenv(GRAD_WEIGHT_ACCUM_ENV, "fp8")
    with pytest.raises(
        ValueError,
        match="DISTMATCH_GRAD_WEIGHT_ACCUM='fp8' is invalid; expected one of 'float32', 'weight', 'tiles'",
    ):
        _grad(hidden, weight, labels, None)


def test_tiles_without_the_triton_kernel_are_refused_on_the_fused_path_only(monkeypatch):
    """`tiles` runs the kernel's gradient pass alone on each tile: with the PyTorch closed forms it is refused in one
    line before any work; the logits path, which has no d weight, ignores the setting."""
    hidden, weight, labels = _inputs(torch.float32, n=8, v=16)
    monkeypatch.setenv(GRAD_WEIGHT_ACCUM_ENV, "tiles")
    monkeypatch.setenv("DISTMATCH_KERNELS", "torch")
    with pytest.raises(
        ValueError,
        match=r"grad_weight_accum='tiles' \(loss_grad_weight_accum, DISTMATCH_GRAD_WEIGHT_ACCUM\) needs the Triton row kernel",
    ):
        _grad(hidden, weight, labels, None)
    logits = (hidden @ weight.T).requires_grad_()
    token_loss("ce", logits, labels).sum().backward()
    monkeypatch.delenv(GRAD_WEIGHT_ACCUM_ENV)
    want = (hidden @ weight.T).requires_grad_()
    token_loss("ce", want, labels).sum().backward()
    assert torch.equal(logits.grad, want.grad)


# ---- DISTMATCH_CHUNK_LOGITS (the Triton path itself: tests/losses/test_triton.py) -------------------------------


def test_chunk_logits_bad_value_is_refused(monkeypatch):
    hidden, weight, labels = _inputs(torch.bfloat16, n=8, v=16)
    monkeypatch.setenv(CHUNK_LOGITS_ENV, "bf16")
    with pytest.raises(
        ValueError, match="DISTMATCH_CHUNK_LOGITS='bf16' is invalid; expected one of 'float32', 'input'"
    ):
        _grad(hidden, weight, labels, None)


def test_input_dtype_chunk_logits_without_the_triton_kernel_are_refused(monkeypatch):
    """The PyTorch closed forms take float32 chunks: a 16-bit chunk there is refused, not silently upcast."""
    hidden, weight, labels = _inputs(torch.bfloat16, n=8, v=16)
    monkeypatch.setenv(CHUNK_LOGITS_ENV, "input")
    monkeypatch.setenv("DISTMATCH_KERNELS", "torch")
    with pytest.raises(
        ValueError,
        match=r"chunk_logits='input' \(loss_chunk_logits, DISTMATCH_CHUNK_LOGITS\) needs the Triton row kernel",
    ):
        _grad(hidden, weight, labels, None)


def test_input_dtype_chunk_logits_leave_float32_inputs_alone(monkeypatch):
    """For float32 inputs the input dtype is the compute dtype: the same chunks, the same gradient."""
    hidden, weight, labels = _inputs(torch.float32)
    want = _grad(hidden, weight, labels, 64)
    monkeypatch.setenv(CHUNK_LOGITS_ENV, "input")
    torch.testing.assert_close(_grad(hidden, weight, labels, 64), want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("emo", "logits", "rows", "tile"),
    [
        (False, torch.bfloat16, 3840, 4096),
        (True, torch.bfloat16, 1920, 2688),
        (False, torch.float32, 3840, 1280),
    ],
)
def test_tiles_blocks_fit_the_chunk_budget_at_llama3s_head(emo, logits, rows, tile):
    """`tiles` at Llama-3-8B's head on CUDA (bf16 operands; N 7393 valid rows, d 4096, V 128256) with a 60 MiB budget:
    a row block's rows of h (EMO: and of the cost embedding) take at most half, its [rows, tile] block (EMO: and the
    float32 similarity; float32 logits: and their bf16 copy) the rest, the tile a multiple of 128 that no wider one
    would fit."""
    plan = SimpleNamespace(
        cdtype=torch.float32,
        matmul_dtype=torch.bfloat16,
        logits_dtype=logits,
        cost_embedding=object() if emo else None,
        settings=FusedSettings(chunk_memory_mb=60),
    )
    got = ChunkPlan.tile_shape(plan, 7393, 4096, 128256, torch.device("cuda"))
    assert got == (rows, tile)
    per_row = 4096 * 2 * (2 if emo else 1)
    per_cell = logits.itemsize + (4 if emo else 0) + (2 if logits == torch.float32 else 0)
    budget = 60 * 2**20
    assert rows * per_row <= budget // 2 and rows * per_row + rows * tile * per_cell <= budget
    assert rows * per_row + rows * (tile + 128) * per_cell > budget and tile % 128 == 0
