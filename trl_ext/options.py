"""The user-facing loss options, shared by the TRL config and the Axolotl plugin (one name everywhere).

`LOSS_OPTIONS` lists each option with its default and help; `loss_params` maps a loss name and the options to
the keyword parameters of `trl_ext.losses.token_loss` / `fused_token_loss` (and validates them there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .losses import LOSS_NAMES, resolve

#: Our losses (names of `trl_ext.losses`). "ce" is the same objective as TRL's "nll" computed by our fused path.
DISTMATCH_LOSSES: tuple[str, ...] = LOSS_NAMES

EMO_COST_EMBEDDINGS = ("frozen", "live")


@dataclass(frozen=True)
class LossOption:
    name: str  # user-facing name (TRL flag / YAML key, Axolotl YAML key)
    default: Any
    help: str
    losses: tuple[str, ...]  # the losses it applies to
    param: str  # the keyword of the functional API


LOSS_OPTIONS: tuple[LossOption, ...] = (
    LossOption(
        "gem_beta",
        0.7,
        "GEM temperature beta (> 0) of the detached target distribution softmax(z / beta); 1.0 gives the CE "
        "gradient, smaller keeps more diversity (the GEM paper uses 0.7).",
        ("gem_linear", "gem_ls"),
        "beta",
    ),
    LossOption(
        "emo_cost_embedding",
        "frozen",
        "EMO transport-cost embedding: 'frozen' (a copy of the model's output embedding taken before training, the "
        "paper's choice), 'live' (the current LM head, detached, every step) or a path / hub id of another model "
        "with the same vocabulary whose output embedding is used.",
        ("emo",),
        "cost_embedding",
    ),
    LossOption(
        "emo_weighting",
        "emo1",
        "EMO's dynamic weighting: 'emo1' = 0.5 * (CE + sg(CE / DEMD) * DEMD) (logged value equals CE; the official "
        "instruction-tuning code) or 'emo2' = sg(DEMD / CE) * CE + DEMD (the official continual fine-tuning code).",
        ("emo",),
        "weighting",
    ),
    LossOption(
        "ce_entropy_coef",
        0.1,
        "Entropy bonus of the 'ce_entropy' baseline: CE - coef * entropy (the GEM paper's best value is 0.1).",
        ("ce_entropy",),
        "entropy_coef",
    ),
    LossOption(
        "tailr_gamma",
        0.5,
        "TaiLr coefficient in [0, 1]: CE weighted by sg(p) / (gamma + (1 - gamma) sg(p)); 0 is CE.",
        ("tailr",),
        "gamma",
    ),
    LossOption(
        "mixce_gamma",
        0.5,
        "MixCE coefficient in [0, 1]: CE weighted by gamma + (1 - gamma) sg(p); 1 is CE.",
        ("mixce",),
        "gamma",
    ),
)
OPTION_DEFAULTS: dict[str, Any] = {o.name: o.default for o in LOSS_OPTIONS}


def loss_params(
    loss: str, options: Mapping[str, Any], *, cost_embedding: torch.Tensor | None = None
) -> dict[str, Any]:
    """Functional-API parameters of `loss` from the user options (defaults where missing), validated.

    For EMO the caller resolves `emo_cost_embedding` to a tensor and passes it as `cost_embedding`; without it the
    other parameters are still validated (configuration time, before a model exists) and none is returned.
    """
    if loss not in DISTMATCH_LOSSES:
        raise ValueError(f"Unknown loss {loss!r}. Valid losses: {', '.join(DISTMATCH_LOSSES)}.")
    relevant = [o for o in LOSS_OPTIONS if loss in o.losses]
    params = {o.param: options.get(o.name, o.default) for o in relevant}
    if loss == "emo":
        check_emo_cost_embedding(params["cost_embedding"])
        params["cost_embedding"] = torch.empty(0, 0) if cost_embedding is None else cost_embedding
    try:
        resolved = resolve(loss, params)[1]
    except ValueError as err:  # name the user-facing option rather than the functional parameter
        message = str(err)
        for option in relevant:
            message = message.replace(f" {option.param}=", f" {option.name}=")
        raise ValueError(message) from None
    if loss == "emo" and cost_embedding is None:
        del resolved["cost_embedding"]
    return resolved


def check_emo_cost_embedding(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"emo_cost_embedding={value!r} is invalid; expected 'frozen', 'live' or a model path / hub id."
        )
    return value
