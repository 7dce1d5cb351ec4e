"""`DistMatchTrainer`: Axolotl's trainer training with a distmatch loss (EMO, GEM, baselines).

What changes compared to `AxolotlTrainer` (everything else, e.g. packing, optimizers, token throughput, is
Axolotl's):

* the loss: `compute_loss` ends in `DistMatchLossMixin.distmatch_compute_loss` (trl_ext) instead of the model's
  cross-entropy: the model's patched forward computes per-token losses from the hidden states (fused with the LM
  head where that is safe) and the sum is divided by `num_items_in_batch`;
* `num_items_in_batch` is always counted (Axolotl <= 0.19 inspects the inner model's forward, finds no
  `num_items_in_batch` and disables the count: per-micro-batch means divided by the accumulation steps);
* packed rows: a label at `position_ids == 0` starts a new document and is never a target of the previous one;
  such labels are set to -100 before the tokens are counted, in training (`get_batch_samples`) and evaluation
  (`prediction_step`). No attention mask is ever added (sdpa / eager / flash attention isolate packed documents
  through `position_ids` only without one);
* logs: `ce`, `entropy`, `mean_token_accuracy` (and `demd` for EMO) next to the objective; no `ppl`, which Axolotl
  derives from the loss assuming it is cross-entropy.

Debugging aid: with `DISTMATCH_DEBUG_TOKEN_COUNTS=/path/file.jsonl`, every batch (labels and position ids before
masking) and every loss call (`num_items_in_batch`, local count, input keys) is appended to that file as JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, ClassVar

import torch
from axolotl.core.trainers.base import AxolotlTrainer
from transformers import Trainer

from trl_ext.checks import DistMatchConfigError
from trl_ext.loss_mixin import DistMatchLossMixin
from trl_ext.losses import IGNORE_INDEX
from trl_ext.options import loss_params
from trl_ext.output_lock import lock_output_dir

DEBUG_ENV = "DISTMATCH_DEBUG_TOKEN_COUNTS"


def mask_document_starts(batch: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Set `labels` to -100 at every document start (in place on the dict; the tensors are not modified).

    In a packed row the token at a document start is not a target of the previous document's last token; in an
    unpacked row it is column 0, which the shift drops anyway. Document starts are where `position_ids == 0`, or,
    for a single flattened row without position ids, the flash-attention boundaries `cu_seq_lens_q`.
    """
    labels, position_ids = batch.get("labels"), batch.get("position_ids")
    if not isinstance(labels, torch.Tensor):
        return batch
    if isinstance(position_ids, torch.Tensor) and position_ids.shape == labels.shape:
        batch["labels"] = labels.masked_fill(position_ids.to(labels.device) == 0, IGNORE_INDEX)
        return batch
    boundaries = batch.get("cu_seq_lens_q")
    if position_ids is None and isinstance(boundaries, torch.Tensor) and labels.shape[0] == 1:
        starts = boundaries.to(labels.device, torch.long)
        starts = starts[(starts > 0) & (starts < labels.shape[1])]
        labels = labels.clone()
        labels[0, starts] = IGNORE_INDEX
        batch["labels"] = labels
    return batch


class _NoPerplexityLogs(dict):
    """A log dict that drops `ppl` / `eval_ppl`: Axolotl computes them as exp(loss), true only for cross-entropy."""

    _DROPPED = frozenset({"ppl", "eval_ppl"})

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self._DROPPED:
            super().__setitem__(key, value)


class _DebugLog:
    def __init__(self, path: str | None, rank: int) -> None:
        self.path, self.rank = path, rank

    def write(self, record: dict[str, Any]) -> None:
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"rank": self.rank, **record}) + "\n")


def _as_int(value: Any) -> int | None:
    if value is None:
        return None
    return int(value.sum().item() if isinstance(value, torch.Tensor) else value)


class _DistMatchLossHead(Trainer):
    """Placed right before `transformers.Trainer` in `DistMatchTrainer`'s MRO.

    `AxolotlTrainer.compute_loss` (token throughput, model-specific input fixes) runs first and then calls
    `super().compute_loss`, which lands here instead of in `Trainer.compute_loss` (the model's cross-entropy).
    """

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        return self._distmatch_loss_step(model, inputs, return_outputs, num_items_in_batch)  # type: ignore[attr-defined]


