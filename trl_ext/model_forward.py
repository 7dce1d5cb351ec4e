"""Compute a distmatch loss inside a causal LM's own forward, from its hidden states.

`install_loss_forward(model)` patches the forward of one model instance (like TRL's fused LM head): called with
`distmatch_loss=LossRequest(...)` it runs the backbone only, shifts, and returns per-token losses and statistics
from `trl_ext.losses` without building the `[B, T, V]` logits when that is safe; called without it, it is the
original forward, so generation, evaluation and TRL's own losses are unchanged. Going through the model's
forward keeps DDP / FSDP / DeepSpeed wrappers, PEFT and autocast in the loop.

Paths (chosen per call, reported in `DistMatchOutput.path` and logged once per model and path through the
`trl_ext.model_forward` logger at INFO):
* ``fused``: `fused_token_loss(hidden, lm_head.weight)`, chunked over tokens; a `logit_scale` is folded into the
  hidden states. Used for a linear head without bias, also when it is sharded: an FSDP2 unit (`fully_shard` of the
  head alone, accelerate's `[norm, lm_head]` / `[norm, embed_tokens, lm_head]` units) or DeepSpeed ZeRO-3
  partitioned. A sharded head computes the loss *inside its own module call* (its `forward` is swapped for the
  fused loss for that one call), so the wrapper's hooks do what they do for `lm_head(hidden)`: gather the weight
  before, release it after, gather it again for the backward, and hand the weight gradient to FSDP2's
  reduce-scatter / ZeRO-3's partitioned gradient (`tests/distributed/test_fsdp2.py`,
  `tests/distributed/test_zero3_fused.py`).
* ``logits``: the head module is called on the hidden states (its own hooks run: a PEFT adapter on the head),
  final-logit soft-capping is applied, then `token_loss` in chunks. Used when the head has a PEFT adapter or a
  bias, when the model soft-caps its logits, when the head's weight is a DTensor outside FSDP2 (tensor
  parallelism), or when `force_logits_path` is set.

This module only routes: EMO's cost embedding (which tensor, read when and how, also from a sharded or LoRA-adapted
head) comes from `trl_ext.cost_embedding.cost_in_forward`.
"""

from __future__ import annotations

import functools
import logging
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.utils import ModelOutput

from .anchor import Reference, head_weight, reference_hidden
from .cost_embedding import cost_in_forward
from .cost_embedding import (
    frozen_head_copy as frozen_head_copy,  # benchmarks/bench_sharded_loss.py imports it from here
)
from .cost_embedding.head import head_sharding, is_dtensor, is_fsdp2_linear
from .losses import IGNORE_INDEX, FusedSettings, TokenStats, fused_token_loss, token_loss

_PATCHED_FLAG = "_distmatch_forward_installed"
_LOGGED_FLAG = "_distmatch_paths_logged"
LOG = logging.getLogger(__name__)


@dataclass
class LossRequest:
    """What the trainer asks the patched forward to compute."""

    name: str
    params: dict[str, Any]
    # The fixed cost embedding of a loss that needs one (EMO), or None with `live_cost`: the current head, detached.
    cost_embedding: Tensor | None = None
    live_cost: bool = False
    force_logits_path: bool = False
    chunk_size: int | None = None
    # The anchored losses' frozen reference model (`trl_ext.anchor`): its hidden states and head go to the loss.
    reference: Reference | None = None
    # How the chunked and fused paths run (the run's `loss_chunk_memory_mb`, ... options); None: the environment's.
    settings: FusedSettings | None = None


@dataclass
class DistMatchOutput(ModelOutput):
    """Per-token loss `[B, T']` (0 where ignored), the matching mask and `TokenStats` (each `[B, T']`)."""

    per_token_loss: Tensor | None = None
    label_mask: Tensor | None = None
    stats: TokenStats | None = None
    path: str | None = None
    nonfinite_source: str | None = None  # set when a per-token loss is not finite: where it came from


def _logit_scale(config: Any) -> float:
    scale = getattr(config, "logit_scale", None)
    for unsupported in ("output_multiplier", "lm_head_multiplier", "logits_scaling"):
        if getattr(config, unsupported, None) not in (None, 1, 1.0):
            raise ValueError(
                f"This model scales its logits with `{unsupported}`, which distmatch losses do not support yet; "
                "train it with loss 'nll' or open an issue."
            )
    return 1.0 if scale is None else float(scale)


def choose_path(model: nn.Module, request: LossRequest) -> str:
    """Which path computes `request` for `model`: "fused" or "logits" (see the module docstring)."""
    head = model.get_output_embeddings()
    config = _text_config(model)
    if request.force_logits_path or getattr(config, "final_logit_softcapping", None):
        return "logits"
    linear = type(head) is nn.Linear or is_fsdp2_linear(head)
    if not linear or head.bias is not None:
        return "logits"  # PEFT tuner layer / modules_to_save wrapper, or a biased head
    if head_sharding(head) is None and is_dtensor(head.weight):
        return "logits"  # a DTensor head outside FSDP2 (tensor parallelism): its own forward knows its layout
    return "fused"


