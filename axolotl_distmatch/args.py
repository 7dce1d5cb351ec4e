"""The plugin's config keys: `loss` and the loss options, as a pydantic model Axolotl mixes into its config.

Axolotl imports this class by its dotted path (`DistMatchPlugin.get_input_args`) and makes its fields top-level
YAML keys. The option fields are built from `trl_ext.options.LOSS_OPTIONS` (defined by the loss specs: one name,
type, default, help and choices across TRL and Axolotl); values are checked by `trl_ext.options.loss_params`, the
same check the TRL config runs.

Only pydantic and `trl_ext` are imported here (no Axolotl), so the schema can be inspected without Axolotl.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from distmatch.errors import one_edit_apart
from trl_ext.checks import DistMatchConfigError, check_option_usage
from trl_ext.cost_embedding import check_configured
from trl_ext.options import (
    DISTMATCH_LOSSES,
    LOSS_OPTIONS,
    check_fused_settings,
    loss_params,
    run_device_type,
    with_path_env_fallback,
)

#: Options that are also Axolotl's own keys (its `use_eaft` reads `eaft_alpha` / `eaft_k`): without a distmatch
#: `loss` they belong to Axolotl and are not refused.
AXOLOTL_OWN_KEYS = frozenset({"eaft_alpha", "eaft_k"})


CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"


def _positive_int(value: Any) -> bool:
    try:
        return value is not None and int(value) > 1
    except (TypeError, ValueError):
        return False


# (key, is it set?, what to do). Checked after Axolotl applied its defaults (the CCE plugin's `cut_cross_entropy`
# defaults to true as soon as the plugin is listed); a key the installed Axolotl does not declare (e.g. `use_dft`
# before 0.20) is read from the raw YAML instead, so a config that asks for two losses fails on every version.
_CONFLICTS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    (
        "cut_cross_entropy",
        bool,
        f"the Cut Cross Entropy plugin (its `cut_cross_entropy` defaults to true when `{CCE_PLUGIN}` is listed): "
        "remove it from `plugins` or set `cut_cross_entropy: false`",
    ),
    (
        "liger_fused_linear_cross_entropy",
        bool,
        "Liger's fused linear cross-entropy: remove `liger_fused_linear_cross_entropy` (or set it to false); "
        "Liger's other kernels (`liger_rms_norm`, `liger_glu_activation`, `liger_rope`, ...) are fine",
    ),
    (
        "chunked_cross_entropy",
        bool,
        "chunked cross-entropy: remove `chunked_cross_entropy` (distmatch losses are already computed in chunks)",
    ),
    ("use_dft", bool, "DFT (another loss): remove `use_dft`"),
    ("use_eaft", bool, "EAFT (another loss): remove `use_eaft`"),
    (
        "rl",
        lambda v: v is not None,
        "an RL / preference trainer: remove `rl` (distmatch losses are SFT objectives)",
    ),
    ("reward_model", bool, "reward-model training: remove `reward_model`"),
    ("process_reward_model", bool, "process-reward-model training: remove `process_reward_model`"),
    (
        "context_parallel_size",
        _positive_int,
        "context parallelism (it shards the sequence, not the loss's shifted labels): remove "
        "`context_parallel_size` or set it to 1",
    ),
    (
        "sequence_parallel_degree",
        _positive_int,
        "sequence parallelism: remove `sequence_parallel_degree` or set it to 1",
    ),
    (
        "label_smoothing_factor",
        lambda v: bool(v) and float(v) > 0,
        "label smoothing (it changes the cross-entropy the distmatch loss replaces; the distmatch trainer would drop "
        "it): remove `label_smoothing_factor` or set it to 0",
    ),
    ("orpo_alpha", bool, "ORPO (another loss): remove `orpo_alpha`"),
    ("kd_trainer", bool, "knowledge distillation (another trainer): remove `kd_trainer`"),
    (
        "trainer_cls",
        bool,
        "a custom `trainer_cls` (the plugin provides the trainer and would silently replace it): remove `trainer_cls`",
    ),
)


def conflicts(loss: str, values: Mapping[str, Any]) -> list[str]:
    """The settings of `values` that cannot be combined with `loss`, each saying what to remove."""
    return [message for key, is_set, message in _CONFLICTS if is_set(values.get(key))]


def unknown_loss_message(value: Any) -> str:
    message = f"loss={value!r} is not a distmatch loss. Valid losses: {', '.join(DISTMATCH_LOSSES)}."
    close = difflib.get_close_matches(str(value), DISTMATCH_LOSSES, n=1)
    return message + (f" Did you mean {close[0]!r}?" if close else "")


class _DistMatchArgs(BaseModel):
    """Input args of the distmatch plugin: `loss: gem_ls` (plus its options) replaces the SFT cross-entropy."""

    loss: Literal[DISTMATCH_LOSSES] | None = Field(  # type: ignore[valid-type]
        default=None,
        json_schema_extra={
            "description": "distmatch training objective (plugin axolotl_distmatch.DistMatchPlugin): "
            + ", ".join(DISTMATCH_LOSSES)
            + ". Unset: Axolotl's own loss, the plugin does nothing."
        },
    )

    overwrite_run: bool | None = Field(
        default=None,
        json_schema_extra={
            "description": "A new run (not a resume) into an output_dir that holds another run's `distmatch.json`: "
            "remove that run's checkpoints and record and train. Without it such a run is refused."
        },
    )

    allow_loss_change: bool | None = Field(
        default=None,
        json_schema_extra={
            "description": "Resuming from a checkpoint whose `distmatch.json` records another loss or other loss "
            "options: train with this config's `loss` and options anyway. Without it such a resume is refused; a "
            "resume without `loss` continues with the recorded loss and options."
        },
    )

    @field_validator("loss", mode="before")
    @classmethod
    def _known_loss(cls, value: Any) -> Any:
        if value is not None and value not in DISTMATCH_LOSSES:
            raise DistMatchConfigError(unknown_loss_message(value))
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _no_conflicting_settings(cls, data: Any, handler: Any) -> Any:
        raw = data if isinstance(data, Mapping) else {}
        # Settings written in the YAML: reported first, before other validators complain about their details.
        _check_keys(raw, set(getattr(cls, "model_fields", {})))
        if raw.get("loss") in DISTMATCH_LOSSES:
            _raise_conflicts(raw["loss"], raw)
            # The path settings the YAML leaves unset: their environment fallback, validated and recorded as keys.
            data = raw = with_path_env_fallback(raw)
        _check_options(raw)
        model = handler(data)  # Axolotl's and the other plugins' defaults are applied now
        loss = getattr(model, "loss", None)
        if loss is not None:
            fields = type(model).model_fields
            values = {key: getattr(model, key) if key in fields else raw.get(key) for key, _, _ in _CONFLICTS}
            _raise_conflicts(loss, values)
            # The loss's options together (e.g. emo_ratio_clamp only with emo_weighting: emo1), as TRL checks them.
            options = {o.name: getattr(model, o.name) for o in LOSS_OPTIONS if o.name in fields}
            loss_params(loss, {k: v for k, v in options.items() if v is not None})
        return model


def _check_keys(raw: Mapping[str, Any], known: set[str]) -> None:
    """Keys Axolotl would ignore (or read as another framework's loss) while the user meant a distmatch setting:
    a key no config field declares, one edit away from a distmatch option (`gem_betta`), and `loss_type: <a
    distmatch loss>` without `loss` (another framework's spelling: Axolotl would train cross-entropy)."""
    names = ("loss", "allow_loss_change", "overwrite_run", *(o.name for o in LOSS_OPTIONS))
    for key in raw:
        if not isinstance(key, str) or key in known or key in names:
            continue
        close = next((name for name in names if one_edit_apart(key, name)), None)
        if close is not None:
            raise DistMatchConfigError(
                f"{key}: {raw[key]!r} is not a config key (Axolotl would ignore it and train with the default "
                f"{close}); did you mean `{close}`?"
            )
    loss_type = raw.get("loss_type")
    if raw.get("loss") is None and isinstance(loss_type, str) and loss_type in DISTMATCH_LOSSES:
        raise DistMatchConfigError(
            f"loss_type: {loss_type} does not select a distmatch loss in Axolotl (it would train cross-entropy); "
            f"write `loss: {loss_type}` (the distmatch plugin's key)."
        )


def _check_options(raw: Mapping[str, Any]) -> None:
    """The loss options written in the YAML: used by the chosen loss, valid for it, and (EMO) a cost-embedding
    model with the training model's vocabulary. Checked on the raw YAML: a default is never refused."""
    loss = raw.get("loss")
    if loss is not None and loss not in DISTMATCH_LOSSES:
        return  # the field validator names the valid losses
    written = {o.name: raw[o.name] for o in LOSS_OPTIONS if raw.get(o.name) is not None}
    check_option_usage(
        loss,
        {k: v for k, v in written.items() if loss is not None or k not in AXOLOTL_OWN_KEYS},
        LOSS_OPTIONS,
        DISTMATCH_LOSSES,
    )
    if loss is None:
        return
    try:
        loss_params(loss, written)  # the TRL config's check: valid in both frameworks or in neither
    except ValueError as err:
        raise DistMatchConfigError(str(err)) from None
    check_fused_settings(loss, written, run_device_type())
    check_configured(loss, written, raw.get("base_model_config") or raw.get("base_model"))


def _option_field(option: Any) -> tuple[Any, Any]:
    # Unset (None): the default named in the description; the plugin fills it in (`DistMatchPlugin`). A value
    # written without a loss that uses it is refused (`trl_ext.checks.check_option_usage`).
    annotation = Literal[option.choices] if option.choices is not None else option.type  # type: ignore[valid-type]
    description = f"{option.help} Default: {option.default!r} (only with a `loss` that uses it)."
    return annotation | None, Field(default=None, json_schema_extra={"description": description})


DistMatchArgs = create_model(
    "DistMatchArgs",
    __base__=_DistMatchArgs,
    __module__=__name__,
    **{o.name: _option_field(o) for o in LOSS_OPTIONS},
)
DistMatchArgs.__doc__ = _DistMatchArgs.__doc__


def _raise_conflicts(loss: str, values: Mapping[str, Any]) -> None:
    problems = conflicts(loss, values)
    if problems:
        raise DistMatchConfigError(
            f"loss: {loss} (distmatch plugin) cannot be combined with "
            + "; ".join(problems)
            + ". The distmatch loss replaces the model's cross-entropy; these settings would change or bypass it."
        )


__all__ = ["CCE_PLUGIN", "DistMatchArgs", "conflicts", "unknown_loss_message"]
