"""The distmatch losses as ms-swift `BaseLoss` classes, and the settings refused before training.

ms-swift calls a custom loss as `loss(outputs, labels, num_items_in_batch=..., loss_scale=...)` with the model's
logits [B, T, V] and the *unshifted* labels [B, T] (`swift/loss/causal_lm.py`); it expects the batch's mean loss.
Each class here shifts the labels (position t predicts label t + 1), asks `trl_ext.losses.token_loss` for per-token
losses, multiplies ms-swift's per-token `loss_scale` when given, and divides by `num_items_in_batch` (or the local
count of predicted tokens), as ms-swift's own cross-entropy example does. It never computes cross-entropy in place
of the chosen loss: what would make ms-swift train something else is refused as one line (`DistMatchConfigError`,
printed as `error: ...`, exit status 2):

* at import of the plugin file: `DISTMATCH_SWIFT_OPTIONS` that is no JSON object or names an unknown option;
* when the trainer is built (before the first step): options set while `--loss_type` is not a distmatch loss (or
  unset), an unknown `--loss_type`, an option the chosen loss does not use, an invalid option value, a loss that
  needs what this plugin does not provide (EMO's cost embedding, the anchored losses' reference model), and ms-swift
  settings that replace or alter the logits the loss is computed from (below).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch
from swift.loss import BaseLoss, loss_map
from swift.trainers.mixin import SwiftMixin

from distmatch.errors import DistMatchConfigError, print_config_errors_as_one_line
from trl_ext.checks import check_option_usage, framework_conflicts, raise_conflicts
from trl_ext.losses import IGNORE_INDEX, LOSS_NAMES, LOSSES, token_loss
from trl_ext.options import (
    DISTMATCH_LOSSES,
    LOSS_OPTIONS,
    check_fused_settings,
    fused_settings,
    loss_params,
    run_device_type,
    with_path_env_fallback,
)

from . import OPTIONS_ENV

__all__ = ["DistMatchSwiftLoss", "SWIFT_CONFLICTS", "read_options", "register", "shift_labels"]

_OPTION_NAMES = tuple(o.name for o in LOSS_OPTIONS)

#: (ms-swift argument, is it set?, why it cannot be combined with a distmatch loss).
SWIFT_CONFLICTS: tuple[tuple[str, Any, str], ...] = (
    (
        "sequence_parallel_size",
        lambda v: v is not None and int(v) > 1,
        "with sequence parallelism ms-swift hands the loss its own gathered cross-entropy, not the logits: "
        "set --sequence_parallel_size 1",
    ),
    (
        "use_liger_kernel",
        bool,
        "Liger's fused linear cross-entropy returns no logits to compute the distmatch loss from: remove "
        "--use_liger_kernel",
    ),
    (
        "label_smoothing_factor",
        lambda v: bool(v) and float(v) > 0,
        "label smoothing alters the cross-entropy the distmatch loss replaces: set --label_smoothing_factor 0",
    ),
    (
        "enable_dft_loss",
        bool,
        "ms-swift's DFT reweights its own cross-entropy, which a distmatch loss replaces (distmatch has `dft`): "
        "remove --enable_dft_loss",
    ),
    (
        "enable_channel_loss",
        bool,
        "channel losses are ms-swift's per-channel cross-entropy, not the trained loss: remove --enable_channel_loss",
    ),
    (
        "tuner_backend",
        lambda v: v == "unsloth",
        "Unsloth's patched forward computes its own loss: use --tuner_backend peft",
    ),
)


def read_options(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The loss options of `DISTMATCH_SWIFT_OPTIONS` (a JSON object; unset or empty: none), names checked."""
    text = environ.get(OPTIONS_ENV, "").strip()
    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as err:
        raise DistMatchConfigError(
            f"{OPTIONS_ENV}={text!r} is not JSON ({err.msg}); give a JSON object such as '{{\"gem_beta\": 0.5}}'."
        ) from None
    if not isinstance(options, dict):
        raise DistMatchConfigError(
            f"{OPTIONS_ENV}={text!r} is not a JSON object; give one such as '{{\"gem_beta\": 0.5}}'."
        )
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        raise DistMatchConfigError(
            f"{OPTIONS_ENV} names unknown option(s) {', '.join(unknown)}; the options are: {', '.join(_OPTION_NAMES)}."
        )
    return options


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Labels aligned with the logits' rows: position t is scored against label t + 1; the last position has none."""
    shifted = torch.full_like(labels, IGNORE_INDEX)
    shifted[..., :-1] = labels[..., 1:]
    return shifted


def _unsupported(loss: str) -> str | None:
    spec = LOSSES[loss]
    if spec.needs_cost_embedding:
        return "it needs a cost embedding taken from the model, which this plugin does not provide yet"
    if spec.needs_reference:
        return "it needs a frozen reference model, which this plugin does not provide yet"
    return None


