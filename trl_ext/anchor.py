"""The frozen reference model of the anchored losses (`asft`, `sft_kl`): taken once, never trained, run without
gradients, its hidden states and head handed to the loss (which builds its logits chunk by chunk).

* Full fine-tuning: a copy of the model as it is when the trainer sets the loss up (the starting checkpoint), in the
  training dtype, in eval mode, every parameter frozen, kept outside the trained module (not optimised, not saved).
* PEFT (LoRA): no copy. The reference is the trained model itself with its adapters switched off for the reference
  forward (as the ASFT authors' code does with `model.disable_adapter()`); the base weights are frozen under LoRA.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class Reference:
    """Where the reference's forward comes from: a frozen copy (`model`), or the trained model, adapters off."""

    model: nn.Module | None = None  # None: the trained model with its adapters disabled
    # The PEFT-wrapped model's modules (its `_disable_adapters` flags) when `model` is None.
    adapters_off: bool = False


def has_adapters(model: nn.Module) -> bool:
    return any(hasattr(m, "_disable_adapters") for m in model.modules())


def make_reference(model: nn.Module, peft_wrapped: bool) -> Reference:
    """The reference of `model` (PEFT-unwrapped; `peft_wrapped`: it carries adapters): see the module docstring."""
    if peft_wrapped and has_adapters(model):
        return Reference(model=None, adapters_off=True)
    frozen = copy.deepcopy(model)
    frozen.eval()
    frozen.requires_grad_(False)
    return Reference(model=frozen)


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Switch every PEFT adapter of `model` off (PEFT's own per-layer flag), and back on afterwards."""
    layers = [m for m in model.modules() if hasattr(m, "_disable_adapters")]
    before = [m._disable_adapters for m in layers]
    try:
        for m in layers:
            m._disable_adapters = True
        yield
    finally:
        for m, flag in zip(layers, before):
            m._disable_adapters = flag


def base_head(head: nn.Module) -> nn.Module:
    """The head without its adapter (a LoRA / modules_to_save wrapper's base layer), else the head itself."""
    for attr in ("base_layer", "original_module"):
        inner = getattr(head, attr, None)
        if isinstance(inner, nn.Module):
            return base_head(inner)
    return head


def reference_hidden(
    trained: nn.Module, reference: Reference, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Tensor, nn.Module]:
    """The reference's final hidden states for the same inputs (no gradient) and the module of its LM head."""
    with torch.no_grad():
        if reference.model is not None:
            hidden = reference.model.base_model(*args, **kwargs).last_hidden_state
            return hidden, reference.model.get_output_embeddings()
        with adapters_disabled(trained):
            hidden = trained.base_model(*args, **kwargs).last_hidden_state
        return hidden, base_head(trained.get_output_embeddings())
