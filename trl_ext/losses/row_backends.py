"""Chooses which implementation runs a chunk's row math: the PyTorch closed forms or the Triton row kernel.

The `kernels` setting (`FusedSettings.kernels`; option `loss_kernels`, fallback ``DISTMATCH_KERNELS``) = ``auto``
(default: Triton for the losses whose spec says `triton=True`, on CUDA float32 chunks when Triton is installed;
PyTorch otherwise), ``torch`` (always PyTorch), or ``triton`` (always Triton; an error where it cannot run. On CPU
it needs Triton's interpreter, ``TRITON_INTERPRET=1``, which is how the tests run it). `kernel_unavailable` says,
before any model loads, why the kernel could not run for a loss on a device.

The first time the kernel is selected in a process for a (device type, dtype), `check_kernel` compares it with the
PyTorch closed forms on a small random problem; a mismatch stops with an error telling to set
``loss_kernels: torch``. Before the first ``grad_weight_accum="tiles"`` backward, `check_tile_kernel` compares the
kernel's gradient pass over vocabulary tiles with its full pass the same way (one routine, `_self_check`, runs both).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from distmatch.optional import is_available, require

from .registry import LOSSES, TRITON_LOSSES
from .rows import ChunkResult, chunk_math
from .settings import ENV, KERNELS, triton_interpreter
from .spec import N_COEF

KERNELS_ENV = ENV["kernels"]
GRAD_WEIGHT_ACCUM_ENV = ENV["grad_weight_accum"]
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

#: (loss, params) the first-use self-checks run; one per code path of the kernel.
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


class _Problem(NamedTuple):
    """The self-checks' small random problem: logits, targets, and for EMO an unnormalised embedding's raw dot
    products with the cosine's row and column scales (1 / norms), which the kernel applies."""

    z: Tensor
    y: Tensor
    raw: Tensor
    scales: tuple[Tensor, Tensor]


def _self_check_problem(n: int = 6, vocab: int = 37, *, device: torch.device, dtype: torch.dtype) -> _Problem:
    gen = torch.Generator().manual_seed(1234)
    z = (torch.randn(n, vocab, generator=gen) * 2.0).to(device=device, dtype=dtype)
    y = torch.randint(0, vocab, (n,), generator=gen).to(device)
    emb = torch.randn(vocab, 8, generator=gen) * torch.rand(vocab, 1, generator=gen).add_(0.5)
    # The similarity rows stay float32 beside a 16-bit chunk (as `plan.py` passes them).
    sim_dtype = dtype if dtype.itemsize >= 4 else torch.float32
    inv = emb.norm(dim=1).reciprocal()
    raw = (emb[y.cpu()] @ emb.T).to(device=device, dtype=sim_dtype)
    return _Problem(z, y, raw, (inv[y.cpu()].to(device), inv.to(device)))


#: One self-check's comparison for a case of `SELF_CHECK_CASES`: None when the kernel is right, else where and how it
#: differs ("grad: max |diff| 0.01").
CaseCheck = Callable[[str, dict, _Problem], "str | None"]


def _tolerance(dtype: torch.dtype, field: str, float32: float) -> float:
    """The relative tolerance of a compared `field` (absolute: a tenth of it): a 16-bit chunk's gradient is written
    rounded to its dtype, so one rounding of it; anything else the check's float32 tolerance."""
    return torch.finfo(dtype).eps if field == "grad" and dtype.itemsize < 4 else float32


def _difference(got: Tensor | None, want: Tensor, rtol: float) -> str | None:
    """None when `got` is `want` within `rtol` (atol a tenth of it), else how it differs."""
    if got is None or got.shape != want.shape:
        return "missing"
    if torch.allclose(got.float(), want.float(), rtol=rtol, atol=rtol / 10):
        return None
    return f"max |diff| {float((got.float() - want.float()).abs().max()):.3g}"


