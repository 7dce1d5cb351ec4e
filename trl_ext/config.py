"""`DistMatchSFTConfig`: TRL's `SFTConfig` plus the loss options (`--loss emo`, `gem_beta: 0.7`, ...).

The option fields are built from the loss specs (`trl_ext.options.LOSS_OPTIONS`): name, type, default, help and
choices come from the loss that defines the option, so `--help`, YAML configs and validation follow it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trl import SFTConfig

from .options import DISTMATCH_LOSSES, EMO_COST_EMBEDDINGS, LOSS_OPTIONS, loss_params

# TRL 1.7 - 1.14 declare `loss_type: str | None = None` without `choices` (the values are only in the help text).
_TRL_LOSS_TYPES_WITHOUT_CHOICES = ("nll", "dft", "chunked_nll")


def trl_loss_types() -> tuple[str, ...]:
    """The values the installed TRL accepts for `loss_type` (e.g. nll, dft, chunked_nll)."""
    spec = {f.name: f for f in dataclasses.fields(SFTConfig)}["loss_type"]
    choices = spec.metadata.get("choices") or _TRL_LOSS_TYPES_WITHOUT_CHOICES
    return tuple(c for c in choices if isinstance(c, str))


#: Every value of `loss`: ours first (a name both use, `dft`, is ours), then TRL's other loss types.
LOSS_CHOICES: tuple[str, ...] = DISTMATCH_LOSSES + tuple(
    n for n in trl_loss_types() if n not in DISTMATCH_LOSSES
)


@dataclass
class _DistMatchSFTConfig(SFTConfig):
    """`SFTConfig` with the distmatch loss options; every other TRL option keeps its meaning.

    `loss` selects the objective: a distmatch loss (`emo`, `gem_linear`, `gem_ls`, `ce`, `ce_entropy`, `tailr`,
    `mixce`, ...) or TRL's own (`nll`, ...: the same as setting `loss_type`). Unset (None) leaves TRL's `loss_type`
    in charge. The loss options follow (one field per option of `trl_ext.options.LOSS_OPTIONS`).
    """

    loss: str | None = field(
        default=None,
        metadata={
            "help": "Training objective: a distmatch loss (EMO, GEM, baselines) or TRL's own loss types. "
            "Unset: TRL's `loss_type` decides.",
            "choices": list(LOSS_CHOICES),
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss is None:
            return
        if self.loss not in LOSS_CHOICES:  # YAML / Python values bypass argparse's `choices`
            raise ValueError(
                f"loss={self.loss!r} is not a known loss. Valid values: {', '.join(LOSS_CHOICES)}."
            )
        if self.loss not in DISTMATCH_LOSSES:
            self.loss_type = self.loss
            return
        # TRL computes no loss of its own: plain "nll" keeps TRL < 1.15 from patching its chunked-NLL head (which
        # also rejects PEFT on lm_head).
        self.loss_type = "nll"
        # Validate the hyper-parameters now, not at the first step.
        loss_params(self.loss, self.loss_options())

    def loss_options(self) -> dict[str, object]:
        return {o.name: getattr(self, o.name) for o in LOSS_OPTIONS}

    @property
    def distmatch_loss(self) -> str | None:
        """The distmatch loss to train with, or None when TRL computes its own loss."""
        return self.loss if self.loss in DISTMATCH_LOSSES else None


def _option_field(option: Any) -> tuple[str, type, Any]:
    metadata: dict[str, Any] = {"help": option.help}
    if option.choices is not None:
        metadata["choices"] = list(option.choices)
    return option.name, option.type, field(default=option.default, metadata=metadata)


DistMatchSFTConfig = dataclasses.make_dataclass(
    "DistMatchSFTConfig",
    [_option_field(o) for o in LOSS_OPTIONS],
    bases=(_DistMatchSFTConfig,),
    namespace={"__module__": __name__, "__doc__": _DistMatchSFTConfig.__doc__},
)

__all__ = ["DistMatchSFTConfig", "EMO_COST_EMBEDDINGS", "LOSS_CHOICES", "trl_loss_types"]
