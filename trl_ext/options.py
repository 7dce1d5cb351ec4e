"""The user-facing loss options, shared by the TRL config, the Axolotl plugin and the `trl sft` hook.

Nothing is declared here: every option is defined by the loss that uses it (`trl_ext.losses.objectives`, see
`LossSpec.options`) and collected by the registry. `LOSS_OPTIONS` lists them with their default, help and the
losses they apply to; `loss_params` maps a loss name and the options to the keyword parameters of
`trl_ext.losses.token_loss` / `fused_token_loss` (and validates them there). The memory-efficient paths' settings
(`loss_chunk_memory_mb`, ...: `trl_ext.losses.settings.OPTIONS`) are options of every loss (`path=True`):
`fused_settings` makes them the `FusedSettings` those functions take, `path_options_from_env` reads their
environment fallback and `check_fused_settings` refuses, before any model loads, one that cannot run on the run's
device. `losses_table` / `options_table` are
the documentation tables built from the specs: `python tools/generate.py` writes them into docs/losses.md
(`python -m trl_ext.options` prints them).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from distmatch.errors import DistMatchConfigError

from .losses import LOSS_NAMES, LOSSES, resolve
from .losses.registry import OPTION_LOSSES, OPTIONS
from .losses.row_backends import kernel_unavailable
from .losses.settings import OPTIONS as PATH_OPTIONS
from .losses.settings import FusedSettings, env_values
from .losses.spec import REQUIRED, Check

#: Our losses (names of `trl_ext.losses`). "ce" is the same objective as TRL's "nll" computed by our fused path.
DISTMATCH_LOSSES: tuple[str, ...] = LOSS_NAMES


@dataclass(frozen=True)
class LossOption:
    name: str  # user-facing name (TRL flag / YAML key, Axolotl YAML key)
    default: Any
    help: str
    losses: tuple[str, ...]  # the losses it applies to
    param: str  # the keyword of the functional API
    type: type
    check: Check
    choices: tuple[Any, ...] | None = None
    from_model: bool = False  # the value says where the integration takes the parameter from (not the value)
    path: bool = (
        False  # a setting of the memory-efficient paths (`FusedSettings` field `param`), not of the math
    )


LOSS_OPTIONS: tuple[LossOption, ...] = tuple(
    LossOption(
        o.name, o.default, o.help, OPTION_LOSSES[o.name], o.param, o.type, o.check, o.choices, o.from_model
    )
    for o in OPTIONS.values()
) + tuple(
    LossOption(o.name, o.default, o.help, LOSS_NAMES, o.param, o.type, o.check, o.choices, path=True)
    for o in PATH_OPTIONS
)
OPTION_DEFAULTS: dict[str, Any] = {o.name: o.default for o in LOSS_OPTIONS}
PATH_OPTION_NAMES: tuple[str, ...] = tuple(o.name for o in LOSS_OPTIONS if o.path)


def options_of(loss: str) -> tuple[LossOption, ...]:
    """The options that apply to `loss`."""
    return tuple(o for o in LOSS_OPTIONS if loss in o.losses)


def _check_option(option: LossOption, value: Any) -> None:
    problem = option.check(value)
    if problem is not None:
        raise ValueError(f"{option.name}={value!r} is invalid; expected {problem}.")


def loss_params(
    loss: str, options: Mapping[str, Any], *, cost_embedding: torch.Tensor | None = None
) -> dict[str, Any]:
    """Functional-API parameters of `loss` from the user options (defaults where missing), validated.

    Options that name where a tensor comes from (`from_model`, e.g. `emo_cost_embedding`) are checked here; the
    caller resolves them and passes the tensor as `cost_embedding`. Without it the other parameters are still
    validated (configuration time, before a model exists) and none is returned.
    """
    if loss not in DISTMATCH_LOSSES:
        raise ValueError(f"Unknown loss {loss!r}. Valid losses: {', '.join(DISTMATCH_LOSSES)}.")
    relevant = options_of(loss)
    params: dict[str, Any] = {}
    placeholders = []
    for option in relevant:
        value = options.get(option.name, option.default)
        if option.path:  # not a parameter of the loss: `fused_settings`
            _check_option(option, value)
            continue
        if option.from_model:
            _check_option(option, value)
            if (
                option.param not in LOSSES[loss].param_names
            ):  # where the integration gets a model: no parameter
                continue
            given = cost_embedding if option.param == "cost_embedding" else None
            params[option.param] = torch.empty(0, 0) if given is None else given
            if given is None:
                placeholders.append(option.param)
        else:
            params[option.param] = value
    try:
        resolved = resolve(loss, params)[1]
    except ValueError as err:  # name the user-facing option rather than the functional parameter
        message = str(err)
        for option in relevant:
            message = message.replace(f" {option.param}=", f" {option.name}=")
        raise ValueError(message) from None
    for param in placeholders:
        del resolved[param]
    return resolved


def fused_settings(options: Mapping[str, Any]) -> FusedSettings:
    """The memory-efficient paths' settings the options name (defaults where missing), validated."""
    for option in LOSS_OPTIONS:
        if option.path:
            _check_option(option, options.get(option.name, option.default))
    return FusedSettings(**{o.param: options.get(o.name, o.default) for o in LOSS_OPTIONS if o.path})


