"""`DistMatchSFTTrainer`: TRL's `SFTTrainer` training with EMO / GEM / the baselines (TRL 1.9 - 1.16).

Only `compute_loss` changes, and only when `args.loss` names a distmatch loss: the model's patched forward
(`model_forward.py`) returns per-token losses computed from the hidden states, and this class reduces them by
TRL's contract (sum / `num_items_in_batch`, or the local token count; x processes under
`average_tokens_across_devices`), then logs CE, entropy, token accuracy (and DEMD for EMO) next to the objective.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from pathlib import Path
from typing import Any

import torch
from trl import SFTTrainer

from .config import DistMatchSFTConfig
from .model_forward import LossRequest, install_loss_forward, resolve_cost_embedding
from .options import loss_params

_STAT_KEYS = (("ce", "ce"), ("entropy", "entropy"), ("mean_token_accuracy", "top1_correct"), ("demd", "demd"))
#: Debugging aid: a folder; every rank saves the EMO cost embedding it trains with there (`rank<N>.pt`).
COST_EMBEDDING_DEBUG_ENV = "DISTMATCH_DEBUG_COST_EMBEDDING"


def _destroy_process_group() -> None:
    """Registered with `atexit`: end the default process group, if it still exists, while the interpreter is whole.

    TRL's SFT script ends it (`trainer.end()`) only from TRL 1.16 with transformers >= 5.18; older stacks leave it
    to interpreter shutdown, where gloo worker threads may still hold finished work owning Python tensors (a known
    way for a rank to abort with `terminate called without an active exception` after a successful run). Not
    collective for gloo; a no-op when the group is already gone.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def end_process_group_at_exit() -> None:
    """Make sure the default process group is destroyed before the interpreter shuts down (idempotent)."""
    atexit.unregister(_destroy_process_group)
    atexit.register(_destroy_process_group)


def _save_cost_embedding(cost_embedding: torch.Tensor | None) -> None:
    folder = os.environ.get(COST_EMBEDDING_DEBUG_ENV)
    if not folder or cost_embedding is None:
        return
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    Path(folder).mkdir(parents=True, exist_ok=True)
    torch.save(cost_embedding.detach().cpu(), Path(folder) / f"rank{rank}.pt")


def _unwrap_peft(model: torch.nn.Module) -> torch.nn.Module:
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) and hasattr(model, "peft_config") else model


class DistMatchLossMixin:
    """Framework-neutral part of a trainer that trains with a distmatch loss (used by TRL and Axolotl trainers).

    The host class is a `transformers.Trainer`; it calls `setup_distmatch_loss` after its own `__init__` and
    routes `compute_loss` to `distmatch_compute_loss` when `distmatch_request` is set, and implements
    `record_metric` to store a logged value the way its framework logs metrics.
    """

    distmatch_request: LossRequest | None = None

    def setup_distmatch_loss(self, loss: str, options: dict[str, Any]) -> None:
        """Patch the (PEFT-unwrapped) model's forward and resolve EMO's cost embedding, once, on every rank."""
        params = loss_params(loss, options)  # validates before any model work
        end_process_group_at_exit()
        target = _unwrap_peft(self.model)
        install_loss_forward(target)
        cost_embedding, live = (None, False)
        if loss == "emo":
            cost_embedding, live = resolve_cost_embedding(target, options["emo_cost_embedding"])
            _save_cost_embedding(cost_embedding)
        self.distmatch_request = LossRequest(
            name=loss, params=params, cost_embedding=cost_embedding, live_cost=live
        )

    def record_metric(self, mode: str, key: str, value: float) -> None:
        raise NotImplementedError

    def distmatch_compute_loss(
        self, model: torch.nn.Module, inputs: dict[str, Any], return_outputs: bool, num_items_in_batch: Any
    ) -> Any:
        """TRL's reduction contract: sum / num_items_in_batch (or the local count), x processes when averaging."""
        mode = "train" if self.model.training else "eval"
        inputs["use_cache"] = False
        outputs = model(**inputs, distmatch_loss=self.distmatch_request)
        mask = outputs.label_mask
        denominator = mask.sum() if num_items_in_batch is None else num_items_in_batch
        # Clamped: a micro-batch without trainable tokens gives a finite, still differentiable 0.
        loss = outputs.per_token_loss.sum() / torch.as_tensor(denominator, device=mask.device).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            # num_items_in_batch counts every rank's tokens and DDP averages gradients across ranks.
            loss = loss * (self.accelerator.num_processes // getattr(self, "_tp_size", 1))
        self._log_token_stats(mode, outputs)
        if return_outputs:  # callers asking for logits (compute_metrics) get the model's own forward
            with torch.no_grad():
                logits_inputs = {k: v for k, v in inputs.items() if k not in ("labels", "shift_labels")}
                outputs = model(**logits_inputs)
            return loss, outputs
        return loss

    def _log_token_stats(self, mode: str, outputs: Any) -> None:
        stats = outputs.stats
        present = [
            (key, getattr(stats, field)) for key, field in _STAT_KEYS if getattr(stats, field) is not None
        ]
        sums = torch.stack(
            [outputs.label_mask.sum().float()] + [t.detach().float().sum() for _, t in present]
        )
        sums = self.accelerator.gather_for_metrics(sums.unsqueeze(0)).sum(0)
        count = sums[0].item()
        for (key, _), total in zip(present, sums[1:].tolist()):
            self.record_metric(mode, key, total / count if count > 0 else 0.0)


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


class DistMatchSFTTrainer(DistMatchLossMixin, SFTTrainer):
    """`SFTTrainer` whose objective is `args.loss` (see `DistMatchSFTConfig`)."""

    def __init__(
        self, model: Any, args: DistMatchSFTConfig | None = None, *pargs: Any, **kwargs: Any
    ) -> None:
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = DistMatchSFTConfig(f"{name.split('/')[-1]}-SFT")
        loss = getattr(args, "distmatch_loss", None)
        with _allow_peft_lm_head(loss is not None):
            super().__init__(model, args, *pargs, **kwargs)
        end_process_group_at_exit()  # multi-process runs: no abort or hang at interpreter exit
        if loss is not None:
            self._reject_incompatible(loss)
            self.setup_distmatch_loss(loss, args.loss_options())

    def _reject_incompatible(self, loss: str) -> None:
        args = self.args
        problems = []
        if self.compute_loss_func is not None:
            problems.append("a `compute_loss_func` (remove it; the loss is `loss`)")
        if getattr(args, "label_smoothing_factor", 0) > 0:
            problems.append("`label_smoothing_factor` > 0 (set it to 0)")
        config = _unwrap_peft(self.model).config
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