def _text_config(model: nn.Module) -> Any:
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def _log_path(model: nn.Module, path: str, sharding: str | None) -> None:
    logged = model.__dict__.setdefault(_LOGGED_FLAG, set())
    if (path, sharding) in logged:
        return
    logged.add((path, sharding))
    how = {
        "fused": "fused (hidden states x LM head weight in chunks; no [tokens, vocab] logits)",
        "logits": "logits (the LM head's full [tokens, vocab] logits, then the loss in chunks)",
    }[path]
    where = {
        None: "",
        "fsdp2": "; the head is an FSDP2 unit, gathered by its own hooks",
        "zero3": "; the head is DeepSpeed ZeRO-3 partitioned, gathered by its own hooks",
    }[sharding]
    LOG.info("distmatch loss path for %s: %s%s", type(model).__name__, how, where)


def _call_inside_head(head: nn.Module, fn: Any, hidden: Tensor) -> Any:
    """Run `fn(hidden)` as the head module's forward for one call, so that its sharding hooks run around it."""
    saved = head.__dict__.get("forward")
    head.forward = fn
    try:
        return head(hidden)
    finally:
        if saved is None:
            del head.forward
        else:
            head.forward = saved


def compute_request(
    model: nn.Module,
    hidden: Tensor,
    targets: Tensor,
    request: LossRequest,
    reference: tuple[Tensor, nn.Module] | None = None,
) -> DistMatchOutput:
    """Per-token loss of `request` for shifted `hidden` [B, T', d] and `targets` [B, T'] (`reference`: the anchored
    losses' reference model's shifted hidden states [B, T', d_ref] and its head module, computed without grad)."""
    head = model.get_output_embeddings()
    config = _text_config(model)
    path = choose_path(model, request)
    sharding = head_sharding(head)
    _log_path(model, path, sharding)
    targets = targets.to(hidden.device)
    flat_targets = targets.reshape(-1)
    params = dict(request.params)
    scale = _logit_scale(config)
    # EMO: the cost embedding this forward uses comes from `cost_embedding.cost_in_forward` (below, per path).
    needs_cost = request.live_cost or request.cost_embedding is not None
    holder: dict[str, Any] = {}
    if reference is not None:
        refuse_sharded_reference(model, request)
    if reference is not None and path == "fused":
        ref_hidden, ref_head = reference
        ref_hidden = ref_hidden.reshape(-1, ref_hidden.shape[-1])
        params["reference_hidden"] = ref_hidden * scale if scale != 1.0 else ref_hidden
        params["reference_weight"] = head_weight(ref_head)
    elif reference is not None:
        with torch.no_grad():
            ref_head = reference[1]
            if head_sharding(ref_head) == "zero3":
                ref_logits = torch.nn.functional.linear(reference[0], head_weight(ref_head), ref_head.bias)
            else:
                ref_logits = ref_head(reference[0])
            if scale != 1.0:
                ref_logits = ref_logits * scale
            cap = getattr(config, "final_logit_softcapping", None)
            if cap:
                ref_logits = torch.tanh(ref_logits / cap) * cap
        params["reference_logits"] = ref_logits.reshape(-1, ref_logits.shape[-1])
    if path == "fused":

        def fused(flat_hidden: Tensor) -> Tensor:
            weight = head.weight  # inside a sharded head's call: the gathered (unsharded) parameter
            if needs_cost:
                params["cost_embedding"] = cost_in_forward(
                    request.cost_embedding, request.live_cost, head, weight
                )
            flat_hidden = flat_hidden.to(weight.dtype)
            if scale != 1.0:
                flat_hidden = flat_hidden * scale
            holder["hidden"] = flat_hidden
            if sharding is None:  # a sharded head's gathered storage may be freed after its call
                holder["weight"] = weight
            loss, holder["stats"] = fused_token_loss(
                request.name,
                flat_hidden,
                weight,
                flat_targets,
                return_stats=True,
                chunk_size=request.chunk_size,
                settings=request.settings,
                **params,
            )
            return loss

        flat_hidden = hidden.reshape(-1, hidden.shape[-1])
        loss = fused(flat_hidden) if sharding is None else _call_inside_head(head, fused, flat_hidden)
        stats = holder["stats"]
    else:
        # The logits path: also a head with a LoRA adapter, whose W + BA is the live head (read before the head's
        # call, which may free a sharded head's gathered storage).
        if needs_cost:
            params["cost_embedding"] = cost_in_forward(request.cost_embedding, request.live_cost, head)
        logits = head(hidden)
        if scale != 1.0:
            logits = logits * scale
        cap = getattr(config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        loss, stats = token_loss(
            request.name,
            logits.reshape(-1, logits.shape[-1]),
            flat_targets,
            return_stats=True,
            chunk_size=request.chunk_size,
            settings=request.settings,
            **params,
        )
    shape = targets.shape
    stats = TokenStats(**{k: None if v is None else v.view(shape) for k, v in vars(stats).items()})
    source = None
    if not bool(torch.isfinite(loss.detach()).all()):  # one check per step; the diagnosis only when it fails
        fused = path == "fused"
        # A sharded head's gathered weight (and a live cost embedding taken from it) is not held after its call.
        readable = sharding is None or not request.live_cost
        source = nonfinite_source(
            (holder["hidden"] if fused else hidden).detach(),
            holder["weight"].detach() if fused and "weight" in holder else None,
            None if fused else logits.detach(),
            params.get("cost_embedding") if readable else None,
        )
    # Not a view: an FSDP2 root warns about a differentiable view output (in-place ops on it would skip its hook).
    per_token = loss.reshape(shape).clone()
    return DistMatchOutput(
        per_token_loss=per_token,
        label_mask=targets != IGNORE_INDEX,
        stats=stats,
        path=path,
        nonfinite_source=source,
    )


def refuse_sharded_reference(model: nn.Module, request: LossRequest) -> None:
    """The anchored losses' reference model with a sharded policy head: a separate reference model runs (ZeRO-3:
    prepared like the policy; FSDP2: sharded by the caller, `trl_ext.anchor`); LoRA's adapters-off reference is
    refused."""
    sharding = head_sharding(model.get_output_embeddings())
    reference = request.reference
    if sharding is None or (reference is not None and not reference.adapters_off):
        return
    raise ValueError(
        f"loss {request.name!r} with LoRA's reference (the adapters-off model) does not run with a sharded LM head "
        f"({'FSDP2' if sharding == 'fsdp2' else 'DeepSpeed ZeRO-3'}) yet; train it with full fine-tuning, ZeRO-2, "
        "DDP or one process."
    )


def nonfinite_source(
    hidden: Tensor, weight: Tensor | None, logits: Tensor | None, cost_embedding: Tensor | None
) -> str:
    """Where a non-finite per-token loss came from, checking the inputs in the order they are used."""
    if not bool(torch.isfinite(hidden).all()):
        return "the model's hidden states (the backbone's output, before the LM head)"
    if weight is not None and not bool(torch.isfinite(weight).all()):
        return "the LM head weight"
    if weight is not None:  # the fused path never holds the logits: recompute them in the head's dtype
        logits = hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype) @ weight.T
    if logits is not None and not bool(torch.isfinite(logits).all()):
        return f"the logits (hidden states x LM head overflow {logits.dtype})"
    if cost_embedding is not None and not bool(torch.isfinite(cost_embedding).all()):
        return "the EMO cost embedding (emo_cost_embedding)"
    return "the loss computation itself (its inputs and logits are finite)"


