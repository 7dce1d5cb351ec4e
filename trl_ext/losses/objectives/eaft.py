"""`eaft`: Entropy-Adaptive Fine-Tuning (Diao et al., 2026), as its authors' code computes it.

w = sg((H_k / 3) ** alpha), H_k the entropy of the model's top-k next-token distribution renormalised
(softmax of the k largest logits; k = min(k, V)). The authors' code (merged into LLaMA-Factory as
`use_eaft_loss`) divides by 3.0; Axolotl's `use_eaft` does not (its weight is H_k ** alpha, 3 ** alpha times
ours: the same gradient direction, a constant factor on the loss and its scale).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .. import validation
from ..spec import Param, option
from .ce_weighted import ce_weighted

ENTROPY_SCALE = 3.0  # the authors' constant divisor of H_k

ALPHA = Param("alpha", 1.0, validation.non_negative, "exponent of the entropy weight (H_k / 3) ** alpha")
K = Param(
    "k", 20, validation.positive_int, "how many of the largest logits the entropy H_k is taken over", type=int
)


def topk_entropy(z: Tensor, k: int) -> Tensor:
    """Entropy of softmax over the min(k, V) largest entries of each row of `z`."""
    top = z.topk(min(k, z.shape[1]), dim=1, sorted=False).values
    log_q = top - top.logsumexp(dim=1, keepdim=True)
    return -(log_q.exp() * log_q).sum(dim=1)


def weight(z: Tensor, ce: Tensor, params: dict[str, Any]) -> Tensor:
    # >= 0 mathematically; clamped so a rounding error cannot give NaN under a fractional power.
    entropy = topk_entropy(z, params["k"]).clamp_min_(0.0)
    return (entropy / ENTROPY_SCALE).pow_(params["alpha"])


SPEC = ce_weighted(
    "eaft",
    "sg((H_k / 3) ** alpha) * l, H_k the entropy of the softmax over the k largest logits (Entropy-Adaptive "
    "Fine-Tuning, Diao et al., 2026, as the authors' code / LLaMA-Factory's `use_eaft_loss`; Axolotl's `use_eaft` "
    "leaves out the / 3: its loss is 3 ** alpha times this one)",
    weight,
    params=(ALPHA, K),
    options=(
        option(
            ALPHA,
            "eaft_alpha",
            "EAFT exponent alpha (>= 0) of the weight (H_k / 3) ** alpha (1.0: the authors' default; 0 is CE). "
            "Axolotl's use_eaft weights by H_k ** alpha, 3 ** alpha times more.",
        ),
        option(K, "eaft_k", "EAFT: the entropy H_k is taken over the k largest logits (the authors use 20)."),
    ),
)