def _self_check(
    checked: set[tuple[str, torch.dtype]],
    device: torch.device,
    dtype: torch.dtype,
    case_check: CaseCheck,
    *,
    failure: str,
    baseline: str,
    way_out: str,
) -> None:
    """Once per process and (device type, dtype) (recorded in `checked`): `case_check` on every case of
    `SELF_CHECK_CASES` over the self-check problem. The first difference stops with `KernelSelfCheckError`:
    `failure`, the case, the difference against `baseline`, and `way_out`."""
    key = (device.type, dtype)
    if key in checked:
        return
    problem = _self_check_problem(device=device, dtype=dtype)
    # Autocast off: the check runs where the kernel is first selected, often inside the trainer's bf16 autocast,
    # which would lower the closed forms' matmuls (the entropy's, EMO's) and fail a correct kernel.
    with torch.no_grad(), torch.autocast(device.type, enabled=False):
        for name, params in SELF_CHECK_CASES:
            where = case_check(name, params, problem)
            if where is not None:
                raise KernelSelfCheckError(
                    f"{failure} on this {device.type} device for {dtype} ({name} {params}, {where} vs {baseline}), "
                    f"so {way_out}, and please report your GPU, driver and Triton version."
                )
    checked.add(key)


def check_kernel(row_math: RowMath, device: torch.device, dtype: torch.dtype) -> None:
    """Once per process and (device type, dtype): `row_math` against the PyTorch closed forms on a small random
    problem (values, gradients, statistics). A mismatch stops with `KernelSelfCheckError` saying how to switch."""

    def case_check(name: str, params: dict, p: _Problem) -> str | None:
        cost = LOSSES[name].needs_cost_embedding
        cosine = p.raw.float() * p.scales[0].unsqueeze(1) * p.scales[1] if cost else None
        # 16-bit chunks: the closed forms on the same values in float32; the kernel's gradient is rounded.
        want = chunk_math(name, params, p.z.float(), p.y, cosine, want_grad=True, want_stats=True)
        got = row_math(
            name,
            params,
            p.z.clone(),
            p.y,
            p.raw if cost else None,
            want_grad=True,
            want_stats=True,
            similarity_scales=p.scales if cost else None,
        )
        for field in ("loss", "grad", "ce", "entropy", "demd"):
            expected = getattr(want, field)
            if expected is not None:
                diff = _difference(getattr(got, field), expected, _tolerance(dtype, field, 1e-4))
                if diff is not None:
                    return f"{field}: {diff}"
        return None

    _self_check(
        _CHECKED,
        device,
        dtype,
        case_check,
        failure="The Triton loss kernel gives wrong results",
        baseline="the PyTorch closed form",
        way_out=f"it is not used. Set `loss_kernels: torch` ({KERNELS_ENV}=torch) to train with the PyTorch path "
        "(same losses, more memory traffic)",
    )


def check_tile_kernel(device: torch.device, dtype: torch.dtype) -> None:
    """Once per process and (device type, dtype), before the first `grad_weight_accum="tiles"` backward: the
    kernel's gradient pass alone over vocabulary tiles, from the coefficients its full pass stored, times a per-row
    scale, against that full pass's gradient (itself checked by `check_kernel`). A mismatch stops with
    `KernelSelfCheckError`."""
    from .triton_rows import triton_chunk_math, triton_tile_gradient

    def case_check(name: str, params: dict, p: _Problem) -> str | None:
        cost = LOSSES[name].needs_cost_embedding
        n, vocab = p.z.shape
        scale = torch.linspace(0.5, 1.5, n, device=device)
        coef = torch.empty(n, N_COEF, device=device, dtype=torch.float32)
        row_scales = p.scales if cost else None
        full = triton_chunk_math(
            name,
            params,
            p.z.clone(),
            p.y,
            p.raw.clone() if cost else None,
            want_grad=True,
            want_stats=False,
            similarity_scales=row_scales,
            grad_coefficients=coef,
        ).grad
        assert full is not None
        want = full.float() * scale.unsqueeze(1)
        for v0 in range(0, vocab, 16):  # three tiles of the 37 columns
            v1 = min(vocab, v0 + 16)
            sim = {
                "similarity": p.raw[:, v0:v1].contiguous(),
                "similarity_scales": (p.scales[0], p.scales[1][v0:v1]),
            }
            got = triton_tile_gradient(
                name, params, p.z[:, v0:v1].clone(), p.y, coef, scale, v0, **(sim if cost else {})
            )
            diff = _difference(got, want[:, v0:v1], _tolerance(dtype, "grad", 1e-5))
            if diff is not None:
                return f"columns {v0}-{v1}: {diff}"
        return None

    _self_check(
        _TILE_CHECKED,
        device,
        dtype,
        case_check,
        failure="The Triton loss kernel's gradient over a vocabulary tile is wrong",
        baseline="its full pass",
        way_out=f"`loss_grad_weight_accum: tiles` ({GRAD_WEIGHT_ACCUM_ENV}=tiles) cannot be used here. Set it to "
        "'float32' or 'weight'",
    )


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