def install_loss_forward(model: nn.Module) -> None:
    """Patch `model.forward` (an HF causal LM instance, PEFT already unwrapped) to accept `distmatch_loss=`."""
    if getattr(model, _PATCHED_FLAG, False):
        return
    original_forward = model.forward
    if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        raise ValueError(
            f"{type(model).__name__} has no output embedding (LM head); distmatch losses need one."
        )

    @functools.wraps(type(model).forward)
    def forward(self: nn.Module, *args: Any, distmatch_loss: LossRequest | None = None, **kwargs: Any) -> Any:
        if distmatch_loss is None:
            return original_forward(*args, **kwargs)
        labels = kwargs.pop("labels", None)
        shift_labels = kwargs.pop("shift_labels", None)
        kwargs.pop("num_items_in_batch", None)
        kwargs["use_cache"] = (
            False  # packed batches: the block-diagonal mask needs no cache (TRL does the same)
        )
        if labels is None and shift_labels is None:
            raise ValueError("distmatch losses need `labels` (or pre-shifted `shift_labels`) in the batch.")
        hidden = self.base_model(*args, **kwargs).last_hidden_state
        reference = None
        if distmatch_loss.reference is not None:  # the anchored losses: the same inputs through the reference
            refuse_sharded_reference(self, distmatch_loss)  # before running it
            reference = reference_hidden(self, distmatch_loss.reference, args, kwargs)
        if shift_labels is None:  # the model's own shift: position t predicts label t + 1
            hidden, targets = hidden[:, :-1], labels[:, 1:]
            if reference is not None:
                reference = (reference[0][:, :-1], reference[1])
        else:  # context / sequence parallelism pass labels already shifted
            targets = shift_labels
        return compute_request(self, hidden, targets, distmatch_loss, reference)

    model.forward = types.MethodType(forward, model)
    setattr(model, _PATCHED_FLAG, True)
