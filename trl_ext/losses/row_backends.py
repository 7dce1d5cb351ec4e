"""Chooses which implementation runs a chunk's row math: the PyTorch closed forms or the Triton row kernel.

``DISTMATCH_KERNELS`` = ``auto`` (default: Triton for the losses whose spec says `triton=True`, on CUDA float32
chunks when Triton is installed; PyTorch otherwise), ``torch`` (always PyTorch), or ``triton`` (always Triton;
an error where it cannot run. On CPU it needs Triton's interpreter, ``TRITON_INTERPRET=1``, which is how the
tests run it).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from .._optional import is_available, require
from .registry import TRITON_LOSSES
from .rows import ChunkResult, chunk_math

KERNELS_ENV = "DISTMATCH_KERNELS"
KERNEL_CHOICES = ("auto", "torch", "triton")

RowMath = Callable[..., ChunkResult]

__all__ = ["KERNELS_ENV", "KERNEL_CHOICES", "TRITON_LOSSES", "RowMath", "select_row_math"]


def _triton_row_math() -> RowMath:
    require("triton", extra="gpu", feature="The Triton loss kernels")
    from .triton_rows import triton_chunk_math

    return triton_chunk_math


def select_row_math(name: str, device: torch.device, dtype: torch.dtype) -> RowMath:
    """The row-math function for loss `name` on chunks of `dtype` on `device`, honouring DISTMATCH_KERNELS."""
    choice = os.environ.get(KERNELS_ENV, "auto").strip().lower() or "auto"
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"{KERNELS_ENV}={choice!r} is not one of {', '.join(KERNEL_CHOICES)}.")
    if choice == "torch":
        return chunk_math
    if choice == "auto":
        fits = device.type == "cuda" and dtype == torch.float32 and name in TRITON_LOSSES
        return _triton_row_math() if fits and is_available("triton") else chunk_math
    if name not in TRITON_LOSSES:
        raise ValueError(
            f"{KERNELS_ENV}=triton: the Triton kernels implement {', '.join(TRITON_LOSSES)}, not {name!r}; "
            f"use {KERNELS_ENV}=auto to run {name!r} with the PyTorch path."
        )
    if dtype != torch.float32:
        raise ValueError(
            f"{KERNELS_ENV}=triton computes in float32; {dtype} inputs need {KERNELS_ENV}=torch."
        )
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"{KERNELS_ENV}=triton needs a CUDA device, or TRITON_INTERPRET=1 (Triton's slow interpreter, for "
            f"tests) on {device.type}."
        )
    return _triton_row_math()
