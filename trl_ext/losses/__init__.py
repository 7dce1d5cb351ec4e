"""Distribution-matching token losses for SFT: EMO, GEM and the baselines, in one place.

Public API (docs/losses.md)::

    token_loss(name, logits[N, V], labels[N], **params) -> Tensor[N]
    fused_token_loss(name, hidden[N, d], weight[V, d], labels[N], **params) -> Tensor[N]

Per-token losses, 0 where ``labels == -100``; labels are already aligned with the rows; the caller reduces
(``loss.sum() / num_items_in_batch``). ``reference_token_loss`` is the readable full-logits ground truth.
``settings=FusedSettings(...)`` says how the chunks run (memory budget, logit dtype, d-weight accumulator, kernels).

Each loss is defined once, by its `LossSpec` in ``objectives/`` (math, parameters, user options, statistics);
``registry.LOSSES`` lists them.
"""

from .chunked import auto_chunk_size, fused_token_loss, token_loss
from .reference import reference_token_loss
from .registry import EMO_WEIGHTINGS, IGNORE_INDEX, LOSS_NAMES, LOSSES, OPTIONS, LossSpec, resolve
from .settings import FusedSettings
from .spec import TokenStats

__all__ = [
    "EMO_WEIGHTINGS",
    "FusedSettings",
    "IGNORE_INDEX",
    "LOSSES",
    "LOSS_NAMES",
    "OPTIONS",
    "LossSpec",
    "TokenStats",
    "auto_chunk_size",
    "fused_token_loss",
    "reference_token_loss",
    "resolve",
    "token_loss",
]
