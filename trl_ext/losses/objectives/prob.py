"""`prob`: the probability family of "Beyond Log Likelihood" (Li et al., 2025), as its authors' code computes it.

Per token, with p_y the target probability: L = -(p_y ** q - 1) / q = (1 - p_y ** q) / q, and L = -log p_y (CE)
at q = 0 (the limit, taken exactly). q = 1 (the default) is 1 - p_y, the authors' objective `p`. The gradient is
p_y ** q (p - 1_y): CE's gradient scaled by p_y ** q (no stop-gradient is needed: it is the true derivative).

Thresholds (the authors' `OnlyTopP-t` / `OnlyBottomP-t`, and with q = 0 `OnlyTopLogP-t` / `OnlyBottomLogP-t`): only
tokens with min_p <= p_y <= max_p are kept, the others count 0 (the comparison carries no gradient). The defaults
0 and 1 keep every token. The authors' code divides the kept tokens' sum by the number of *kept* tokens; here a
dropped token is a 0 in the usual sum / number of target tokens (docs/losses.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .. import validation
from ..rowops import subtract_at_target
from ..spec import ChunkResult, FullLogits, LossSpec, Param, Rows, option


def _min_p(value: Any) -> str | None:
    ok = validation.unit_interval(value) is None and value < 1.0
    return None if ok else "a number in [0, 1) (tokens with p_y >= prob_min_p are kept; 0 keeps all)"


def _max_p(value: Any) -> str | None:
    ok = validation.unit_interval(value) is None and value > 0.0
    return None if ok else "a number in (0, 1] (tokens with p_y <= prob_max_p are kept; 1 keeps all)"


#: The largest exponent: the gradient is p_y ** q times the cross-entropy's, so a larger q trains almost no token
#: (q = 1e300 gives loss 0 and gradient 0 at every step).
MAX_Q = 10.0


def _q(value: Any) -> str | None:
    ok = validation.non_negative(value) is None and value <= MAX_Q
    return (
        None
        if ok
        else (
            f"a number >= 0 and <= {MAX_Q:g} (the gradient is p_y ** q times the cross-entropy's: a larger q trains "
            "almost no token)"
        )
    )


Q = Param("q", 1.0, _q, "exponent q of -(p_y ** q - 1) / q (1: 1 - p_y; 0: CE)")
MIN_P = Param("min_p", 0.0, _min_p, "keep only tokens with p_y >= min_p (the authors' OnlyTopP threshold)")
MAX_P = Param("max_p", 1.0, _max_p, "keep only tokens with p_y <= max_p (the authors' OnlyBottomP threshold)")


def check(params: dict[str, Any]) -> str | None:
    if params["min_p"] >= params["max_p"]:
        relation = ">" if params["min_p"] > params["max_p"] else "="
        return (
            f"min_p={params['min_p']!r} {relation} max_p={params['max_p']!r} keeps no token (the kept tokens have p_y "
            "between the lower and the upper bound); lower the first or raise the second."
        )
    return None


def _keep(p_y: Tensor, params: dict[str, Any]) -> Tensor | None:
    """1.0 where min_p <= p_y <= max_p, else 0 (None when both bounds are at their keep-all defaults)."""
    if params["min_p"] == 0.0 and params["max_p"] == 1.0:
        return None
    return ((p_y >= params["min_p"]) & (p_y <= params["max_p"])).to(p_y.dtype)


def _value(ce: Tensor, q: float) -> Tensor:
    # (1 - exp(-q l)) / q, written with expm1 so that small q loses nothing to cancellation.
    return ce.clone() if q == 0.0 else torch.expm1(-q * ce).neg_().div_(q)


def rows(r: Rows) -> ChunkResult:
    assert r.p is not None and r.ce is not None
    q = float(r.params["q"])
    p_y_q = torch.exp(-q * r.ce)  # p_y ** q
    keep = _keep(torch.exp(-r.ce), r.params)
    weight = p_y_q if keep is None else p_y_q * keep
    loss = _value(r.ce, q)
    if keep is not None:
        loss = loss * keep
    grad = None
    if r.want_grad:  # p_y ** q (p - 1_y), 0 on dropped tokens
        grad = r.p.mul_(weight.unsqueeze(1))
        subtract_at_target(grad, r.y, weight)
    return ChunkResult(loss, grad, **r.stats)


def reference(f: FullLogits) -> tuple[Tensor, dict[str, Tensor]]:
    q = float(f.params["q"])
    # The authors' form: -(exp(q * log p_y) - 1) / q, and -log p_y at q = 0.
    loss = -f.log_p_y if q == 0.0 else -(torch.exp(q * f.log_p_y) - 1.0) / q
    keep = _keep(f.log_p_y.detach().exp(), f.params)
    return (loss if keep is None else loss * keep), {}


SPEC = LossSpec(
    "prob",
    "(1 - p_y ** q) / q, -log p_y at q = 0, on the tokens with min_p <= p_y <= max_p (the probability family of "
    "Beyond Log Likelihood, Li et al., 2025: q = 1 is 1 - p_y, their `p`; thresholds their OnlyTopP / OnlyBottomP)",
    rows,
    reference,
    params=(Q, MIN_P, MAX_P),
    options=(
        option(
            Q, "prob_q", "Exponent q >= 0 of the 'prob' loss (1 - p ** q) / q: 1 (default) is 1 - p, 0 is CE."
        ),
        option(
            MIN_P,
            "prob_min_p",
            "'prob' loss: train only on tokens whose probability is >= this, in [0, 1) (the paper's OnlyTopP; "
            "default 0 keeps all).",
        ),
        option(
            MAX_P,
            "prob_max_p",
            "'prob' loss: train only on tokens whose probability is <= this, in (0, 1] (the paper's OnlyBottomP; "
            "default 1 keeps all).",
        ),
    ),
    check=check,
)
