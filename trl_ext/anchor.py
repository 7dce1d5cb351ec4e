"""The frozen reference model of the anchored losses (`asft`, `sft_kl`): taken once, never trained, run without
gradients, its hidden states and head handed to the loss (which builds its logits chunk by chunk).

* Full fine-tuning: a copy of the model as it is when the trainer sets the loss up (the starting checkpoint), in the
  training dtype, in eval mode, every parameter frozen, kept outside the trained module (not optimised, not saved).
* PEFT (LoRA): no copy. The reference is the trained model itself with its adapters switched off for the reference
  forward (as the ASFT authors' code does with `model.disable_adapter()`); the base weights are frozen under LoRA.
* DeepSpeed ZeRO-3 (full fine-tuning): the partitioned model holds no whole copy to take, so the reference is
  loaded from the starting checkpoint (`name_or_path`) or the given folder under the active ZeRO-3 config, and
  prepared like the policy (an inference engine of the trainer's DeepSpeed config, as TRL does for DPO's reference):
  partitioned, its shards gathered layer by layer in its forward, its head's weight gathered for the loss.
* FSDP2 (`fully_shard` under torchrun): a reference model sharded like the policy by the caller
  (`Reference(model=...)`) runs as its root's forward, so its units gather their shards; its head's weight is
  gathered (`full_tensor()`) for the loss.
* Another checkpoint (`anchor_reference: <model folder>`): loaded once with transformers, in the training dtype, on
  the trained model's device, frozen like the copy. `check_reference_source` refuses a folder without a config.json,
  with another vocabulary (config.json `vocab_size`, tokenizer.json's vocabulary) or with incomplete weights at
  configuration time, before any model loads (the folder read by `distmatch.model_folder`); the loaded head's rows
  are checked again.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from distmatch.errors import DistMatchConfigError
from distmatch.model_folder import FolderOption, open_model_folder, tokenizer_vocab

from .losses.objectives.anchored import INITIAL

OPTION = "anchor_reference"
#: Debugging aid: a folder; every rank writes how its reference model is held there (`rank<N>.json`).
REFERENCE_DEBUG_ENV = "DISTMATCH_DEBUG_REFERENCE"


@dataclass
class Reference:
    """Where the reference's forward comes from: a frozen copy (`model`), or the trained model, adapters off."""

    model: nn.Module | None = None  # None: the trained model with its adapters disabled
    # The PEFT-wrapped model's modules (its `_disable_adapters` flags) when `model` is None.
    adapters_off: bool = False
    # DeepSpeed ZeRO-3: the engine prepared around `model` (its call gathers the partitioned parameters; `model`'s
    # forward then returns the final hidden states only).
    engine: Any = None


def has_adapters(model: nn.Module) -> bool:
    return any(hasattr(m, "_disable_adapters") for m in model.modules())


def check_reference_source(value: Any, trained: Any = None) -> None:
    """Configuration time, no weights read: `anchor_reference` is 'initial' or a model folder whose vocabulary is
    the trained model's (`trained`: its folder, or a model, or None / a hub id: unknown, config size only) and whose
    weights are complete. The folders are read by `distmatch.model_folder`, as EMO's cost embedding's are."""
    if value == INITIAL:
        return
    if not isinstance(value, str) or not value:
        raise DistMatchConfigError(
            f"{OPTION}={value!r} is invalid; expected {INITIAL!r} or the folder of a model with the same vocabulary."
        )
    reference = open_model_folder(
        value, FolderOption(f"{OPTION}={value!r}", f"use {INITIAL!r} (the starting model)")
    )
    from .cost_embedding.head import training_vocab_size  # (the package imports this module: not at the top)

    theirs, ours = reference.vocab_size, training_vocab_size(trained)
    if theirs is not None and ours is not None and theirs != ours:
        raise DistMatchConfigError(
            f"{OPTION}={value!r} has a vocabulary of {theirs} tokens but the model being trained has {ours}; the "
            "reference model must share the tokenizer."
        )
    mine = tokenizer_vocab(trained) if isinstance(trained, (str, os.PathLike)) else None  # (a model: unknown)
    other = reference.tokenizer_vocab()
    if mine is not None and other is not None and mine != other:
        differ = sorted(set(mine.items()) ^ set(other.items()), key=str)[:1]
        raise DistMatchConfigError(
            f"{OPTION}={value!r}: its tokenizer.json maps tokens to ids differently from the trained model's "
            f"(first difference: {differ[0]!r}); the reference model must share the tokenizer."
        )
    reference.check_weights()  # no weight file, or one cut short: it would fail after the model loads


def training_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the trained model's floating-point parameters (float32 when it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def load_reference(model: nn.Module, value: str) -> nn.Module:
    """The model in folder `value`, loaded once in `model`'s training dtype on its device, frozen and in eval mode."""
    from transformers import AutoModelForCausalLM

    check_reference_source(value, model)
    loaded = AutoModelForCausalLM.from_pretrained(str(Path(value).expanduser()), dtype=training_dtype(model))
    weight = next((p for p in model.parameters() if p.device.type != "meta"), None)
    if weight is not None:
        loaded.to(weight.device)
    loaded.eval()
    loaded.requires_grad_(False)
    from .cost_embedding.head import training_vocab_size

    rows, ours = loaded.get_output_embeddings().weight.shape[0], training_vocab_size(model)
    if ours is not None and rows != ours:
        raise DistMatchConfigError(
            f"{OPTION}={value!r}: its LM head has {rows} rows but the model being trained has {ours}; the "
            "reference model must share the tokenizer."
        )
    return loaded