class DistMatchSwiftLoss(BaseLoss):
    """One distmatch loss as an ms-swift loss (`--loss_type <name>`); `loss_name` is set by each subclass."""

    loss_name: str = ""

    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        name = self.loss_name
        if self.is_megatron:
            raise DistMatchConfigError(
                f"--loss_type {name} is not supported by `swift megatron` (its loss is computed in Megatron's "
                "pipeline, not from the logits this plugin reads); use `swift sft`."
            )
        why = _unsupported(name)
        if why is not None:
            raise DistMatchConfigError(
                f"--loss_type {name} is not available in the ms-swift plugin: {why}; use it with TRL or Axolotl "
                f"(docs/trl.md, docs/axolotl.md)."
            )
        settings = dict(vars(args))
        template = getattr(trainer, "template", None)  # sequence parallelism is the template's setting
        settings["sequence_parallel_size"] = getattr(template, "sequence_parallel_size", None)
        raise_conflicts(name, framework_conflicts(settings, SWIFT_CONFLICTS))
        options = with_path_env_fallback(read_options())
        check_option_usage(name, options, LOSS_OPTIONS, DISTMATCH_LOSSES)
        try:
            self.params: dict[str, Any] = loss_params(name, options)
            self.settings = fused_settings(options)
        except ValueError as err:
            raise DistMatchConfigError(f"{OPTIONS_ENV}: {err}") from None
        check_fused_settings(name, options, run_device_type(bool(getattr(args, "use_cpu", False))))

    def __call__(
        self,
        outputs: Any,
        labels: torch.Tensor,
        *,
        num_items_in_batch: Any = None,
        loss_scale: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        logits = getattr(outputs, "logits", None)
        if logits is None:  # never fall back to the model's own loss
            raise DistMatchConfigError(
                f"--loss_type {self.loss_name}: the model returned no logits to compute the loss from (a fused or "
                "patched forward?); remove the setting that fuses the language-model head's loss."
            )
        targets = shift_labels(labels).reshape(-1).to(logits.device)
        per_token, stats = token_loss(
            self.loss_name,
            logits.reshape(-1, logits.shape[-1]),
            targets,
            return_stats=True,
            settings=self.settings,
            **self.params,
        )
        if loss_scale is not None:
            per_token = per_token * loss_scale.reshape(-1).to(per_token.dtype)
        if num_items_in_batch is None:
            num_items_in_batch = (targets != IGNORE_INDEX).sum()
        self._log(stats, targets != IGNORE_INDEX)
        return per_token.sum() / num_items_in_batch

    def _log(self, stats: Any, valid: torch.Tensor) -> None:
        metrics = getattr(self.trainer, "custom_metrics", None)
        if metrics is None:
            return
        mode = "train" if self.trainer.model.training else "eval"
        for key, field in (("ce", "ce"), ("entropy", "entropy")):
            metrics[mode][key].update(getattr(stats, field)[valid].detach().float())


def _checked_create_loss(original: Any) -> Any:
    def create_loss_and_eval_metric(self: Any, args: Any) -> dict[str, Any]:
        loss_type = getattr(args, "loss_type", None)
        options = read_options()
        if options and loss_type not in DISTMATCH_LOSSES:
            now = "is unset" if loss_type is None else f"is {loss_type!r}, not a distmatch loss"
            raise DistMatchConfigError(
                f"{OPTIONS_ENV} sets {', '.join(sorted(options))} but --loss_type {now}, so training would use "
                f"ms-swift's own loss; add --loss_type with one of: {', '.join(DISTMATCH_LOSSES)}."
            )
        if isinstance(loss_type, str) and loss_type not in loss_map:
            raise DistMatchConfigError(
                f"--loss_type {loss_type!r} is unknown; the distmatch losses are: {', '.join(LOSS_NAMES)} "
                f"(ms-swift's own: {', '.join(k for k in loss_map if k not in LOSS_NAMES)})."
            )
        return original(self, args)

    create_loss_and_eval_metric._distmatch = True  # type: ignore[attr-defined]
    return create_loss_and_eval_metric


def register() -> None:
    """Add every distmatch loss to ms-swift's `loss_map`, check the options, and print refusals as one line."""
    print_config_errors_as_one_line()
    read_options()
    clashes = sorted(set(LOSS_NAMES) & {k for k, v in loss_map.items() if not _is_ours(v)})
    if clashes:
        raise DistMatchConfigError(
            f"ms-swift already defines loss_type(s) {', '.join(clashes)}; this distmatch plugin would replace them."
        )
    for name in LOSS_NAMES:
        loss_map[name] = type(f"DistMatch_{name}", (DistMatchSwiftLoss,), {"loss_name": name})
    current = SwiftMixin.create_loss_and_eval_metric
    if not getattr(current, "_distmatch", False):
        SwiftMixin.create_loss_and_eval_metric = _checked_create_loss(current)


def _is_ours(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, DistMatchSwiftLoss)
