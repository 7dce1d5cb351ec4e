"""Validation shared by every path and every loss: parameter checks, input tensors, EMO's cost embedding.

No loss math here; nothing imported from the package.
"""

from __future__ import annotations

import math
from typing import Any

import torch

IGNORE_INDEX = -100


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def positive(value: Any) -> str | None:
    return None if _is_number(value) and value > 0 else "a finite number > 0"


def beta(value: Any) -> str | None:
    if not (_is_number(value) and value > 0):
        return "a finite number > 0 (the GEM papers use 0.7; 1.0 gives the cross-entropy gradient)"
    return None


def unit_interval(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        return "a number in [0, 1]"
    return None


def non_negative(value: Any) -> str | None:
    return None if _is_number(value) and value >= 0 else "a finite number >= 0"


def positive_int(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return "an integer >= 1"
    return None


def one_of(*choices: Any):
    """A check accepting exactly `choices`."""

    def check(value: Any) -> str | None:
        return None if value in choices else f"one of {', '.join(repr(c) for c in choices)}"

    return check


def tensor(value: Any) -> str | None:
    if not isinstance(value, torch.Tensor):
        return "a [vocab_size, d] floating-point tensor (e.g. a frozen copy of the model's output embedding)"
    return None


def model_source(value: Any) -> str | None:
    """An option naming where the integration takes a tensor from: 'frozen', 'live' or a model path / hub id."""
    if not isinstance(value, str) or not value:
        return "'frozen', 'live' or a model path / hub id"
    return None


def reference_source(value: Any) -> str | None:
    """The anchored losses' reference model: 'initial' (the starting model) or a model folder."""
    if not isinstance(value, str) or not value:
        return "'initial' or the folder of a model with the same vocabulary"
    return None


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


def check_reference(
    name: str, needed: bool, given: dict[str, Any], inputs: torch.Tensor, vocab_size: int
) -> dict[str, torch.Tensor]:
    """Validate the reference model's tensors of an anchored loss (`given`: the keywords of one path, None when
    not passed); return them detached. A loss that takes no reference refuses them, one that needs it requires them.
    """
    present = {key: value for key, value in given.items() if value is not None}
    keywords = " + ".join(f"{key}=" for key in given)
    if not needed:
        if present:
            raise ValueError(
                f"{', '.join(f'{k}=' for k in present)} is only for the anchored losses (asft, sft_kl); loss "
                f"{name!r} takes no reference model."
            )
        return {}
    if len(present) != len(given):
        raise ValueError(
            f"Loss {name!r} needs the frozen reference model's {keywords} on this path (its KL anchor), "
            f"got {', '.join(f'{k}=' for k in present) or 'none'}."
        )
    rows = inputs.shape[0]
    for key, value in present.items():
        check_floating(key, value, 2)
        if value.device != inputs.device:
            raise ValueError(f"{key} is on {value.device} but the inputs are on {inputs.device}.")
    if "reference_logits" in present and tuple(present["reference_logits"].shape) != (rows, vocab_size):
        raise ValueError(
            f"reference_logits must be [{rows}, {vocab_size}] like the logits (the reference model's logits of "
            f"the same rows, same vocabulary), got {tuple(present['reference_logits'].shape)}."
        )
    if "reference_hidden" in present:
        hidden, weight = present["reference_hidden"], present["reference_weight"]
        if hidden.shape[0] != rows or weight.shape[0] != vocab_size or hidden.shape[1] != weight.shape[1]:
            raise ValueError(
                f"reference_hidden must be [{rows}, d_ref] and reference_weight [{vocab_size}, d_ref] (the reference "
                f"model's hidden states of the same rows and its LM head, same vocabulary), got "
                f"{tuple(hidden.shape)} and {tuple(weight.shape)}."
            )
    return {key: value.detach() for key, value in present.items()}
