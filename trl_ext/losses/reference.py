"""Readable full-logits implementations, written the way the papers' official code computes them.

Plain autograd on the whole [N, V] logits (several full-size temporaries): the ground truth the chunked and
fused paths are tested against, and the place to read the math. Each loss's own part is its
`LossSpec.reference` (in `objectives/`); this module computes what they share. Not meant for training at scale.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .registry import (
    IGNORE_INDEX,
    check_floating,
    check_labels,
    check_reference,
    compute_dtype,
    resolve,
)
from .spec import FullLogits, TokenStats


def reference_token_loss(
    name: str,
    logits: Tensor,
    labels: Tensor,
    *,
    return_stats: bool = False,
    reference_logits: Tensor | None = None,
    **params: Any,
) -> Tensor | tuple[Tensor, TokenStats]:
    """Per-token loss `name` (0 where labels == -100), by autograd on full logits (`reference_logits`: the frozen
    reference model's logits, anchored losses only)."""
    check_floating("logits", logits, 2)
    check_labels(labels, logits.shape[0], logits.shape[1], logits.device)
    spec, params = resolve(name, params)
    ref = check_reference(
        name, spec.needs_reference, {"reference_logits": reference_logits}, logits, logits.shape[1]
    ).get("reference_logits")
    z = logits.to(compute_dtype(logits.dtype))
    valid = labels != IGNORE_INDEX
    y = torch.where(valid, labels.long(), 0)

    log_p = F.log_softmax(z, dim=-1)
    p = log_p.exp()
    log_p_y = log_p.gather(1, y.unsqueeze(1)).squeeze(1)
    entropy = -(p * log_p).sum(-1)
    token, extra = spec.reference(FullLogits(z, y, log_p, p, log_p_y, -log_p_y, entropy, params, ref))

    token = torch.where(valid, token, 0.0)
    if not return_stats:
        return token

    def masked(x: Tensor) -> Tensor:
        return torch.where(valid, x.detach(), 0.0)

    stats = TokenStats(
        ce=masked(-log_p_y),
        entropy=masked(entropy),
        top1_correct=masked((z.argmax(-1) == y).to(z.dtype)),
        **{key: masked(value) for key, value in extra.items()},
    )
    return token, stats
