"""Settings distmatch refuses before any work, shared by the TRL config and the Axolotl plugin.

Each check is a plain function over data (the option table, the values the user set), so that both frameworks ask
the same questions and give the same answers. A refused setting raises `DistMatchConfigError` (a `ValueError`)
whose message names the user's own setting and what to do; the entry points print it as one line.

What is refused (docs/refusals.md):

* a loss option without a distmatch `loss` (`trl sft --gem_beta 0.5` alone would train TRL's own loss), or an
  option the chosen loss does not use (`loss: emo` with `gem_beta`);
* `loss` together with a different explicit `loss_type` (TRL would silently drop one of the two);
* Liger's fused kernels (`use_liger_kernel`) and label smoothing with a distmatch loss: they replace or alter the
  cross-entropy the distmatch loss takes the place of (Liger's fused forward returns no per-token values at all);
* an `emo_cost_embedding` that names no loadable model, or one with another vocabulary (`trl_ext/cost_embedding/`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from distmatch.errors import DistMatchConfigError

__all__ = [
    "DistMatchConfigError",
    "check_loss_type",
    "check_option_usage",
    "framework_conflicts",
    "raise_conflicts",
]


def _losses_using(name: str, options: Iterable[Any]) -> tuple[str, ...]:
    return next((tuple(o.losses) for o in options if o.name == name), ())


def check_option_usage(
    loss: str | None,
    set_options: Mapping[str, Any],
    options: Sequence[Any],
    distmatch_losses: Sequence[str],
) -> None:
    """Refuse loss options that would have no effect.

    `set_options`: the options the user set (name -> value); `options`: the option table (objects with `name` and
    `losses`, e.g. `trl_ext.options.LOSS_OPTIONS`); `loss`: the user's `loss` value (None when unset).
    """
    if not set_options:
        return
    problems = []
    for name, value in set_options.items():
        users = _losses_using(name, options)
        if loss in users:
            continue
        which = " or ".join(f"`loss: {u}`" for u in users) or "no loss"
        if loss not in distmatch_losses:
            now = "is unset" if loss is None else f"is {loss!r}, not a distmatch loss"
            problems.append(
                f"{name}={value!r} is set but `loss` {now}, so it would have no effect and training would use "
                f"the framework's own cross-entropy; add {which} (the losses that use it) or remove {name}"
            )
        else:
            problems.append(
                f"{name}={value!r} has no effect with loss={loss!r} (it is used by {which}); remove it"
            )
    if problems:
        raise DistMatchConfigError("; ".join(problems) + ".")


def check_loss_type(
    loss: str | None,
    loss_type: str | None,
    default_loss_type: str | None,
    distmatch_losses: Sequence[str] = (),
) -> None:
    """Refuse `loss` with a different explicit TRL `loss_type` (one would silently override the other).

    TRL's default (`nll` in TRL >= 1.15, None before) is indistinguishable from an explicit `nll`, so `nll` passes on
    every version: it is the plain cross-entropy a distmatch loss replaces. A `loss_type` whose name is also a
    distmatch loss (`dft`) cannot be reached through `loss`, which selects distmatch's own.
    """
    if loss is None or loss_type in (None, default_loss_type, loss, "nll"):
        return
    how = (
        f"`loss: {loss_type}` selects distmatch's own {loss_type!r}; TRL's cannot be combined with a distmatch loss"
        if loss_type in distmatch_losses
        else f"`loss: {loss_type}` selects TRL's own {loss_type!r}"
    )
    raise DistMatchConfigError(
        f"loss={loss!r} and loss_type={loss_type!r} ask for two different objectives; set only `loss` ({how})."
    )


#: (setting, is it set?, why it cannot be combined with a distmatch loss). TRL's `SFTConfig` field names.
TRL_CONFLICTS: tuple[tuple[str, Any, str], ...] = (
    (
        "use_liger_kernel",
        bool,
        "Liger's kernels put their own fused linear cross-entropy in the model's forward, which returns none of "
        "the per-token values the distmatch loss is computed from: remove `use_liger_kernel`",
    ),
    (
        "label_smoothing_factor",
        lambda v: bool(v) and float(v) > 0,
        "label smoothing changes the cross-entropy the distmatch loss replaces: set `label_smoothing_factor` to 0",
    ),
)


def framework_conflicts(
    values: Mapping[str, Any], table: Sequence[tuple[str, Any, str]] = TRL_CONFLICTS
) -> list[str]:
    """The settings in `values` (name -> value) that `table` marks as impossible with a distmatch loss."""
    return [f"{key}={values.get(key)!r} ({why})" for key, is_set, why in table if is_set(values.get(key))]


def raise_conflicts(loss: str, problems: Sequence[str]) -> None:
    if problems:
        raise DistMatchConfigError(f"loss={loss!r} cannot be combined with " + "; ".join(problems) + ".")
