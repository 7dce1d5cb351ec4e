"""Loss names, their hyper-parameters and the validation every path shares.

This module holds no math: it maps a loss name to the parameters it accepts (with defaults and checks) and
validates the tensors handed to the public functions, so that every path rejects bad input the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

IGNORE_INDEX = -100
EMO_WEIGHTINGS = ("emo1", "emo2")


def _check_beta(value: Any) -> str | None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        return "a finite number > 0 (the GEM papers use 0.7; 1.0 gives the cross-entropy gradient)"
    return None


def _check_unit_interval(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        return "a number in [0, 1]"
    return None


def _check_non_negative(value: Any) -> str | None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        return "a finite number >= 0"
    return None


def _check_weighting(value: Any) -> str | None:
    if value not in EMO_WEIGHTINGS:
        return f"one of {', '.join(repr(w) for w in EMO_WEIGHTINGS)}"
    return None


def _check_cost_embedding(value: Any) -> str | None:
    if not isinstance(value, torch.Tensor):
        return "a [vocab_size, d] floating-point tensor (e.g. a frozen copy of the model's output embedding)"
    return None


_REQUIRED = object()


@dataclass(frozen=True)
class ParamSpec:
    name: str
    default: Any
    check: Callable[[Any], str | None]
    doc: str


@dataclass(frozen=True)
class LossSpec:
    name: str
    summary: str
    params: tuple[ParamSpec, ...] = ()

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def needs_cost_embedding(self) -> bool:
        return "cost_embedding" in self.param_names


_BETA = ParamSpec(
    "beta", 0.7, _check_beta, "GEM temperature of the detached target distribution softmax(z / beta)"
)
_GAMMA = ParamSpec("gamma", 0.5, _check_unit_interval, "interpolation coefficient (EMO paper appendix A.1)")

LOSSES: dict[str, LossSpec] = {
    spec.name: spec
    for spec in (
        LossSpec("ce", "cross-entropy (maximum likelihood)"),
        LossSpec(
            "emo",
            "EMO: CE dynamically weighted with the differentiable earth mover distance (Ren et al., ICLR 2024)",
            (
                ParamSpec(
                    "cost_embedding",
                    _REQUIRED,
                    _check_cost_embedding,
                    "[V, d'] embedding whose cosine distance is the transport cost (normalised inside, never trained)",
                ),
                ParamSpec(
                    "weighting",
                    "emo1",
                    _check_weighting,
                    "'emo1': 0.5 * (CE + sg(CE / D) * D), logged value = CE; 'emo2': sg(D / CE) * CE + D, value = 2D",
                ),
            ),
        ),
        LossSpec("gem_linear", "GEM with h(u) = u (Li et al., 2024)", (_BETA,)),
        LossSpec("gem_ls", "GEM with h = log-sigmoid, slope 0.01 (Li et al., 2024)", (_BETA,)),
        LossSpec(
            "ce_entropy",
            "CE minus entropy_coef x entropy (the GEM paper's CE+Entropy baseline)",
            (ParamSpec("entropy_coef", 0.1, _check_non_negative, "weight of the entropy bonus"),),
        ),
        LossSpec(
            "tailr",
            "TaiLr: CE weighted by sg(p_y) / (gamma + (1 - gamma) sg(p_y)); gamma = 0 is CE",
            (_GAMMA,),
        ),
        LossSpec("mixce", "MixCE: CE weighted by gamma + (1 - gamma) sg(p_y); gamma = 1 is CE", (_GAMMA,)),
    )
}
LOSS_NAMES: tuple[str, ...] = tuple(LOSSES)


def resolve(name: str, params: Mapping[str, Any]) -> tuple[LossSpec, dict[str, Any]]:
    """Return the loss spec and its full, validated parameter dict (defaults filled in)."""
    if name not in LOSSES:
        raise ValueError(f"Unknown loss {name!r}. Valid losses: {', '.join(LOSS_NAMES)}.")
    spec = LOSSES[name]
    unknown = sorted(set(params) - set(spec.param_names))
    if unknown:
        valid = ", ".join(spec.param_names) or "none"
        raise ValueError(
            f"Loss {name!r} got unknown parameter(s) {', '.join(unknown)}. Valid parameters: {valid}."
        )
    resolved: dict[str, Any] = {}
    for p in spec.params:
        value = params.get(p.name, p.default)
        if value is _REQUIRED:
            raise ValueError(f"Loss {name!r} needs {p.name!r}: {p.doc}.")
        problem = p.check(value)
        if problem is not None:
            raise ValueError(f"Loss {name!r}: {p.name}={value!r} is invalid; expected {problem}.")
        resolved[p.name] = value
    return spec, resolved


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """All loss math runs in float32, or float64 when the inputs are float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_floating(name: str, tensor: Any, ndim: int) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}.")
    if not tensor.is_floating_point():
        raise ValueError(
            f"{name} must be a floating-point tensor (float16, bfloat16, float32 or float64), got {tensor.dtype}."
        )
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(tensor.shape)}.")


