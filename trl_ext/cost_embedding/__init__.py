"""EMO's transport-cost embedding (option `emo_cost_embedding`): where it comes from, its checks, how it is read,
and what the patched forward hands to the loss. The one place that knows about it; the TRL config, CLI and trainer,
the Axolotl args and the patched forward call the functions below.

Sources (`BUILTIN_SOURCES` and the rest):
* 'frozen' (the default, the paper's choice): a detached copy of the pre-trained LM head, taken once when the loss
  is set up (gathered whole under ZeRO-3 / FSDP2), neither optimised nor saved;
* 'live': the current head, detached, read in every forward (with a LoRA adapter on the head: W + scaling * B A);
* a path or hub id of another model with the same vocabulary: only its output-embedding tensor is read, from the
  safetensors file that holds it.

When:
* configuration time, no weights read: `check_configured(loss, options, model)` (the source exists, its
  `config.json` and safetensors header are intact, its vocabulary is the trained model's: `check_vocabulary`);
* setup, every rank: `resolve_cost_embedding(model, option)` -> (the fixed tensor or None, live?);
* every forward: `cost_in_forward(...)`, the tensor the loss gets.

Modules: `checkpoint` (another model as EMO reads it: the hub id, the vocabulary check, the [V, d] tensor; its
folder is read by `distmatch.model_folder`, the one reader of model folders), `head` (the training model's head:
sharding, its live weight through peft's public API, the frozen copy, its vocabulary).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from distmatch.errors import DistMatchConfigError

from ..anchor import OPTION as REFERENCE_OPTION
from ..anchor import check_reference_source
from ..losses import LOSSES
from ..options import cost_embedding_option
from .checkpoint import (
    BUILTIN_SOURCES,
    HUB_ID,
    check_cost_embedding_source,
    check_vocabulary,
    read_output_embedding,
)
from .head import (
    check_live_head,
    frozen_head_copy,
    head_sharding,
    is_deepspeed_zero3,
    live_head_weight,
    training_vocab_size,
)

#: Debugging aid: a folder; every rank saves the cost embedding (EMO) it trains with there (`rank<N>.pt`).
COST_EMBEDDING_DEBUG_ENV = "DISTMATCH_DEBUG_COST_EMBEDDING"


def check_configured(loss: str, options: Mapping[str, Any], model: Any = None) -> None:
    """Configuration time, no weights read: the cost embedding `loss` takes from `options` (nothing to check when
    the loss needs none or the option is not given), and the anchored losses' `anchor_reference` model, against the
    vocabulary of `model` (a model, a local folder, or None / a hub id: unknown)."""
    source = cost_embedding_option(loss)
    if source is not None and source in options:
        check_cost_embedding_source(options[source], training_vocab_size(model))
    if LOSSES[loss].needs_reference and options.get(REFERENCE_OPTION) is not None:  # another checkpoint
        check_reference_source(options[REFERENCE_OPTION], model)


def resolve_cost_embedding(model: nn.Module, option: str) -> tuple[Tensor | None, bool]:
    """EMO's cost embedding from the `emo_cost_embedding` option: (tensor, live?). Call it on every rank."""
    if option == "live":
        if is_deepspeed_zero3(model.get_output_embeddings().weight):
            raise ValueError(
                "emo_cost_embedding='live' reads the LM head outside its forward, where DeepSpeed ZeRO-3 keeps it "
                "partitioned; use emo_cost_embedding='frozen' (the paper's choice) or ZeRO-2."
            )
        check_live_head(model.get_output_embeddings())  # an adapter whose weight is not read: refused now
        return None, True
    if option == "frozen":
        embedding = frozen_head_copy(model)
        _check_finite(embedding, option)
        return embedding, False
    # Another model's output embedding: only that tensor is read (stored dtype), checked against our vocabulary.
    weight = model.get_output_embeddings().weight
    device = weight.device if weight.device.type != "meta" else None
    embedding = read_output_embedding(option, training_vocab_size(model))
    _check_finite(embedding, option)
    return embedding.to(device), False


def cost_in_forward(
    fixed: Tensor | None, live: bool, head: nn.Module, gathered: Tensor | None = None
) -> Tensor | None:
    """The cost embedding the loss gets in this forward: the `fixed` one (frozen / another model's), or with `live`
    the head's weight now, detached: `gathered` (the fused path passes the weight it multiplies, inside a sharded
    head's own call: the gathered parameter), else read here (`live_head_weight`: W + BA with a LoRA adapter; an
    FSDP2 unit's gathered parameter is copied, since the head's call may free its storage)."""
    if not live:
        return fixed
    if gathered is not None:
        return gathered.detach()
    weight = live_head_weight(head)
    if weight is head.weight and head_sharding(head) is not None:
        weight = weight.detach().clone()
    return weight.detach()


def _check_finite(embedding: Tensor, option: str) -> None:
    """A cost embedding with NaN / inf rows would make every EMO loss non-finite: refused before training."""
    bad = (~torch.isfinite(embedding)).any(dim=-1)
    if bool(bad.any()):
        rows = bad.nonzero().flatten()[:5].tolist()
        raise DistMatchConfigError(
            f"emo_cost_embedding={option!r}: the output embedding has non-finite values in {int(bad.sum())} row(s) "
            f"(first: {rows}); EMO's transport costs would be NaN. Use another checkpoint or emo_cost_embedding='live'."
        )


def save_for_debugging(cost_embedding: Tensor | None) -> None:
    """With `DISTMATCH_DEBUG_COST_EMBEDDING=<folder>`: this rank's cost embedding to `<folder>/rank<N>.pt`."""
    folder = os.environ.get(COST_EMBEDDING_DEBUG_ENV)
    if not folder or cost_embedding is None:
        return
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    Path(folder).mkdir(parents=True, exist_ok=True)
    torch.save(cost_embedding.detach().cpu(), Path(folder) / f"rank{rank}.pt")


__all__ = [
    "BUILTIN_SOURCES",
    "COST_EMBEDDING_DEBUG_ENV",
    "HUB_ID",
    "check_configured",
    "check_cost_embedding_source",
    "check_vocabulary",
    "cost_in_forward",
    "frozen_head_copy",
    "live_head_weight",
    "read_output_embedding",
    "resolve_cost_embedding",
    "save_for_debugging",
    "training_vocab_size",
]
