"""Compute a distmatch loss inside a causal LM's own forward, from its hidden states.

`install_loss_forward(model)` patches the forward of one model instance (like TRL's fused LM head): called with
`distmatch_loss=LossRequest(...)` it runs the backbone only, shifts, and returns per-token losses and statistics
from `trl_ext.losses` without building the `[B, T, V]` logits when that is safe; called without it, it is the
original forward, so generation, evaluation and TRL's own losses are unchanged. Going through the model's
forward keeps DDP / FSDP / DeepSpeed wrappers, PEFT and autocast in the loop.

Paths (chosen per call, reported in `DistMatchOutput.path`):
* ``fused``: `fused_token_loss(hidden, lm_head.weight)`, chunked over tokens. Used for a plain linear head
  (FSDP2 DTensor heads are gathered once with `full_tensor()`; a `logit_scale` is folded into the hidden states).
* ``logits``: the head module is called on the hidden states (its own hooks run: a PEFT adapter on the head,
  DeepSpeed ZeRO-3 gathering), final-logit soft-capping is applied, then `token_loss` in chunks. Used when the head
  has a PEFT adapter or a bias, when the model soft-caps its logits, or under DeepSpeed ZeRO-3.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.utils import ModelOutput

from .losses import IGNORE_INDEX, TokenStats, fused_token_loss, token_loss

_PATCHED_FLAG = "_distmatch_forward_installed"


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


@dataclass
class DistMatchOutput(ModelOutput):
    """Per-token loss `[B, T']` (0 where ignored), the matching mask and `TokenStats` (each `[B, T']`)."""

    per_token_loss: Tensor | None = None
    label_mask: Tensor | None = None
    stats: TokenStats | None = None
    path: str | None = None
    nonfinite_source: str | None = None  # set when a per-token loss is not finite: where it came from


def _is_deepspeed_zero3(param: Tensor) -> bool:
    return hasattr(param, "ds_id") and hasattr(param, "ds_status")


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
    head = model.get_output_embeddings()
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if request.force_logits_path or getattr(config, "final_logit_softcapping", None):
        return "logits"
    if type(head) is not nn.Linear or head.bias is not None or _is_deepspeed_zero3(head.weight):
        return (
            "logits"  # PEFT tuner layer / modules_to_save wrapper, biased head, or ZeRO-3 partitioned weight
        )
    return "fused"


def _head_weight(head: nn.Module) -> Tensor:
    weight = head.weight
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return weight
    return weight.full_tensor() if isinstance(weight, DTensor) else weight


def compute_request(
    model: nn.Module, hidden: Tensor, targets: Tensor, request: LossRequest
) -> DistMatchOutput:
    """Per-token loss of `request` for shifted `hidden` [B, T', d] and `targets` [B, T']."""
    head = model.get_output_embeddings()
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    path = choose_path(model, request)
    targets = targets.to(hidden.device)
    flat_targets = targets.reshape(-1)
    params = dict(request.params)
    if request.live_cost:
        params["cost_embedding"] = _head_weight(head).detach()
    elif request.cost_embedding is not None:
        params["cost_embedding"] = request.cost_embedding
    if path == "fused":
        weight = _head_weight(head)
        flat_hidden = hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype)
        scale = _logit_scale(config)
        if scale != 1.0:
            flat_hidden = flat_hidden * scale
        loss, stats = fused_token_loss(
            request.name,
            flat_hidden,
            weight,
            flat_targets,
            return_stats=True,
            chunk_size=request.chunk_size,
            **params,
        )
    else:
        logits = head(hidden)
        scale = _logit_scale(config)
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
            **params,
        )
    shape = targets.shape
    stats = TokenStats(**{k: None if v is None else v.view(shape) for k, v in vars(stats).items()})
    source = None
    if not bool(torch.isfinite(loss.detach()).all()):  # one check per step; the diagnosis only when it fails
        source = nonfinite_source(
            (flat_hidden if path == "fused" else hidden).detach(),
            None if path != "fused" else weight.detach(),
            None if path == "fused" else logits.detach(),
            params.get("cost_embedding"),
        )
    return DistMatchOutput(
        per_token_loss=loss.view(shape),
        label_mask=targets != IGNORE_INDEX,
        stats=stats,
        path=path,
        nonfinite_source=source,
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
        if shift_labels is None:  # the model's own shift: position t predicts label t + 1
            hidden, targets = hidden[:, :-1], labels[:, 1:]
        else:  # context / sequence parallelism pass labels already shifted
            targets = shift_labels
        return compute_request(self, hidden, targets, distmatch_loss)

    model.forward = types.MethodType(forward, model)
    setattr(model, _PATCHED_FLAG, True)


def frozen_head_copy(model: nn.Module) -> Tensor:
    """A detached copy of the model's output embedding, gathered whole under ZeRO-3 and FSDP2.

    Call it on every rank (ZeRO-3 gathering is collective). The copy is a plain tensor: not a parameter or buffer,
    so it is neither optimised nor saved in checkpoints. Tied input/output embeddings give one copy.
    """
    head = model.get_output_embeddings()
    weight = head.weight
    if _is_deepspeed_zero3(weight):
        import deepspeed  # present whenever a parameter is ZeRO-3 partitioned

        with deepspeed.zero.GatheredParameters([weight], modifier_rank=None):
            return weight.detach().clone()
    return _head_weight(head).detach().clone()


def resolve_cost_embedding(model: nn.Module, option: str) -> tuple[Tensor | None, bool]:
    """EMO's cost embedding from the `emo_cost_embedding` option: (tensor, live?)."""
    if option == "live":
        if _is_deepspeed_zero3(model.get_output_embeddings().weight):
            raise ValueError(
                "emo_cost_embedding='live' reads the LM head outside its forward, where DeepSpeed ZeRO-3 keeps it "
                "partitioned; use emo_cost_embedding='frozen' (the paper's choice) or ZeRO-2."
            )
        return None, True
    if option == "frozen":
        embedding = frozen_head_copy(model)
        _check_finite(embedding, option)
        return embedding, False
    # Another model's output embedding: only that tensor is read (stored dtype), checked against our vocabulary.
    from .emo_cost import read_output_embedding

    weight = model.get_output_embeddings().weight
    vocab = weight.ds_shape[0] if _is_deepspeed_zero3(weight) else weight.shape[0]
    device = weight.device if weight.device.type != "meta" else None
    embedding = read_output_embedding(option, vocab)
    _check_finite(embedding, option)
    return embedding.to(device), False


def _check_finite(embedding: Tensor, option: str) -> None:
    """A cost embedding with NaN / inf rows would make every EMO loss non-finite: refused before training."""
    bad = (~torch.isfinite(embedding)).any(dim=-1)
    if bool(bad.any()):
        from .checks import DistMatchConfigError

        rows = bad.nonzero().flatten()[:5].tolist()
        raise DistMatchConfigError(
            f"emo_cost_embedding={option!r}: the output embedding has non-finite values in {int(bad.sum())} row(s) "
            f"(first: {rows}); EMO's transport costs would be NaN. Use another checkpoint or emo_cost_embedding='live'."
        )
