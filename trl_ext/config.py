"""`DistMatchSFTConfig`: TRL's `SFTConfig` plus the loss options (`--loss emo`, `gem_beta: 0.7`, ...)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trl import SFTConfig

from .options import DISTMATCH_LOSSES, EMO_COST_EMBEDDINGS, LOSS_OPTIONS, OPTION_DEFAULTS, loss_params

# TRL 1.7 - 1.14 declare `loss_type: str | None = None` without `choices` (the values are only in the help text).
_TRL_LOSS_TYPES_WITHOUT_CHOICES = ("nll", "dft", "chunked_nll")


def trl_loss_types() -> tuple[str, ...]:
    """The values the installed TRL accepts for `loss_type` (e.g. nll, dft, chunked_nll)."""
    spec = {f.name: f for f in dataclasses.fields(SFTConfig)}["loss_type"]
    choices = spec.metadata.get("choices") or _TRL_LOSS_TYPES_WITHOUT_CHOICES
    return tuple(c for c in choices if isinstance(c, str))


LOSS_CHOICES: tuple[str, ...] = trl_loss_types() + tuple(
    n for n in DISTMATCH_LOSSES if n not in trl_loss_types()
)
_HELP = {o.name: o.help for o in LOSS_OPTIONS}


@dataclass
class DistMatchSFTConfig(SFTConfig):
    """`SFTConfig` with the distmatch loss options; every other TRL option keeps its meaning.

    `loss` selects the objective: TRL's own (`nll`, `dft`, ...: the same as setting `loss_type`) or a distmatch loss
    (`emo`, `gem_linear`, `gem_ls`, `ce`, `ce_entropy`, `tailr`, `mixce`). Unset (None) leaves TRL's `loss_type` in
    charge.
    """

    loss: str | None = field(
        default=None,
        metadata={
            "help": "Training objective: TRL's own loss types or a distmatch loss (EMO, GEM, baselines). "
            "Unset: TRL's `loss_type` decides.",
            "choices": list(LOSS_CHOICES),
        },
    )
    gem_beta: float = field(default=OPTION_DEFAULTS["gem_beta"], metadata={"help": _HELP["gem_beta"]})
    emo_cost_embedding: str = field(
        default=OPTION_DEFAULTS["emo_cost_embedding"], metadata={"help": _HELP["emo_cost_embedding"]}
    )
    emo_weighting: str = field(
        default=OPTION_DEFAULTS["emo_weighting"],
        metadata={"help": _HELP["emo_weighting"], "choices": ["emo1", "emo2"]},
    )
    ce_entropy_coef: float = field(
        default=OPTION_DEFAULTS["ce_entropy_coef"], metadata={"help": _HELP["ce_entropy_coef"]}
    )
    tailr_gamma: float = field(
        default=OPTION_DEFAULTS["tailr_gamma"], metadata={"help": _HELP["tailr_gamma"]}
    )
    mixce_gamma: float = field(
        default=OPTION_DEFAULTS["mixce_gamma"], metadata={"help": _HELP["mixce_gamma"]}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss is None:
            return
        if self.loss not in LOSS_CHOICES:  # YAML / Python values bypass argparse's `choices`
            raise ValueError(
                f"loss={self.loss!r} is not a known loss. Valid values: {', '.join(LOSS_CHOICES)}."
            )
        if self.loss in trl_loss_types():
            self.loss_type = self.loss
            return
        # TRL computes no loss of its own: plain "nll" keeps TRL < 1.15 from patching its chunked-NLL head (which
        # also rejects PEFT on lm_head).
        self.loss_type = "nll"
        loss_params(
            self.loss, self.loss_options()
        )  # validate the hyper-parameters now, not at the first step

    def loss_options(self) -> dict[str, object]:
        return {o.name: getattr(self, o.name) for o in LOSS_OPTIONS}

    @property
    def distmatch_loss(self) -> str | None:
        """The distmatch loss to train with, or None when TRL computes its own loss."""
        return self.loss if self.loss in DISTMATCH_LOSSES else None


__all__ = ["DistMatchSFTConfig", "EMO_COST_EMBEDDINGS", "LOSS_CHOICES", "trl_loss_types"]
