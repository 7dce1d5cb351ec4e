"""The training model's LM head as EMO's cost embedding reads it: sharded or whole, its weight now, a frozen copy.

* `head_sharding(head)`: "zero3" (DeepSpeed ZeRO-3 partitioned weight), "fsdp2" (an FSDP2 unit) or None; the
  patched forward routes by it too (`trl_ext.model_forward`).
* `live_head_weight(head)`: the weight the head applies now. A PEFT LoRA layer on the head is read through peft's
  public API (`BaseTunerLayer.get_base_layer()` / `.disable_adapters` / `.merged` / `.active_adapters`, and
  `LoraLayer.lora_A` / `.lora_B` / `.scaling` / `.use_dora` / `.fan_in_fan_out`): W + sum of scaling * B A over the
  active adapters, unless they are disabled or merged (then W is what it applies). DoRA is refused.
* `frozen_head_copy(model)`: a detached copy of the head's weight, gathered whole under ZeRO-3 and FSDP2.
* `training_vocab_size(model)`: the vocabulary of the model being trained (a model or a local folder), no weights read.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch import Tensor, nn

from distmatch.errors import DistMatchConfigError
from distmatch.model_folder import vocab_size as folder_vocab_size
from distmatch.optional import require


def is_deepspeed_zero3(param: Tensor) -> bool:
    """A DeepSpeed ZeRO-3 partitioned parameter (its local tensor is empty outside a gather)."""
    return hasattr(param, "ds_id") and hasattr(param, "ds_status")


def is_dtensor(tensor: Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(tensor, DTensor)


def is_fsdp2_linear(head: nn.Module) -> bool:
    """An `nn.Linear` that `fully_shard` turned into its `FSDPLinear` subclass (alone or in a grouped unit)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(head, FSDPModule) and type(head).__bases__ == (FSDPModule, nn.Linear)


def head_sharding(head: nn.Module) -> str | None:
    """How the LM head is sharded: "zero3" (DeepSpeed ZeRO-3 partitioned weight), "fsdp2" (an FSDP2 unit), or None
    (a whole tensor in this process, also a head inside a parent FSDP2 unit, which is unsharded during its forward)."""
    if is_deepspeed_zero3(head.weight):
        return "zero3"
    if is_fsdp2_linear(head):
        return "fsdp2"
    return None


def _head_weight(head: nn.Module) -> Tensor:
    """The whole head weight; a DTensor (FSDP2 head outside its forward) is gathered (collective: every rank)."""
    weight = head.weight
    return weight.detach().full_tensor() if is_dtensor(weight) else weight


def _peft_layers() -> tuple[type, type] | None:
    """peft's public `BaseTunerLayer` and `LoraLayer`, or None when peft was never imported (then no module of the
    model is a peft layer: importing it here would only cost time)."""
    if "peft" not in sys.modules:
        return None
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer

    return BaseTunerLayer, LoraLayer


def _lora_delta(head: Any, name: str) -> Tensor:
    """scaling * B A of adapter `name` (peft's `LoraLayer.lora_A` / `lora_B` / `scaling`), laid out like W and in its
    adapter's dtype (a half-precision adapter on the CPU is multiplied in float32, as peft merges it)."""
    a, b = head.lora_A[name].weight, head.lora_B[name].weight
    on_cpu_half = b.device.type == "cpu" and b.dtype in (torch.float16, torch.bfloat16)
    delta = b.float() @ a.float() if on_cpu_half else b @ a
    if getattr(head, "fan_in_fan_out", False):  # Conv1D-style heads store W transposed
        delta = delta.T
    return (delta * head.scaling[name]).to(b.dtype)


def _adapted(head: nn.Module) -> bool:
    """Whether `head` is a PEFT tuner layer whose adapters it applies now (enabled and not merged into W)."""
    layers = _peft_layers()
    return (
        layers is not None and isinstance(head, layers[0]) and not head.disable_adapters and not head.merged
    )


def check_live_head(head: nn.Module) -> None:
    """Refuse a head whose applied weight `live_head_weight` cannot read: an active DoRA adapter (its weight also
    rescales W's columns) or an active adapter of another kind than LoRA (IA3, LoHa, ...). Called when the loss is
    set up, before training, and again by every read (an adapter may be switched on later)."""
    if not _adapted(head):
        return
    if not isinstance(head, _peft_layers()[1]):
        kind = type(head).__module__.removeprefix("peft.tuners.").split(".")[0]  # e.g. "ia3", "loha"
        raise DistMatchConfigError(
            f"emo_cost_embedding='live' with a peft {kind!r} adapter on the LM head: only a LoRA adapter's "
            "effective head weight (W + BA) is read; use emo_cost_embedding='frozen', a LoRA adapter on the head, "
            "or no adapter on the head."
        )
    if any(name in head.lora_A and head.use_dora.get(name) for name in head.active_adapters):
        raise DistMatchConfigError(
            "emo_cost_embedding='live' with a DoRA adapter on the LM head: DoRA's effective head weight is not "
            "W + BA; use emo_cost_embedding='frozen' or a LoRA (not DoRA) adapter on the head."
        )


def live_head_weight(head: nn.Module) -> Tensor:
    """The weight the head applies now: for a PEFT LoRA layer on the head (unmerged, enabled), W + the active
    adapters' scaling * B A, not the frozen base W its `.weight` shows (other adapters: `check_live_head`). Any
    other head (also a disabled or merged adapter): its weight."""
    if not _adapted(head):
        return _head_weight(head)
    check_live_head(head)
    weight = _head_weight(head.get_base_layer())
    for name in head.active_adapters:
        if name in head.lora_A:
            weight = weight + _lora_delta(head, name)
    return weight


def frozen_head_copy(model: nn.Module) -> Tensor:
    """A detached copy of the model's output embedding, gathered whole under ZeRO-3 and FSDP2.

    Call it on every rank (ZeRO-3 gathering is collective). The copy is a plain tensor: not a parameter or buffer,
    so it is neither optimised nor saved in checkpoints. Tied input/output embeddings give one copy.
    """
    head = model.get_output_embeddings()
    weight = head.weight
    if is_deepspeed_zero3(weight):
        # present whenever a parameter is ZeRO-3 partitioned
        deepspeed = require("deepspeed", extra="deepspeed", feature="ZeRO-3 (gathering the output embedding)")

        with deepspeed.zero.GatheredParameters([weight], modifier_rank=None):
            return weight.detach().clone()
    weight = _head_weight(head)
    return weight.detach().clone() if weight is head.weight else weight  # a gathered DTensor is a new tensor


def training_vocab_size(model: Any) -> int | None:
    """The vocabulary of the model being trained: a model (its head's rows, also ZeRO-3 partitioned) or a local
    folder (its `config.json`); None when unknown (a hub id, no head). Reads no weights."""
    if model is None or isinstance(model, (str, os.PathLike)):
        return folder_vocab_size(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is None:
        return None
    return weight.ds_shape[0] if hasattr(weight, "ds_shape") else weight.shape[0]


__all__ = [
    "frozen_head_copy",
    "head_sharding",
    "is_deepspeed_zero3",
    "is_dtensor",
    "is_fsdp2_linear",
    "check_live_head",
    "live_head_weight",
    "training_vocab_size",
]
