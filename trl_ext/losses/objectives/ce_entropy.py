"""`ce_entropy`: l - coef * H(p), the GEM paper's CE+Entropy baseline."""

from __future__ import annotations

from torch import Tensor

from .. import validation
from ..rowops import rowdot, subtract_at_target
from ..spec import ChunkResult, FullLogits, LossSpec, Param, Rows, option

COEF = Param("entropy_coef", 0.1, validation.non_negative, "weight of the entropy bonus")


def rows(r: Rows) -> ChunkResult:
    assert r.p is not None and r.ce is not None and r.lse is not None
    coef = r.params["entropy_coef"]
    entropy = r.stats.get("entropy")
    if entropy is None:
        entropy = r.lse - rowdot(r.p, r.z)
    loss = r.ce - coef * entropy
    grad = None
    if r.want_grad:
        # d(-H)/dz = p * (log p + H) = p * (z - lse + H); z is no longer needed, so reuse it.
        grad_entropy = r.z.sub_((r.lse - entropy).unsqueeze(1)).mul_(r.p).mul_(coef)
        grad = r.p.add_(grad_entropy)
        subtract_at_target(grad, r.y, 1.0)
    return ChunkResult(loss, grad, **r.stats)


def reference(f: FullLogits) -> tuple[Tensor, dict[str, Tensor]]:
    return f.ce - f.params["entropy_coef"] * f.entropy, {}


SPEC = LossSpec(
    "ce_entropy",
    "l - coef * H(p) (the GEM paper's CE+Entropy baseline)",
    rows,
    reference,
    params=(COEF,),
    options=(
        option(
            COEF,
            "ce_entropy_coef",
            "Entropy bonus of the 'ce_entropy' baseline: CE - coef * entropy (the GEM paper's best value is 0.1).",
        ),
    ),
)
