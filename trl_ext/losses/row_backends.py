"""Chooses which implementation runs a chunk's row math: the PyTorch closed forms or the Triton row kernel.

The `kernels` setting (`FusedSettings.kernels`; option `loss_kernels`, fallback ``DISTMATCH_KERNELS``) = ``auto``
(default: Triton for the losses whose spec says `triton=True`, on CUDA float32 chunks when Triton is installed;
PyTorch otherwise), ``torch`` (always PyTorch), or ``triton`` (always Triton; an error where it cannot run. On CPU
it needs Triton's interpreter, ``TRITON_INTERPRET=1``, which is how the tests run it). `kernel_unavailable` says,
before any model loads, why the kernel could not run for a loss on a device.

The first time the kernel is selected in a process for a (device type, dtype), `check_kernel` compares it with the
PyTorch closed forms on a small random problem; a mismatch stops with an error telling to set
``loss_kernels: torch``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from distmatch.optional import is_available, require

from .registry import LOSSES, TRITON_LOSSES
from .rows import ChunkResult, chunk_math
from .settings import ENV, KERNELS, triton_interpreter
from .spec import N_COEF

KERNELS_ENV = ENV["kernels"]
KERNEL_CHOICES = KERNELS

RowMath = Callable[..., ChunkResult]

__all__ = [
    "KERNELS_ENV",
    "KERNEL_CHOICES",
    "TRITON_LOSSES",
    "RowMath",
    "check_kernel",
    "check_tile_kernel",
    "kernel_unavailable",
    "select_row_math",
]

#: (loss, params) the first-use self-check runs; one per code path of the kernel.
SELF_CHECK_CASES: tuple[tuple[str, dict], ...] = (
    ("ce", {}),
    ("gem_linear", {"beta": 0.7}),
    ("gem_ls", {"beta": 0.7}),
    ("emo", {"weighting": "emo1"}),
    ("emo", {"weighting": "emo2"}),
    ("emo", {"weighting": "emo1", "target_mass": "included"}),
)
#: (device type, dtype) the kernel was checked on in this process
_CHECKED: set[tuple[str, torch.dtype]] = set()
_TILE_CHECKED: set[tuple[str, torch.dtype]] = set()  # ... and its gradient pass over tiles


class KernelSelfCheckError(RuntimeError):
    """The Triton row kernel disagrees with the PyTorch closed forms on this device and dtype."""


def _self_check_problem(n: int = 6, vocab: int = 37, *, device: torch.device, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(1234)
    z = (torch.randn(n, vocab, generator=gen) * 2.0).to(device=device, dtype=dtype)
    y = torch.randint(0, vocab, (n,), generator=gen).to(device)
    emb = torch.randn(vocab, 8, generator=gen) * torch.rand(vocab, 1, generator=gen).add_(0.5)
    # The similarity rows stay float32 beside a 16-bit chunk (as `plan.py` passes them): raw dot products and
    # the cosine's row and column scales (1 / norms), which the kernel applies.
    sim_dtype = dtype if dtype.itemsize >= 4 else torch.float32
    inv = emb.norm(dim=1).reciprocal()
    raw = (emb[y.cpu()] @ emb.T).to(device=device, dtype=sim_dtype)
    scales = (inv[y.cpu()].to(device), inv.to(device))
    return z, y, raw, scales


def check_kernel(row_math: RowMath, device: torch.device, dtype: torch.dtype) -> None:
    """Once per process and (device type, dtype): `row_math` against the PyTorch closed forms on a small random
    problem (values, gradients, statistics). A mismatch stops with `KernelSelfCheckError` saying how to switch."""
    key = (device.type, dtype)
    if key in _CHECKED:
        return
    z, y, raw, scales = _self_check_problem(device=device, dtype=dtype)
    cosine = raw.float() * scales[0].unsqueeze(1) * scales[1]
    # Autocast off: the check runs where the kernel is first selected, often inside the trainer's bf16 autocast,
    # which would lower the closed forms' matmuls (the entropy's, EMO's) and fail a correct kernel.
    with torch.no_grad(), torch.autocast(device.type, enabled=False):
        for name, params in SELF_CHECK_CASES:
            cost = LOSSES[name].needs_cost_embedding
            # 16-bit chunks: the closed forms on the same values in float32; the kernel's gradient is rounded.
            want = chunk_math(name, params, z.float(), y, cosine.clone() if cost else None,
                              want_grad=True, want_stats=True)  # fmt: skip
            got = row_math(name, params, z.clone(), y, raw if cost else None, want_grad=True, want_stats=True,
                           similarity_scales=scales if cost else None)  # fmt: skip
            for field in ("loss", "grad", "ce", "entropy", "demd"):
                a, b = getattr(got, field), getattr(want, field)
                if b is None:
                    continue
                tol = torch.finfo(dtype).eps if field == "grad" and dtype.itemsize < 4 else 1e-4
                if (
                    a is None
                    or a.shape != b.shape
                    or not torch.allclose(a.float(), b.float(), rtol=tol, atol=tol / 10)
                ):
                    diff = (
                        "missing"
                        if a is None or a.shape != b.shape
                        else f"max |diff| {float((a.float() - b.float()).abs().max()):.3g}"
                    )
                    raise KernelSelfCheckError(
                        f"The Triton loss kernel gives wrong results on this {device.type} device for {dtype} "
                        f"({name} {params}, {field}: {diff} vs the PyTorch closed form), so it is not used. Set "
                        f"`loss_kernels: torch` ({KERNELS_ENV}=torch) to train with the PyTorch path (same losses, "
                        "more memory traffic), and please report your GPU, driver and Triton version."
                    )
    _CHECKED.add(key)


def check_tile_kernel(device: torch.device, dtype: torch.dtype) -> None:
    """Once per process and (device type, dtype), before the first `grad_weight_accum="tiles"` backward: the
    kernel's gradient pass alone over vocabulary tiles, from the coefficients its full pass stored, times a per-row
    scale, against that full pass's gradient (itself checked by `check_kernel`). A mismatch stops with
    `KernelSelfCheckError`."""
    key = (device.type, dtype)
    if key in _TILE_CHECKED:
        return
    from .triton_rows import triton_chunk_math, triton_tile_gradient

    z, y, raw, scales = _self_check_problem(device=device, dtype=dtype)
    n, vocab = z.shape
    scale = torch.linspace(0.5, 1.5, n, device=device)
    tol = torch.finfo(dtype).eps if dtype.itemsize < 4 else 1e-5
    with torch.no_grad(), torch.autocast(device.type, enabled=False):
        for name, params in SELF_CHECK_CASES:
            cost = LOSSES[name].needs_cost_embedding
            coef = torch.empty(n, N_COEF, device=device, dtype=torch.float32)
            full = triton_chunk_math(name, params, z.clone(), y, raw.clone() if cost else None, want_grad=True,
                                     want_stats=False, similarity_scales=scales if cost else None,
                                     grad_coefficients=coef).grad  # fmt: skip
            assert full is not None
            want = full.float() * scale.unsqueeze(1)
            for v0 in range(0, vocab, 16):  # three tiles of the 37 columns
                v1 = min(vocab, v0 + 16)
                sim = {
                    "similarity": raw[:, v0:v1].contiguous(),
                    "similarity_scales": (scales[0], scales[1][v0:v1]),
                }
                got = triton_tile_gradient(
                    name, params, z[:, v0:v1].clone(), y, coef, scale, v0, **(sim if cost else {})
                )
                if not torch.allclose(got.float(), want[:, v0:v1], rtol=tol, atol=tol / 10):
                    raise KernelSelfCheckError(
                        f"The Triton loss kernel's gradient over a vocabulary tile is wrong on this {device.type} "
                        f"device for {dtype} ({name} {params}, columns {v0}-{v1}: max |diff| "
                        f"{float((got.float() - want[:, v0:v1]).abs().max()):.3g} vs its full pass), so "
                        "`loss_grad_weight_accum: tiles` (DISTMATCH_GRAD_WEIGHT_ACCUM=tiles) cannot be used here. Set "
                        "it to 'float32' or 'weight', "
                        "and please report your GPU, driver and Triton version."
                    )
    _TILE_CHECKED.add(key)


def _triton_row_math() -> RowMath:
    require("triton", extra="gpu", feature="The Triton loss kernels")
    from .triton_rows import triton_chunk_math

    return triton_chunk_math


def kernel_unavailable(name: str, kernels: str, device_type: str) -> str | None:
    """Why the Triton row kernel would not run loss `name` on a `device_type` device with `kernels`, or None when it
    would (before any model loads: the first-use self-check still runs later)."""
    if kernels == "torch":
        return "loss_kernels is 'torch'"
    if name not in TRITON_LOSSES:
        return f"the Triton kernels implement {', '.join(TRITON_LOSSES)}, not {name!r}"
    if device_type != "cuda" and not (kernels == "triton" and triton_interpreter()):
        return f"this run has no CUDA device (it runs on {device_type})"
    if not is_available("triton"):
        return "Triton is not installed (pip install 'distmatch[gpu]')"
    return None


def select_row_math(name: str, device: torch.device, dtype: torch.dtype, kernels: str = "auto") -> RowMath:
    """The row-math function for loss `name` on chunks of `dtype` on `device`, as `kernels` asks (`KERNEL_CHOICES`)."""
    if kernels not in KERNEL_CHOICES:
        raise ValueError(f"loss_kernels={kernels!r} is not one of {', '.join(KERNEL_CHOICES)}.")
    if kernels == "torch":
        return chunk_math
    if kernels == "auto":
        fits = device.type == "cuda" and dtype == torch.float32 and name in TRITON_LOSSES
        if not (fits and is_available("triton")):
            return chunk_math
        row_math = _triton_row_math()
        check_kernel(row_math, device, dtype)
        return row_math
    if name not in TRITON_LOSSES:
        raise ValueError(
            f"loss_kernels='triton': the Triton kernels implement {', '.join(TRITON_LOSSES)}, not {name!r}; "
            f"use 'auto' to run {name!r} with the PyTorch path."
        )
    if dtype != torch.float32:
        raise ValueError(f"loss_kernels='triton' computes in float32; {dtype} inputs need 'torch'.")
    if device.type != "cuda" and not triton_interpreter():
        raise ValueError(
            f"loss_kernels='triton' needs a CUDA device, or TRITON_INTERPRET=1 (Triton's slow interpreter, for "
            f"tests) on {device.type}."
        )
    row_math = _triton_row_math()
    check_kernel(row_math, device, dtype)
    return row_math
