"""How the memory-efficient paths run: one immutable settings object, given where a run starts and passed down.

`FusedSettings` holds the four choices that decide the chunked and fused paths' memory, speed and rounding (not
their math: every setting computes the same loss). The integrations build it from the user's options
(`loss_chunk_memory_mb`, ... in a TRL or Axolotl config, `trl_ext.options.fused_settings`); `token_loss` /
`fused_token_loss` take it as `settings=`. Without one they fall back to the environment variables of `ENV`, read
here only (`from_env`), once per call at the entry point: nothing below the entry points reads the environment.

* `chunk_memory_mb`: the budget of one chunk's `[rows, V]` temporaries (and of a `tiles` block), in MiB; None:
  128 on a CPU, 512 on CUDA (a chunk needs >= ~1k rows for the logits matmul to be compute-bound at V = 128k).
* `chunk_logits`: "float32", or "input" (the inputs' own dtype, e.g. bf16: each logit rounded once from the float32
  product, as a bf16 model's full logits and Liger's chunks are; half the chunk's bytes; Triton kernel only).
* `grad_weight_accum`: how the fused path forms d weight: "float32" (a float32 buffer, added chunk by chunk),
  "weight" (in the weight's own dtype: no [V, d] float32 buffer; each product added in float32, rounded once per
  chunk) or "tiles" (Triton kernel only: the backward recomputes the logits by [row block, vocabulary tile] and adds
  each tile's product: no pass over the whole gradient per chunk, one more logits product).
* `kernels`: which implementation runs the row math (`row_backends.py`): "auto" (Triton for the losses it
  implements on CUDA when Triton is installed), "torch" or "triton".

Error and memory of each: docs/losses.md "Memory-efficient paths: settings".
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .spec import Option

CHUNK_LOGITS = ("float32", "input")
GRAD_WEIGHT_ACCUM = ("float32", "weight", "tiles")
KERNELS = ("auto", "torch", "triton")
#: The chunk budget's bounds in MiB: above 0, at most 1 TiB (beyond any accelerator's memory).
MAX_CHUNK_MEMORY_MB = float(2**20)
DEFAULT_CHUNK_MEMORY_MB = 128
DEFAULT_CUDA_CHUNK_MEMORY_MB = 512

#: The environment variable each setting falls back to when no settings are given.
ENV = {
    "chunk_memory_mb": "DISTMATCH_CHUNK_MEMORY_MB",
    "chunk_logits": "DISTMATCH_CHUNK_LOGITS",
    "grad_weight_accum": "DISTMATCH_GRAD_WEIGHT_ACCUM",
    "kernels": "DISTMATCH_KERNELS",
}
#: Triton's own switch for its CPU interpreter (how the tests run the kernels without a GPU).
TRITON_INTERPRET_ENV = "TRITON_INTERPRET"
CHOICES = {"chunk_logits": CHUNK_LOGITS, "grad_weight_accum": GRAD_WEIGHT_ACCUM, "kernels": KERNELS}


def chunk_memory_problem(value: Any) -> str | None:
    """None when `value` is a valid chunk budget (None: the device's default), else what is expected."""
    expected = (
        f"a number of MiB above 0 and at most {MAX_CHUNK_MEMORY_MB:.0f}, or unset for the device's default"
    )
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return expected
    return None if math.isfinite(value) and 0 < value <= MAX_CHUNK_MEMORY_MB else expected


def choice_problem(name: str, value: Any) -> str | None:
    """None when `value` is one of setting `name`'s choices, else what is expected."""
    accepted = CHOICES[name]
    return None if value in accepted else "one of " + ", ".join(repr(c) for c in accepted)


@dataclass(frozen=True)
class FusedSettings:
    """The memory-efficient paths' settings (module docstring); validated when built."""

    chunk_memory_mb: float | None = None
    chunk_logits: str = "float32"
    grad_weight_accum: str = "float32"
    kernels: str = "auto"

    def __post_init__(self) -> None:
        problems = [(f.name, problem(f.name, getattr(self, f.name))) for f in fields(self)]
        bad = [f"{name}={getattr(self, name)!r} is invalid; expected {why}" for name, why in problems if why]
        if bad:
            raise ValueError("FusedSettings: " + "; ".join(bad) + ".")

    def budget_bytes(self, device_type: str | None) -> int:
        """The chunk budget in bytes on a device of `device_type` ("cuda", "cpu", ...)."""
        default = DEFAULT_CUDA_CHUNK_MEMORY_MB if device_type == "cuda" else DEFAULT_CHUNK_MEMORY_MB
        return max(1, int((self.chunk_memory_mb or default) * 2**20))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FusedSettings:
        """The settings the environment variables of `ENV` give (unset ones: the defaults); a bad value raises a
        one-line `ValueError` naming the variable and what it accepts."""
        return cls(**env_values(os.environ if environ is None else environ))


def problem(name: str, value: Any) -> str | None:
    """None when `value` is valid for setting `name`, else what is expected."""
    return chunk_memory_problem(value) if name == "chunk_memory_mb" else choice_problem(name, value)


def env_values(environ: Mapping[str, str], names: Iterable[str] | None = None) -> dict[str, Any]:
    """The settings (of `names`, default all) the environment sets: name -> value, parsed and checked; the unset
    ones left out."""
    values: dict[str, Any] = {}
    for name, variable in ENV.items():
        if names is not None and name not in names:
            continue
        text = environ.get(variable)
        if text is None or text == "":
            continue
        value: Any = text
        if name == "chunk_memory_mb":
            try:
                value = float(text)
            except ValueError:
                value = text
        why = problem(name, value)
        if why is not None:
            raise ValueError(f"{variable}={text!r} is invalid; expected {why}.")
        values[name] = value
    return values


def _option(name: str, param: str, default: Any, help: str, type_: type) -> Option:
    def check(value: Any) -> str | None:
        return problem(param, value)

    return Option(name, param, default, help, check, type_, CHOICES.get(param))


#: The user-facing options (TRL flags / YAML keys, Axolotl keys, ms-swift's options) of the settings: they apply to
#: every loss, and each falls back to its environment variable (`ENV`) when unset.
OPTIONS: tuple[Option, ...] = (
    _option(
        "loss_chunk_memory_mb",
        "chunk_memory_mb",
        None,
        "Memory budget in MiB of one chunk of [tokens, vocabulary] temporaries on the chunked and fused paths "
        "(unset: 128 on a CPU, 512 on CUDA; env DISTMATCH_CHUNK_MEMORY_MB). Smaller: less memory, more passes.",
        float,
    ),
    _option(
        "loss_chunk_logits",
        "chunk_logits",
        "float32",
        "dtype of the fused path's chunk of logits: float32, or input (the model's own, e.g. bf16: half the chunk's "
        "memory, each logit rounded once; needs the Triton kernel). Env DISTMATCH_CHUNK_LOGITS.",
        str,
    ),
    _option(
        "loss_grad_weight_accum",
        "grad_weight_accum",
        "float32",
        "How the fused path forms the LM head's weight gradient: float32 (a float32 buffer), weight (in the "
        "weight's dtype: no float32 [V, d] buffer) or tiles (recomputed by vocabulary tile in the backward: "
        "least memory; needs the Triton kernel). Env DISTMATCH_GRAD_WEIGHT_ACCUM.",
        str,
    ),
    _option(
        "loss_kernels",
        "kernels",
        "auto",
        "Which implementation runs the loss's row math: auto (the Triton kernel for the losses it implements, on CUDA "
        "when Triton is installed), torch or triton. Env DISTMATCH_KERNELS.",
        str,
    ),
)


def triton_interpreter(environ: Mapping[str, str] | None = None) -> bool:
    """Whether Triton runs its kernels in its CPU interpreter: `TRITON_INTERPRET` read as Triton reads its boolean
    variables (1, true or on, in any case)."""
    value = (os.environ if environ is None else environ).get(TRITON_INTERPRET_ENV, "")
    return value.strip().lower() in ("1", "true", "on")


__all__ = [
    "CHUNK_LOGITS",
    "ENV",
    "GRAD_WEIGHT_ACCUM",
    "KERNELS",
    "MAX_CHUNK_MEMORY_MB",
    "OPTIONS",
    "FusedSettings",
    "env_values",
    "problem",
    "triton_interpreter",
]