class DistMatchTrainer(DistMatchLossMixin, AxolotlTrainer, _DistMatchLossHead):
    """`AxolotlTrainer` whose objective is a distmatch loss; build it with `DistMatchTrainer.configured(...)`."""

    #: Set on the subclass returned by `configured` (Axolotl constructs the trainer class with its own arguments).
    distmatch_loss: ClassVar[str | None] = None
    distmatch_options: ClassVar[Mapping[str, Any]] = {}
    #: `allow_loss_change: true`: a resume may train another loss than the checkpoint's record (`trl_ext.resume`).
    distmatch_allow_loss_change: ClassVar[bool] = False
    distmatch_framework = "axolotl"
    #: Axolotl >= 0.21: do not report exp(loss) as perplexity (0.19 has no switch: `log` drops the key).
    reports_token_perplexity = False

    @classmethod
    def configured(
        cls, loss: str, options: Mapping[str, Any], allow_loss_change: bool = False
    ) -> type[DistMatchTrainer]:
        """A subclass bound to `loss` and its options (all of `trl_ext.options.LOSS_OPTIONS`)."""
        return type(
            cls.__name__,
            (cls,),
            {
                "__module__": cls.__module__,
                "distmatch_loss": loss,
                "distmatch_options": dict(options),
                "distmatch_allow_loss_change": allow_loss_change,
            },
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if self.distmatch_loss is None:
            raise TypeError("Use DistMatchTrainer.configured(loss, options) to build the trainer class.")
        self._distmatch_loss_only = False
        self._distmatch_setup_pending = True
        super().__init__(*args, **kwargs)
        if self.args.process_index == 0:  # one run per output folder (a second one is refused in one line)
            lock_output_dir(self.args.output_dir)
        # The loss always predicts labels[..., 1:]: count those (a model with a non-causal-LM `loss_type` would
        # otherwise be counted over all labels).
        self._loss_shifts_labels = True
        self._distmatch_debug = _DebugLog(os.environ.get(DEBUG_ENV), self.args.process_index)
        if not getattr(self, "is_fsdp_enabled", False):
            # Now, before any checkpoint is loaded: EMO's frozen cost embedding is the pre-trained head also when
            # resuming. Under DeepSpeed ZeRO-3 the head is partitioned since loading; the copy is gathered here on
            # every rank (each rank constructs the trainer).
            self._distmatch_setup()
        # FSDP: lazily on the first step (all ranks run it): with `cpu_ram_efficient_loading` the non-main ranks
        # hold empty weights until `accelerator.prepare` broadcasts them inside `train()`.

    def _distmatch_setup(self) -> None:
        self._distmatch_setup_pending = False
        assert self.distmatch_loss is not None
        self.setup_distmatch_loss(self.distmatch_loss, dict(self.distmatch_options))

    # -- the loss asked for (trl_ext.loss_mixin: run record, resume) -------------------------------------------

    def distmatch_settings(self) -> tuple[str | None, dict[str, Any]]:
        options = dict(self.distmatch_options)
        if self.distmatch_loss is not None:
            try:  # validated again: the attributes may have been assigned after the config was validated
                loss_params(self.distmatch_loss, options)
            except ValueError as err:
                raise DistMatchConfigError(str(err)) from None
        return self.distmatch_loss, options

    def use_distmatch_settings(self, loss: str, options: dict[str, Any]) -> None:
        self.distmatch_loss, self.distmatch_options = loss, dict(options)  # this instance only

    def distmatch_allows_loss_change(self) -> bool:
        return self.distmatch_allow_loss_change

    def apply_distmatch_settings(self, loss: str | None, options: dict[str, Any]) -> None:
        if not self._distmatch_setup_pending:  # FSDP: set up on the first step, from the attributes
            super().apply_distmatch_settings(loss, options)

    # -- num_items_in_batch -----------------------------------------------------------------------------------

    @property  # type: ignore[override]
    def model_accepts_loss_kwargs(self) -> bool:
        """Always true: `compute_loss` divides by `num_items_in_batch`, so the Trainer must count the tokens and
        not divide the loss by the accumulation steps again. Axolotl <= 0.19 sets it to False for every causal LM
        (it inspects the inner model's forward); the assignment is kept but not used."""
        return True

    @model_accepts_loss_kwargs.setter
    def model_accepts_loss_kwargs(self, value: bool) -> None:
        self.__dict__["_model_accepts_loss_kwargs_ignored"] = value

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int, device: Any) -> Any:
        """Mask document starts in each micro-batch before the Trainer counts `num_items_in_batch`."""
        batch_samples, num_items_in_batch = super().get_batch_samples(
            map(self._distmatch_prepare_batch, epoch_iterator), num_batches, device
        )
        self._distmatch_debug.write(
            {
                "event": "window",
                "batches": len(batch_samples),
                "num_items_in_batch": _as_int(num_items_in_batch),
            }
        )
        return batch_samples, num_items_in_batch

    def _distmatch_prepare_batch(self, batch: Any) -> Any:
        if not isinstance(batch, MutableMapping):
            return batch
        if self._distmatch_debug.path and isinstance(batch.get("labels"), torch.Tensor):
            position_ids = batch.get("position_ids")
            self._distmatch_debug.write(
                {
                    "event": "batch",
                    "keys": sorted(batch),
                    "labels": batch["labels"].tolist(),
                    "position_ids": None if position_ids is None else position_ids.tolist(),
                }
            )
        return mask_document_starts(batch)

    # -- loss ------------------------------------------------------------------------------------------------

    def _distmatch_loss_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool, num_items_in_batch: Any
    ) -> Any:
        if self._distmatch_setup_pending:
            self._distmatch_setup()
        mask_document_starts(inputs)  # idempotent; covers callers that did not go through get_batch_samples
        if self._distmatch_debug.path:
            labels = inputs["labels"]
            self._distmatch_debug.write(
                {
                    "event": "loss",
                    "mode": "train" if model.training else "eval",
                    "keys": sorted(inputs),
                    "num_items_in_batch": _as_int(num_items_in_batch),
                    "local_items": int((labels[..., 1:] != IGNORE_INDEX).sum().item()),
                }
            )
        if return_outputs and self._distmatch_loss_only:
            # Evaluation without metrics on predictions: skip the mixin's extra forward that rebuilds the logits.
            return self.distmatch_compute_loss(model, inputs, False, num_items_in_batch), {}
        return self.distmatch_compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> Any:
        mask_document_starts(inputs)  # before the Trainer counts the evaluation batch's tokens
        self._distmatch_loss_only = prediction_loss_only
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        finally:
            self._distmatch_loss_only = False

    # -- logging -----------------------------------------------------------------------------------------------

    def record_metric(self, mode: str, key: str, value: float) -> None:
        self.store_metrics({key if mode == "train" else f"eval_{key}": value}, train_eval=mode)  # type: ignore[arg-type]

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        filtered = _NoPerplexityLogs(logs)
        result = super().log(filtered, *args, **kwargs)
        logs.update(filtered)  # Axolotl adds its stored metrics to the caller's dict; keep that
        return result


__all__ = ["DEBUG_ENV", "DistMatchTrainer", "mask_document_starts"]
