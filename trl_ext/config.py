"""`DistMatchSFTConfig`: TRL's `SFTConfig` plus the loss options (`--loss emo`, `gem_beta: 0.7`, ...).

The option fields are built from the loss specs (`trl_ext.options.LOSS_OPTIONS`): name, type, help and choices
come from the loss that defines the option, so `--help`, YAML configs and validation follow it. A field left unset
(None) takes the option's default; one set without a loss that uses it is refused (`trl_ext.checks`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trl import SFTConfig

from .checks import (
    DistMatchConfigError,
    check_loss_type,
    check_option_usage,
    framework_conflicts,
    raise_conflicts,
)
from .cost_embedding import BUILTIN_SOURCES as EMO_COST_EMBEDDINGS
from .cost_embedding import check_configured
from .options import (
    DISTMATCH_LOSSES,
    LOSS_OPTIONS,
    OPTION_DEFAULTS,
    PATH_OPTION_NAMES,
    check_fused_settings,
    loss_params,
    options_of,
    path_options_from_env,
    run_device_type,
)

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


def _default_loss_type() -> str | None:
    return {f.name: f for f in dataclasses.fields(SFTConfig)}["loss_type"].default


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

    allow_loss_change: bool = field(
        default=False,
        metadata={
            "help": "Resuming from a checkpoint whose `distmatch.json` records another loss or other loss options: "
            "train with this run's `loss` and options anyway. Without it such a resume is refused; a resume "
            "without `loss` continues with the recorded loss and options."
        },
    )

    overwrite_run: bool = field(
        default=False,
        metadata={
            "help": "A new run (not a resume) into an output_dir that holds another run's `distmatch.json`: remove "
            "that run's checkpoints and record and train. Without it such a run is refused."
        },
    )

    def __post_init__(self) -> None:
        # Our checks first: they are about the user's distmatch settings and must not be masked by TRL's own.
        self._check_distmatch()
        given = self.loss_type
        super().__post_init__()
        self._set_loss_type()
        # A `loss_type` set here, by TRL (TRL 1.9 - 1.14 turn an unset one into "chunked_nll") or from `loss`, is not
        # the user's choice: checked again later (`validate_distmatch`), it must not count as an explicit one.
        self._derived_loss_type = None if self.loss_type == given and self.loss is None else self.loss_type

    def validate_distmatch(self) -> None:
        """Validate `loss` and the loss options again (raises `DistMatchConfigError`) and point TRL's `loss_type` at
        the loss: the trainer calls it, so values assigned after construction are checked like constructed ones."""
        self._check_distmatch()
        self._set_loss_type()

    def _check_distmatch(self) -> None:
        # the path settings' environment fallback, recorded like set options
        if self.loss in DISTMATCH_LOSSES:
            unset = [name for name in PATH_OPTION_NAMES if getattr(self, name) is None]
            for name, value in path_options_from_env(unset).items():
                setattr(self, name, value)
        check_option_usage(self.loss, self.set_loss_options(), LOSS_OPTIONS, DISTMATCH_LOSSES)
        if (
            self.loss is not None and self.loss not in LOSS_CHOICES
        ):  # YAML / Python bypass argparse's `choices`
            raise DistMatchConfigError(
                f"loss={self.loss!r} is not a known loss. Valid values: {', '.join(LOSS_CHOICES)}."
            )
        derived = getattr(self, "_derived_loss_type", None)
        loss_type = None if derived is not None and self.loss_type == derived else self.loss_type
        check_loss_type(self.loss, loss_type, _default_loss_type(), DISTMATCH_LOSSES)
        if self.loss in DISTMATCH_LOSSES:
            raise_conflicts(self.loss, framework_conflicts(vars(self)))
            # Validate the hyper-parameters (and a cost-embedding model's config) now, not at the first step.
            try:
                loss_params(self.loss, self.loss_options())
                check_fused_settings(self.loss, self.loss_options(), run_device_type(bool(self.use_cpu)))
                check_configured(self.loss, self.loss_options())
            except DistMatchConfigError:
                raise
            except ValueError as err:
                raise DistMatchConfigError(str(err)) from None

    def _set_loss_type(self) -> None:
        if self.loss is None:
            return
        if self.loss not in DISTMATCH_LOSSES:
            self.loss_type = self.loss
            return
        # TRL computes no loss of its own: plain "nll" keeps TRL < 1.15 from patching its chunked-NLL head (which
        # also rejects PEFT on lm_head).
        self.loss_type = "nll"

    def use_loss(self, loss: str, options: dict[str, object]) -> None:
        """Train `loss` with `options` (every option; those `loss` does not use are unset), validated."""
        self.loss = loss
        used = {o.name for o in options_of(loss)}
        for option in LOSS_OPTIONS:
            setattr(self, option.name, options.get(option.name) if option.name in used else None)
        self.validate_distmatch()

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


def _option_field(option: Any) -> tuple[str, Any, Any]:
    # Unset (None) means the default named in the help; a value set without a loss that uses it is refused.
    metadata: dict[str, Any] = {
        "help": f"{option.help} Default: {option.default!r} (only with a `loss` that uses it)."
    }
    if option.choices is not None:
        metadata["choices"] = list(option.choices)
    return option.name, option.type | None, field(default=None, metadata=metadata)


DistMatchSFTConfig = dataclasses.make_dataclass(
    "DistMatchSFTConfig",
    [_option_field(o) for o in LOSS_OPTIONS],
    bases=(_DistMatchSFTConfig,),
    namespace={"__module__": __name__, "__doc__": _DistMatchSFTConfig.__doc__},
)

__all__ = ["DistMatchSFTConfig", "EMO_COST_EMBEDDINGS", "LOSS_CHOICES", "trl_loss_types"]