def path_options_from_env(
    unset: Iterable[str] | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The path options (of `unset`, default all) the environment sets, option name -> value: the fallback for the
    ones a run leaves unset. A bad value raises `DistMatchConfigError` naming the variable and what it accepts."""
    wanted = [o for o in LOSS_OPTIONS if o.path and (unset is None or o.name in unset)]
    try:
        values = env_values(os.environ if environ is None else environ, [o.param for o in wanted])
    except ValueError as err:
        raise DistMatchConfigError(str(err)) from None
    return {o.name: values[o.param] for o in wanted if o.param in values}


def with_path_env_fallback(
    options: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`options` with each path option it leaves unset (missing or None) taken from the environment, if set there."""
    unset = [name for name in PATH_OPTION_NAMES if options.get(name) is None]
    return {**options, **path_options_from_env(unset, environ)}


def run_device_type(use_cpu: bool = False) -> str:
    """The device type a run trains on: "cuda" when a CUDA device is there and not declined, else "cpu"."""
    return "cuda" if not use_cpu and torch.cuda.is_available() else "cpu"


def check_fused_settings(loss: str, options: Mapping[str, Any], device_type: str) -> None:
    """Refuse, before any model loads, path settings that cannot run for `loss` on a `device_type` device: the
    Triton kernel forced (`loss_kernels: triton`) or needed (`tiles`, `input` logits) where it would not run."""
    settings = fused_settings(options)
    why = kernel_unavailable(loss, settings.kernels, device_type)
    if why is None:
        return
    problems = []
    if settings.kernels == "triton":
        problems.append(f"loss_kernels='triton' cannot run here ({why}); use 'auto' or 'torch'")
    if settings.grad_weight_accum == "tiles":
        problems.append(
            f"loss_grad_weight_accum='tiles' needs the Triton row kernel, which would not run here ({why}); use "
            "'float32' or 'weight'"
        )
    if settings.chunk_logits == "input":
        problems.append(
            f"loss_chunk_logits='input' needs the Triton row kernel, which would not run here ({why}); use 'float32'"
        )
    if problems:
        raise DistMatchConfigError(f"loss={loss!r}: " + "; ".join(problems) + ".")


def cost_embedding_option(loss: str) -> str | None:
    """The option naming where `loss` takes its cost embedding from, or None when it needs none."""
    if not LOSSES[loss].needs_cost_embedding:
        return None
    return next(o.name for o in options_of(loss) if o.from_model and o.param == "cost_embedding")


def _value(value: Any) -> str:
    return f"`{value}`" if isinstance(value, str) else repr(value)


def _cell(text: str) -> str:
    return text.replace("|", "/")


def options_table() -> str:
    """The option table of docs/losses.md (TRL flags / YAML keys, Axolotl keys), from the loss specs."""
    lines = ["| option | default | used by | meaning |", "|---|---|---|---|"]
    for o in LOSS_OPTIONS:
        used_by = "every loss" if o.path else ", ".join(f"`{name}`" for name in o.losses)
        lines.append(f"| `{o.name}` | {_value(o.default)} | {used_by} | {_cell(o.help)} |")
    return "\n".join(lines)


def _param(param: Any) -> str:
    default = "required" if param.default is REQUIRED else _value(param.default)
    return f"`{param.name}` ({default}): {_cell(param.doc)}"


def losses_table() -> str:
    """The loss table of docs/losses.md (formula, functional-API parameters, options, Triton kernel), from the loss specs."""
    lines = [
        "| name | per valid token (z logits, y target, p = softmax(z), l = -log p_y, sg = stop-gradient) "
        "| parameters (default) | options | Triton |",
        "|---|---|---|---|---|",
    ]
    for name, spec in LOSSES.items():
        params = "; ".join(_param(p) for p in spec.params) or "—"
        opts = ", ".join(f"`{o.name}`" for o in options_of(name) if not o.path) or "—"
        lines.append(
            f"| `{name}` | {_cell(spec.summary)} | {params} | {opts} | {'yes' if spec.triton else '—'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(losses_table(), options_table(), sep="\n\n")
