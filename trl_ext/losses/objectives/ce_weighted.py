"""The CE-weighted family (ce, mixce, tailr, dft, eaft): L = sg(w) * l, one closed form for all of them.

Each member supplies only its detached per-token weight w(z, l, params) (l = -log p_y; None means w = 1). The
value is w * l and, because w carries no gradient, the logit gradient is w (p - 1_y), written once here for the
chunked / fused paths; the reference is autograd of sg(w) * l on the full logits.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import Tensor

from ..rowops import subtract_at_target
from ..spec import ChunkResult, FullLogits, LossSpec, Rows, Weight


def _rows(weight: Weight, r: Rows) -> ChunkResult:
    assert r.p is not None and r.ce is not None
    w = weight(r.z, r.ce, r.params)
    loss = r.ce if w is None else w * r.ce
    grad = None
    if r.want_grad:  # w (p - 1_y), the CE gradient scaled by the detached per-token weight
        grad = r.p
        if w is not None:
            grad.mul_(w.unsqueeze(1))
        subtract_at_target(grad, r.y, 1.0 if w is None else w)
    return ChunkResult(loss, grad, **r.stats)


def _reference(weight: Weight, f: FullLogits) -> tuple[Tensor, dict[str, Tensor]]:
    w = weight(f.z.detach(), f.ce.detach(), f.params)
    return (f.ce if w is None else w * f.ce), {}


def ce_weighted(name: str, summary: str, weight: Weight, **spec: Any) -> LossSpec:
    """The spec of a CE-weighted loss from its weight (plus `params`, `options`, ... of `LossSpec`)."""
    return LossSpec(
        name,
        summary,
        rows=functools.partial(_rows, weight),
        reference=functools.partial(_reference, weight),
        weight=weight,
        **spec,
    )
