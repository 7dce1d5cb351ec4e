"""`DistMatchSFTTrainer`: TRL's `SFTTrainer` training with EMO / GEM / the baselines (TRL 1.9 - 1.16).

Only `compute_loss` changes, and only when `args.loss` names a distmatch loss: the model's patched forward
(`model_forward.py`) returns per-token losses computed from the hidden states, and this class reduces them by
TRL's contract (sum / `num_items_in_batch`, or the local token count; x processes under
`average_tokens_across_devices`), then logs CE, entropy, token accuracy (and DEMD for EMO) next to the objective.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch
from trl import SFTTrainer

from .checks import DistMatchConfigError
from .config import DistMatchSFTConfig
from .cost_embedding import check_configured
from .loss_mixin import DistMatchLossMixin, unwrap_peft
from .output_lock import lock_output_dir
from .resume import checkpoint_folder, resolve_resume
from .teardown import release_process_groups_at_exit

logger = logging.getLogger(__name__)

__all__ = ["DistMatchLossMixin", "DistMatchSFTTrainer"]


@contextlib.contextmanager
def _allow_peft_lm_head(enabled: bool):
    """TRL >= 1.15 rejects a PEFT adapter on `lm_head` because its fused NLL reads `lm_head.weight`; a distmatch
    loss computes such a model through the logits path (the adapter runs), so the guard does not apply."""
    import trl.trainer.sft_trainer as sft_module

    saved = getattr(sft_module, "BaseTunerLayer", None)
    if not enabled or saved is None:
        yield
        return

    class _NoTunerLayer:  # isinstance(head, _NoTunerLayer) is always False
        pass

    sft_module.BaseTunerLayer = _NoTunerLayer
    try:
        yield
    finally:
        sft_module.BaseTunerLayer = saved


def _adopt_recorded_loss(args: DistMatchSFTConfig) -> None:
    """`args.resume_from_checkpoint` (what TRL's SFT script resumes from) names a checkpoint with a run record: with
    no `loss`, take the recorded one now, before TRL sets the trainer up (one log line); another loss is refused."""
    checkpoint = checkpoint_folder(args.resume_from_checkpoint, args.output_dir)
    resume = resolve_resume(
        checkpoint, args.loss, args.loss_options(), allow_change=bool(args.allow_loss_change)
    )
    if resume is not None and resume.action == "adopt":
        args.use_loss(resume.loss, resume.options)
        if args.process_index == 0:
            logger.warning(resume.message())


class DistMatchSFTTrainer(DistMatchLossMixin, SFTTrainer):
    """`SFTTrainer` whose objective is `args.loss` (see `DistMatchSFTConfig`)."""

    def __init__(
        self, model: Any, args: DistMatchSFTConfig | None = None, *pargs: Any, **kwargs: Any
    ) -> None:
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = DistMatchSFTConfig(f"{name.split('/')[-1]}-SFT")
        if hasattr(args, "validate_distmatch"):  # a loss or option assigned after construction is checked too
            args.validate_distmatch()
            _adopt_recorded_loss(args)
        loss = getattr(args, "distmatch_loss", None)
        if loss is not None:  # before TRL tokenises the dataset: another model's vocabulary is refused now
            check_configured(loss, args.loss_options(), model)
        # One run per output folder (a second one is refused in one line), before the model loads (`model` a path).
        if loss is not None and int(os.environ.get("RANK", "0")) == 0:
            lock_output_dir(args.output_dir)
        with _allow_peft_lm_head(loss is not None):
            super().__init__(model, args, *pargs, **kwargs)
        release_process_groups_at_exit()  # multi-process runs: no communication thread outlives the interpreter
        if loss is not None:
            self._reject_incompatible(loss)
            self.setup_distmatch_loss(loss, args.loss_options())

    def _reject_incompatible(self, loss: str) -> None:
        problems = []
        if self.compute_loss_func is not None:
            problems.append("a `compute_loss_func` (remove it; the loss is `loss`)")
        config = unwrap_peft(self.model).config
        if getattr(config.get_text_config(), "output_router_logits", False):
            problems.append("an MoE model with `output_router_logits` (its auxiliary loss is not added yet)")
        parallelism = getattr(self.accelerator, "parallelism_config", None)
        if parallelism is not None and (
            getattr(parallelism, "sp_enabled", False) or getattr(parallelism, "cp_enabled", False)
        ):
            problems.append("sequence / context parallelism")
        if problems:
            raise ValueError(f"loss={loss!r} cannot be combined with " + "; ".join(problems) + ".")

    def record_metric(self, mode: str, key: str, value: float) -> None:
        self._metrics[mode][key].append(value)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """`Trainer.train`; without `resume_from_checkpoint` (None), `args.resume_from_checkpoint` is the checkpoint:
        the one whose recorded loss the constructor took, and the one `--resume_from_checkpoint` names (TRL's SFT
        script passes it from TRL 1.14 on; TRL 1.9's calls `train()` without it and trained from scratch). `False`
        starts from scratch."""
        if resume_from_checkpoint is None:
            resume_from_checkpoint = getattr(self.args, "resume_from_checkpoint", None)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def distmatch_settings(self) -> tuple[str | None, dict[str, Any]]:
        args = self.args
        if not hasattr(args, "validate_distmatch"):  # TRL's own SFTConfig: TRL's loss
            return None, {}
        args.validate_distmatch()
        return args.loss, args.loss_options()

    def use_distmatch_settings(self, loss: str, options: dict[str, Any]) -> None:
        if not hasattr(self.args, "use_loss"):
            raise DistMatchConfigError(
                f"the checkpoint was trained with loss={loss!r} but `args` is a {type(self.args).__name__}, which "
                "has no `loss`: pass a trl_ext.config.DistMatchSFTConfig (with `loss` set or unset)."
            )
        self.args.use_loss(loss, options)

    def distmatch_allows_loss_change(self) -> bool:
        return bool(getattr(self.args, "allow_loss_change", False))

    def apply_distmatch_settings(self, loss: str | None, options: dict[str, Any]) -> None:
        if loss is not None:
            self._reject_incompatible(loss)
        super().apply_distmatch_settings(loss, options)

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        if self.distmatch_request is None:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        # TRL < 1.15's prediction_step marker: transformers <= 5.16 always asks for outputs during evaluation;
        # when only the loss is needed, skip the extra full-logits forward.
        if inputs.pop("_prediction_loss_only", None):
            result = (self.distmatch_compute_loss(model, inputs, False, num_items_in_batch), {})
        else:
            result = self.distmatch_compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            self._count_tokens(inputs)
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        return result

    def _count_tokens(self, inputs: dict[str, Any]) -> None:
        """TRL's `num_tokens` metric: attention-mask tokens, or the packed row length when padding-free."""
        if "attention_mask" in inputs:
            local = inputs["attention_mask"].sum()
        elif "position_ids" in inputs:
            local = torch.tensor(inputs["position_ids"].size(1), device=inputs["position_ids"].device)
        else:
            local = torch.tensor(inputs["input_ids"].numel(), device=inputs["input_ids"].device)
        total = self.accelerator.gather_for_metrics(local.reshape(1)).sum().item()
        self._total_train_tokens += total // getattr(self, "_tp_size", 1)
