"""What a loss is: the `LossSpec` every loss module fills in, and the data its math entry points exchange.

A loss is defined in one module of `trl_ext.losses.objectives` (one short file per loss or family) and
listed once in `registry.LOSSES`. Its spec holds everything the rest of the code needs to know about it:

* its math: `rows` (closed-form value, logit gradient and statistics of one chunk of rows, used by the chunked
  and fused paths) and `reference` (readable autograd on full logits, the ground truth in tests); the
  CE-weighted losses give only a detached per-token `weight` (`objectives/ce_weighted.py` writes both for them);
* `params` (keywords of `token_loss` / `fused_token_loss`, with default, check and doc) and `options` (the
  user-facing names in TRL, Axolotl and the `trl sft` hook, with help and choices);
* `stats` it adds to the logged statistics, whether it `needs_cost_embedding`, whether the Triton row kernel
  implements it (`triton`).

This module holds no loss math and imports nothing from the package but the Triton kernel's `N_COEF`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

# How many coefficients of its logit gradient the Triton kernel stores per row, for a later gradient-only pass over
# a vocabulary tile (DISTMATCH_GRAD_WEIGHT_ACCUM=tiles); the slots are named in `kernel_contract.Coef`.
from .kernel_contract import N_COEF

#: Default of a parameter the caller must always give (EMO's cost embedding).
REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()

Check = Callable[[Any], "str | None"]  # None when valid, else what is expected ("a number in [0, 1]")


@dataclass(frozen=True)
class Param:
    """A keyword parameter of the functional API for one loss."""

    name: str
    default: Any
    check: Check
    doc: str
    type: type = float
    choices: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class Option:
    """A user-facing option: a `DistMatchSFTConfig` field / `trl sft` flag, an Axolotl YAML key.

    `param` is the functional parameter it sets. With `from_model=True` the option does not hold the parameter's
    value but says where the integration gets it from the model being trained (EMO's cost embedding:
    'frozen' / 'live' / a model path); `check` then validates the option's own value.
    """

    name: str
    param: str
    default: Any
    help: str
    check: Check
    type: type = float
    choices: tuple[Any, ...] | None = None
    from_model: bool = False


def option(param: Param, name: str, help: str) -> Option:
    """The user-facing option `name` for `param`: same default, check and choices (defined once, in `param`)."""
    return Option(name, param.name, param.default, help, param.check, param.type, param.choices)


@dataclass
class TokenStats:
    """Detached per-token statistics (0 at ignored rows) for logging next to the objective."""

    ce: Tensor
    entropy: Tensor
    top1_correct: Tensor
    demd: Tensor | None = None  # EMO
    kl: Tensor | None = None  # the anchored losses: KL(p_ref || p_theta) to the reference model


#: Statistics every loss reports; a spec's `stats` names the extra `TokenStats` fields it fills.
BASE_STATS = ("ce", "entropy", "top1_correct")


@dataclass
class ChunkResult:
    """What a closed form returns for one chunk of n rows."""

    loss: Tensor  # [n]
    grad: Tensor | None  # [n, V] dL_i/dz_i, or None when not requested
    ce: Tensor | None = None  # [n] statistics, when requested
    entropy: Tensor | None = None
    top1_correct: Tensor | None = None
    demd: Tensor | None = None
    kl: Tensor | None = None


@dataclass
class Rows:
    """One chunk of valid rows, as `LossSpec.rows` receives it (float32, or float64 in tests).

    `z` [n, V] belongs to the chunk and may be overwritten once no longer needed; `p` (a new buffer) may be too.
    `p`, `lse`, `ce` are set when the spec `uses_softmax` or statistics are wanted. `stats` already holds
    `top1_correct` and, with statistics, `ce` and `entropy`; the loss adds its own and passes them on.
    """

    z: Tensor
    y: Tensor  # [n] targets
    z_y: Tensor  # [n]
    params: dict[str, Any]
    # [n, V] cos(e_{y_i}, e_j) for a loss with a cost embedding (may be overwritten)
    similarity: Tensor | None
    want_grad: bool
    want_stats: bool
    stats: dict[str, Tensor]
    p: Tensor | None = None  # softmax(z)
    lse: Tensor | None = None  # logsumexp(z)
    ce: Tensor | None = None  # lse - z_y
    reference: Tensor | None = None  # [n, V] the reference model's logits of these rows (anchored losses)


@dataclass
class FullLogits:
    """All rows with their full logits, as `LossSpec.reference` receives them (autograd flows through `z`)."""

    z: Tensor  # [N, V] in the compute dtype
    y: Tensor  # [N] targets, 0 at ignored rows
    log_p: Tensor  # log_softmax(z)
    p: Tensor
    log_p_y: Tensor  # [N]
    ce: Tensor  # -log_p_y
    entropy: Tensor  # [N]
    params: dict[str, Any]  # validated, defaults filled in (a cost embedding as given)
    reference: Tensor | None = None  # [N, V] the reference model's logits, detached (anchored losses)


#: A detached per-token weight w(z, l, params) of a CE-weighted loss (l = -log p_y), or None for weight 1.
Weight = Callable[[Tensor, Tensor, dict[str, Any]], "Tensor | None"]


@dataclass(frozen=True)
class LossSpec:
    name: str
    summary: str  # one line: the formula and its source
    rows: Callable[[Rows], ChunkResult]
    reference: Callable[[FullLogits], tuple[Tensor, dict[str, Tensor]]]  # token loss, extra statistics
    params: tuple[Param, ...] = ()
    options: tuple[Option, ...] = ()
    stats: tuple[str, ...] = ()  # extra `TokenStats` fields it fills (EMO: "demd")
    needs_cost_embedding: bool = False
    #: the reference model's logits enter its math (`reference_logits=`, or `reference_hidden=` +
    #: `reference_weight=` on the fused path): the anchored losses
    needs_reference: bool = False
    uses_softmax: bool = True  # False: its closed form never needs softmax(z) (GEM)
    triton: bool = False  # the Triton row kernel implements it
    weight: Weight | None = None  # CE-weighted losses: their detached per-token weight
    #: a check of the parameters together (after each one's own check): None when valid, else what is wrong
    check: Callable[[dict[str, Any]], str | None] | None = None

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


__all__ = [
    "BASE_STATS",
    "N_COEF",
    "REQUIRED",
    "ChunkResult",
    "FullLogits",
    "LossSpec",
    "Option",
    "Param",
    "Rows",
    "TokenStats",
    "Weight",
    "option",
]