def check_labels(labels: Any, rows: int, vocab_size: int, device: torch.device) -> None:
    if not isinstance(labels, torch.Tensor) or labels.dtype not in (
        torch.int64,
        torch.int32,
        torch.int16,
        torch.uint8,
    ):
        raise ValueError("labels must be an integer tensor of token ids (with -100 for ignored positions).")
    if labels.dim() != 1 or labels.shape[0] != rows:
        raise ValueError(
            f"labels must be 1-D with one entry per row ({rows}), got shape {tuple(labels.shape)}; "
            "flatten [B, T] inputs and shift them before calling."
        )
    if labels.device != device:
        raise ValueError(f"labels are on {labels.device} but the inputs are on {device}.")
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab_size))
    if bool(bad.any()):
        example = int(labels[bad][0])
        raise ValueError(
            f"label {example} is out of range: valid labels are 0..{vocab_size - 1} or {IGNORE_INDEX}."
        )


def check_chunk_size(chunk_size: Any) -> None:
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive int or None (automatic), got {chunk_size!r}.")


COST_NORM_EPS = (
    1e-12  # an all-zero row keeps norm "1": it stays zero, costing 1 to every token instead of NaN
)


def checked_cost_embedding(cost_embedding: Any, vocab_size: int, device: torch.device) -> torch.Tensor:
    """Validate EMO's cost embedding ([vocab_size, d], floating, on `device`); return it detached."""
    check_floating("cost_embedding", cost_embedding, 2)
    if cost_embedding.shape[0] != vocab_size:
        raise ValueError(
            f"cost_embedding has {cost_embedding.shape[0]} rows but the vocabulary has {vocab_size} entries; "
            "it must be a [vocab_size, d] output embedding of a model with the same tokenizer."
        )
    if cost_embedding.device != device:
        raise ValueError(f"cost_embedding is on {cost_embedding.device} but the inputs are on {device}.")
    return cost_embedding.detach()


def cost_inverse_norms(cost_embedding: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """1 / max(||e_i||, eps) per row, computed in `dtype` without a converted copy of the embedding."""
    wide = torch.promote_types(cost_embedding.dtype, dtype)  # never narrowed inside the norm
    norms = torch.linalg.vector_norm(cost_embedding, dim=1, dtype=wide).to(dtype)
    return norms.clamp_min_(COST_NORM_EPS).reciprocal_()


def normalized_cost_embedding(
    cost_embedding: torch.Tensor, vocab_size: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Validate EMO's cost embedding and return its rows L2-normalised (detached, in the compute dtype)."""
    emb = checked_cost_embedding(cost_embedding, vocab_size, device).to(dtype)
    return torch.nn.functional.normalize(emb, dim=1, eps=COST_NORM_EPS)
