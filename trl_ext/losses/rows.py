"""The PyTorch closed forms of one chunk of rows: per-token loss, dL/dz and statistics, for every loss.

Both memory-efficient paths (`logits_path.py`, `fused_path.py`) call `chunk_math` on a chunk of valid rows whose fp32 logits they
own. It computes what every loss shares (z_y, and softmax(z), logsumexp, CE and the statistics when needed) and
hands the chunk to the loss's own closed form, `LossSpec.rows` (in `objectives/`), which returns the loss,
optionally the gradient of each row's loss w.r.t. its logits (closed form, not autograd) and the statistics.
Buffers are reused in place so a chunk costs about three (EMO: four) `rows x V` temporaries. Notation (as in
`reference.py` and docs/losses.md): z logits, y target, p = softmax(z), l = -log p_y, q = softmax(z / beta),
s_i = cosine(e_i, e_y), c = 1 - s.

`reference.py` computes the same quantities by autograd on full logits; tests hold the two equal.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .objectives.emo import EMO_EPS
from .registry import LOSSES
from .rowops import rowdot, softmax
from .spec import ChunkResult, Rows

__all__ = ["EMO_EPS", "ChunkResult", "chunk_math"]


def chunk_math(
    name: str,
    params: dict[str, Any],
    z: Tensor,
    y: Tensor,
    similarity: Tensor | None,
    *,
    want_grad: bool,
    want_stats: bool,
    reference: Tensor | None = None,
    similarity_scales: tuple[Tensor, Tensor] | None = None,
) -> ChunkResult:
    """Loss (and gradient, statistics) of valid rows `z` [n, V] with targets `y` [n].

    `z` is owned by the caller's chunk and may be overwritten. `similarity` ([n, V], losses with a cost embedding
    only, also overwritten) holds s_ij = cos(e_{y_i}, e_j) from the normalised cost embedding, or, with
    `similarity_scales` (row [n], column [V]), the raw dot products e_{y_i} . e_j that times row_i x column_j (the
    inverse norms) are the cosines; `reference` ([n, V], anchored losses only, may be overwritten) the reference
    model's logits of the same rows.
    """
    spec = LOSSES[name]
    if similarity is not None and similarity_scales is not None:
        similarity = similarity.mul_(similarity_scales[0].unsqueeze(1)).mul_(similarity_scales[1])
    z_y = z.gather(1, y.unsqueeze(1)).view(-1)
    stats: dict[str, Tensor] = {}
    if want_stats:
        stats["top1_correct"] = (z.argmax(dim=1) == y).to(z.dtype)
    r = Rows(z, y, z_y, params, similarity, want_grad, want_stats, stats, reference=reference)
    if spec.uses_softmax or want_stats:
        r.p, r.lse = softmax(z)
        r.ce = r.lse - z_y
        if want_stats:
            stats["entropy"] = r.lse - rowdot(r.p, z)
            stats["ce"] = r.ce
    return spec.rows(r)
