"""`DistMatchSFTConfig`: TRL's `SFTConfig` plus the loss options (`--loss emo`, `gem_beta: 0.7`, ...)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trl import SFTConfig

from .checks import (
    DistMatchConfigError,
    check_loss_type,
    check_option_usage,
    framework_conflicts,
    raise_conflicts,
)
from .emo_cost import check_cost_embedding_source
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


def _help(name: str) -> str:
    return f"{_HELP[name]} Default: {OPTION_DEFAULTS[name]!r} (only with a `loss` that uses it)."


def _default_loss_type() -> str | None:
    return {f.name: f for f in dataclasses.fields(SFTConfig)}["loss_type"].default


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
    # Unset (None) means the default in the help; a value set without a loss that uses it is refused.
    gem_beta: float | None = field(default=None, metadata={"help": _help("gem_beta")})
    emo_cost_embedding: str | None = field(default=None, metadata={"help": _help("emo_cost_embedding")})
    emo_weighting: str | None = field(
        default=None, metadata={"help": _help("emo_weighting"), "choices": ["emo1", "emo2"]}
    )
    ce_entropy_coef: float | None = field(default=None, metadata={"help": _help("ce_entropy_coef")})
    tailr_gamma: float | None = field(default=None, metadata={"help": _help("tailr_gamma")})
    mixce_gamma: float | None = field(default=None, metadata={"help": _help("mixce_gamma")})

    def __post_init__(self) -> None:
        # Our checks first: they are about the user's distmatch settings and must not be masked by TRL's own.
        check_option_usage(self.loss, self.set_loss_options(), LOSS_OPTIONS, DISTMATCH_LOSSES)
        if (
            self.loss is not None and self.loss not in LOSS_CHOICES
        ):  # YAML / Python bypass argparse's `choices`
            raise DistMatchConfigError(
                f"loss={self.loss!r} is not a known loss. Valid values: {', '.join(LOSS_CHOICES)}."
            )
        check_loss_type(self.loss, self.loss_type, _default_loss_type())
        if self.loss in DISTMATCH_LOSSES:
            raise_conflicts(self.loss, framework_conflicts(vars(self)))
            # Validate the hyper-parameters (and an EMO cost-embedding model's config) now, not at the first step.
            try:
                loss_params(self.loss, self.loss_options())
                if self.loss == "emo":
                    check_cost_embedding_source(self.loss_options()["emo_cost_embedding"])
            except DistMatchConfigError:
                raise
            except ValueError as err:
                raise DistMatchConfigError(str(err)) from None
        super().__post_init__()
        if self.loss is None:
            return
        if self.loss in trl_loss_types():
            self.loss_type = self.loss
            return
        # TRL computes no loss of its own: plain "nll" keeps TRL < 1.15 from patching its chunked-NLL head (which
        # also rejects PEFT on lm_head).
        self.loss_type = "nll"

    def set_loss_options(self) -> dict[str, object]:
        """The loss options the user set (not None)."""
        return {o.name: getattr(self, o.name) for o in LOSS_OPTIONS if getattr(self, o.name) is not None}

    def loss_options(self) -> dict[str, object]:
        """Every loss option, defaults filled in."""
        return {**OPTION_DEFAULTS, **self.set_loss_options()}

    @property
    def distmatch_loss(self) -> str | None:
        """The distmatch loss to train with, or None when TRL computes its own loss."""
        return self.loss if self.loss in DISTMATCH_LOSSES else None


__all__ = ["DistMatchSFTConfig", "EMO_COST_EMBEDDINGS", "LOSS_CHOICES", "trl_loss_types"]