def _zero3(model: nn.Module) -> bool:
    return any(hasattr(p, "ds_id") and hasattr(p, "ds_status") for p in model.parameters())


def _hidden_only(self: nn.Module, *args: Any, **kwargs: Any) -> Tensor:
    return self.base_model(*args, **kwargs).last_hidden_state


def prepare_zero3(model: nn.Module, source: str, accelerator: Any) -> Reference:
    """DeepSpeed ZeRO-3: the reference loaded from `source` (the starting checkpoint's folder or hub id for
    'initial', whose weights the partitioned model no longer holds whole) under the active ZeRO-3 config (so
    partitioned like the policy as it loads) and prepared like the policy, as TRL prepares DPO's reference model:
    an inference engine of the trainer's DeepSpeed config, whose call gathers each layer's shards."""
    import deepspeed

    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    if plugin is None:
        raise ValueError(
            "the anchored losses' reference under DeepSpeed ZeRO-3 needs the trainer's DeepSpeed plugin."
        )
    path = model.name_or_path if source == INITIAL else source
    if not path:
        raise ValueError(
            "the anchored losses under DeepSpeed ZeRO-3 reload the starting model for the reference, but the model "
            f"has no name_or_path; set {OPTION} to its folder."
        )
    if source != INITIAL:
        check_reference_source(source, model)
    loaded = _load(model, path)
    loaded.forward = types.MethodType(_hidden_only, loaded)
    config = copy.deepcopy(plugin.deepspeed_config)
    config.pop("optimizer", None)
    config.pop("scheduler", None)
    engine, *_ = deepspeed.initialize(model=loaded, config=config)
    engine.eval()
    return Reference(model=loaded, engine=engine)


def _load(model: nn.Module, path: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=training_dtype(model))
    loaded.eval()
    loaded.requires_grad_(False)
    return loaded


def make_reference(
    model: nn.Module, peft_wrapped: bool, source: str = INITIAL, accelerator: Any = None
) -> Reference:
    """The reference of `model` (PEFT-unwrapped; `peft_wrapped`: it carries adapters) from `source` (the
    `anchor_reference` option): see the module docstring."""
    lora = peft_wrapped and has_adapters(model) and source == INITIAL
    if _zero3(model) and not lora:
        return prepare_zero3(model, source, accelerator)
    if source != INITIAL:
        return Reference(model=load_reference(model, source))
    if lora:
        return Reference(model=None, adapters_off=True)
    frozen = copy.deepcopy(model)
    frozen.eval()
    frozen.requires_grad_(False)
    return Reference(model=frozen)


def save_for_debugging(reference: Reference) -> None:
    """With `DISTMATCH_DEBUG_REFERENCE=<folder>`: how this rank holds the reference, to `<folder>/rank<N>.json`
    (a DeepSpeed engine or not, the number of parameters and of ZeRO-3 partitioned ones, their local elements)."""
    folder = os.environ.get(REFERENCE_DEBUG_ENV)
    if not folder:
        return
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    params = [] if reference.model is None else list(reference.model.parameters())
    record = {
        "engine": reference.engine is not None,
        "adapters_off": reference.adapters_off,
        "parameters": len(params),
        "partitioned": sum(hasattr(p, "ds_id") for p in params),
        "local_elements": sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params),
    }
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps(record))


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


def head_weight(head: nn.Module) -> Tensor:
    """The reference head's whole weight (no gradient flows into it): an FSDP2 (DTensor) one gathered with
    `full_tensor()`, a ZeRO-3 partitioned one gathered and copied, since its gathered storage is released after the
    gather (both collectives: every rank)."""
    from .cost_embedding.head import is_dtensor  # (the package imports this module)

    weight = head.weight
    if is_dtensor(weight):
        return weight.detach().full_tensor()
    if not (hasattr(weight, "ds_id") and hasattr(weight, "ds_status")):
        return weight
    import deepspeed

    with deepspeed.zero.GatheredParameters([weight], modifier_rank=None):
        return weight.detach().clone()


def reference_hidden(
    trained: nn.Module, reference: Reference, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Tensor, nn.Module]:
    """The reference's final hidden states for the same inputs (no gradient) and the module of its LM head."""
    with torch.no_grad():
        # ZeRO-3: the engine's call gathers the shards (its forward: hidden only)
        if reference.engine is not None:
            return reference.engine(*args, **kwargs), reference.model.get_output_embeddings()
        # called as the root's forward, so that an FSDP2 root unit's hooks run
        if reference.model is not None:
            model = reference.model
            saved = model.__dict__.get("forward")
            model.forward = types.MethodType(_hidden_only, model)
            try:
                hidden = model(*args, **kwargs)
            finally:
                if saved is None:
                    del model.forward
                else:
                    model.forward = saved
            return hidden, model.get_output_embeddings()
        with adapters_disabled(trained):
            hidden = trained.base_model(*args, **kwargs).last_hidden_state
        return hidden, base_head(trained.get_output_embeddings())
