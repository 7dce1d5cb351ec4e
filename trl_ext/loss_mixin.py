"""`DistMatchLossMixin`: the framework-neutral part of a `transformers.Trainer` that trains with a distmatch loss.

Used by the TRL trainer (`trl_ext.trainer`) and the Axolotl trainer (`axolotl_distmatch.trainer`); imports
neither framework. It patches the model's forward once (`model_forward.py`), asks it for per-token losses and
reduces them by TRL's contract (sum / `num_items_in_batch`, or the local token count; x processes under
`average_tokens_across_devices`), then logs CE, entropy, token accuracy and the loss's own statistics.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from .anchor import INITIAL, make_reference
from .anchor import OPTION as REFERENCE_OPTION
from .anchor import save_for_debugging as save_reference_for_debugging
from .cost_embedding import resolve_cost_embedding, save_for_debugging, training_vocab_size
from .losses import LOSSES
from .model_card import add_section
from .model_forward import LossRequest, install_loss_forward
from .options import DISTMATCH_LOSSES, cost_embedding_option, fused_settings, loss_params
from .resume import Resume, checkpoint_folder, resolve_resume, used_options, write_record
from .teardown import release_process_groups_at_exit


def _checkpoint_step(checkpoint: str) -> int:
    """The global step a checkpoint folder was saved at (its trainer_state.json), 0 when unknown."""
    try:
        with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as handle:
            return int(json.load(handle).get("global_step", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


logger = logging.getLogger(__name__)

_BASE_STAT_KEYS = (("ce", "ce"), ("entropy", "entropy"), ("mean_token_accuracy", "top1_correct"))
#: (logged key, `TokenStats` field): the shared statistics and every loss's own (EMO's `demd`).
_STAT_KEYS = _BASE_STAT_KEYS + tuple(
    dict.fromkeys((stat, stat) for spec in LOSSES.values() for stat in spec.stats)
)


#: Options whose value is used as min(value, V): legitimate (the authors' top-k entropy over a vocabulary smaller
#: than k is the entropy over all of it), but said once so that a typo (eaft_k: 2000 for 20) does not pass unseen.
VOCAB_CAPPED_OPTIONS = ("eaft_k",)


def _note_options_capped_by_vocabulary(loss: str, options: dict[str, Any], vocabulary: int | None) -> None:
    used = {option.name for option in LOSSES[loss].options}
    for name in VOCAB_CAPPED_OPTIONS:
        value = options.get(name)
        if name in used and vocabulary is not None and isinstance(value, int) and value > vocabulary:
            logger.warning(
                "distmatch: %s=%s is larger than the vocabulary (%s tokens); loss=%r uses all %s logits (min(%s, V)).",
                name,
                value,
                vocabulary,
                loss,
                vocabulary,
                name,
            )


def _has_room(folder: Path, probe_bytes: int = 1 << 20) -> bool:
    """Whether `probe_bytes` more can be written to `folder` (False on ENOSPC): tells a full disk from other
    write errors after a failed save, whatever exception type the writer turned ENOSPC into."""
    probe = folder / f".distmatch-space-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as stream:
            stream.write(b"\0" * probe_bytes)
            stream.flush()
            os.fsync(stream.fileno())
        return True
    except OSError as err:
        return err.errno != errno.ENOSPC
    finally:
        probe.unlink(missing_ok=True)


def unwrap_peft(model: torch.nn.Module) -> torch.nn.Module:
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) and hasattr(model, "peft_config") else model


class DistMatchLossMixin:
    """Framework-neutral part of a trainer that trains with a distmatch loss (used by TRL and Axolotl trainers).

    The host class is a `transformers.Trainer`; it calls `setup_distmatch_loss` after its own `__init__` and
    routes `compute_loss` to `distmatch_compute_loss` when `distmatch_request` is set, and implements
    `record_metric` to store a logged value the way its framework logs metrics, `distmatch_settings` /
    `use_distmatch_settings` (the loss and options it is asked for, validated; switching them) and
    `distmatch_allows_loss_change`.

    Saving writes the run record (`trl_ext.resume`) next to the weights; `train(resume_from_checkpoint=...)` checks
    the checkpoint's record first (continuing with its loss when none is asked for, refusing another one unless
    allowed) and sets the loss up again if the settings were changed after the trainer was built.
    """

    distmatch_request: LossRequest | None = None
    #: The framework named in the run record.
    distmatch_framework = "trl"
    #: (loss, the options it uses) that `distmatch_request` was set up with; None while nothing is set up.
    _distmatch_active: tuple[str, dict[str, Any]] | None = None

    def setup_distmatch_loss(self, loss: str, options: dict[str, Any]) -> None:
        """Patch the (PEFT-unwrapped) model's forward and resolve EMO's cost embedding, once, on every rank."""
        params = loss_params(loss, options)  # validates before any model work
        _note_options_capped_by_vocabulary(loss, options, training_vocab_size(unwrap_peft(self.model)))
        release_process_groups_at_exit()
        target = unwrap_peft(self.model)
        reference = None
        if LOSSES[loss].needs_reference:  # taken before the forward is patched: the starting model, frozen
            reference = self.distmatch_reference(target, options.get(REFERENCE_OPTION) or INITIAL)
        install_loss_forward(target)
        cost_embedding, live = (None, False)
        source = cost_embedding_option(loss)
        if source is not None:
            cost_embedding, live = resolve_cost_embedding(target, options[source])
            save_for_debugging(cost_embedding)
        self.distmatch_request = LossRequest(
            name=loss,
            params=params,
            cost_embedding=cost_embedding,
            live_cost=live,
            reference=reference,
            settings=fused_settings(options),
        )
        self._distmatch_active = (loss, used_options(loss, options))

    def distmatch_reference(self, target: torch.nn.Module, source: str = INITIAL) -> Any:
        """The anchored losses' reference model (`trl_ext.anchor`), taken once per trainer and source: another
        checkpoint's folder (`source`), loaded and frozen; else with PEFT adapters the trained model with its
        adapters off (no copy), else a frozen copy of `target` as it is now."""
        held = getattr(self, "_distmatch_reference", None)
        if held is None or held[0] is not target or held[2] != source:
            reference = make_reference(
                target, target is not self.model, source, getattr(self, "accelerator", None)
            )
            save_reference_for_debugging(reference)
            held = (target, reference, source)
            self._distmatch_reference = held
        return held[1]

    # -- the loss a run is asked for, the run record, resuming -------------------------------------------------

    def distmatch_settings(self) -> tuple[str | None, dict[str, Any]]:
        """The loss this trainer is asked to train (a distmatch loss, the framework's own loss type, or None) and
        every loss option (defaults filled in), validated again (they may have been assigned after construction)."""
        raise NotImplementedError

    def use_distmatch_settings(self, loss: str, options: dict[str, Any]) -> None:
        """Ask this trainer for `loss` with `options` from now on (a resume without a loss: the record's)."""
        raise NotImplementedError

    def distmatch_allows_loss_change(self) -> bool:
        """Whether a resume may train another loss or other options than the checkpoint's record."""
        return False

    def apply_distmatch_settings(self, loss: str | None, options: dict[str, Any]) -> None:
        """Make `distmatch_request` train `loss` (None: the framework's own loss) with `options`."""
        if loss is None:
            self.distmatch_request, self._distmatch_active = None, None
            return
        self.setup_distmatch_loss(loss, options)

    def resume_distmatch(self, checkpoint: str | None) -> Resume | None:
        """Check `checkpoint`'s run record against the loss asked for: adopt the recorded loss when none is asked
        for, refuse another one (`DistMatchConfigError`) unless allowed; one log line when the loss is adopted or
        changed."""
        loss, options = self.distmatch_settings()
        resume = resolve_resume(checkpoint, loss, options, allow_change=self.distmatch_allows_loss_change())
        if resume is None:
            return None
        if resume.action == "adopt":
            self.use_distmatch_settings(resume.loss, resume.options)
        self._distmatch_history = resume.record.history_until(_checkpoint_step(resume.checkpoint))
        message = resume.message()
        if message is not None and getattr(self.args, "process_index", 0) == 0:
            logger.warning(message)
        return resume

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """`Trainer.train` after checking the loss: settings assigned since construction are validated and set up,
        and a checkpoint's run record is compared with them (see `resume_distmatch`)."""
        self.resume_distmatch(checkpoint_folder(resume_from_checkpoint, self.args.output_dir))
        loss, options = self.distmatch_settings()
        loss = loss if loss in DISTMATCH_LOSSES else None
        if (None if loss is None else (loss, used_options(loss, options))) != self._distmatch_active:
            self.apply_distmatch_settings(loss, options)
        result = super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]
        # The output folder too (Axolotl saves the final model with `save_pretrained`, not through `save_model`).
        self.write_distmatch_record(self.args.output_dir)
        return result

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The framework's save (a checkpoint's or the final model), then the run record next to the weights."""
        super().save_model(output_dir, _internal_call)  # type: ignore[misc]
        self.write_distmatch_record(self.args.output_dir if output_dir is None else output_dir)

    def write_distmatch_record(self, folder: str) -> None:
        """`folder/distmatch.json` (main process): the distmatch loss and options this trainer trains, if any."""
        loss, options = self.distmatch_settings()
        if loss in DISTMATCH_LOSSES and self.args.should_save:
            os.makedirs(folder, exist_ok=True)
            write_record(
                folder, loss, options, self.distmatch_framework, self.distmatch_history(loss, options)
            )

    def distmatch_history(self, loss: str, options: dict[str, Any]) -> list[dict[str, Any]]:
        """Each loss this run (and the runs it resumed) trained, with its options and steps, this one last."""
        history = [dict(h) for h in getattr(self, "_distmatch_history", [])]
        step = int(getattr(getattr(self, "state", None), "global_step", 0) or 0)
        used = json.loads(json.dumps(used_options(loss, options)))
        if history and (history[-1].get("loss"), history[-1].get("options")) == (loss, used):
            history[-1]["to_step"] = step
            return history
        start = int(history[-1].get("to_step", 0)) if history else 0
        return [*history, {"loss": loss, "options": used, "from_step": start, "to_step": step}]

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """The framework's model card, tagged with the objective (`distmatch`, `distmatch-loss-emo`), with a section
        naming the loss, its options, the distmatch version and the paper (`trl_ext.model_card`)."""
        loss, options = self.distmatch_settings()
        ours = ["distmatch", f"distmatch-loss-{loss}"]
        if loss in DISTMATCH_LOSSES and len(args) < 3:  # `tags` is the third parameter (TRL and transformers)
            tags = kwargs.get("tags")
            tags = [] if tags is None else [tags] if isinstance(tags, str) else list(tags)
            kwargs["tags"] = [*tags, *ours]
        if loss in DISTMATCH_LOSSES:
            # Also the model's own tags: PEFT rewrites an adapter's card with those alone (transformers' Trainer
            # calls `create_or_update_model_card` after writing the card: Axolotl's LoRA runs).
            model = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # type: ignore[attr-defined]
            if hasattr(model, "add_model_tags"):
                model.add_model_tags(ours)
        super().create_model_card(*args, **kwargs)  # type: ignore[misc]
        if loss in DISTMATCH_LOSSES and self.is_world_process_zero():  # type: ignore[attr-defined]
            card = os.path.join(self.args.output_dir, "README.md")
            history = self.distmatch_history(loss, options)
            add_section(card, loss, used_options(loss, options), self.distmatch_framework, history)

    def record_metric(self, mode: str, key: str, value: float) -> None:
        raise NotImplementedError

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """transformers' checkpoint save; if it fails, the half-written `checkpoint-N` (no `trainer_state.json`
        yet) is removed, so that a resume never takes it for the newest checkpoint (`resume_from_checkpoint=True`
        picks the highest N), and a full disk is named as such (torch's zip writer reports it as a RuntimeError),
        with the checkpoint to resume from."""
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
        except (OSError, RuntimeError) as err:
            run_dir = Path(self._get_output_dir(trial=trial))  # type: ignore[attr-defined]
            partial = run_dir / f"checkpoint-{self.state.global_step}"  # type: ignore[attr-defined]
            full = (isinstance(err, OSError) and err.errno == errno.ENOSPC) or not _has_room(run_dir)
            if partial.is_dir() and not (partial / "trainer_state.json").exists():
                shutil.rmtree(partial, ignore_errors=True)
            if not full:
                logger.error("distmatch: saving %s failed; the incomplete checkpoint was removed.", partial)
                raise
            complete = sorted(
                (int(c.name[len("checkpoint-") :]), c)
                for c in run_dir.glob("checkpoint-*")
                if c.name[len("checkpoint-") :].isdigit() and (c / "trainer_state.json").is_file()
            )
            newest = (
                f"resume from {complete[-1][1]}" if complete else "no complete checkpoint was written before"
            )
            raise OSError(
                errno.ENOSPC,
                f"distmatch: no space left on the device while saving {partial} (removed: it was incomplete); "
                f"{newest}; free space and run again with --resume_from_checkpoint",
            ) from err

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
        if outputs.nonfinite_source is not None and not getattr(self, "_distmatch_nonfinite_reported", False):
            self._distmatch_nonfinite_reported = True  # once per run: the metric counts every later step
            logger.warning(
                "distmatch: loss=%s is not finite for some tokens at step %s; the non-finite values come from %s. "
                "The `nonfinite_tokens` metric counts such tokens (the logged `loss` may hide it: transformers' "
                "`logging_nan_inf_filter` replaces a non-finite loss by the running mean).",
                self.distmatch_request.name if self.distmatch_request else "?",
                getattr(getattr(self, "state", None), "global_step", "?"),
                outputs.nonfinite_source,
            )
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
        nonfinite = (~torch.isfinite(outputs.per_token_loss.detach()) & outputs.label_mask).sum().float()
        sums = torch.stack(
            [outputs.label_mask.sum().float(), nonfinite] + [t.detach().float().sum() for _, t in present]
        )
        sums = self.accelerator.gather_for_metrics(sums.unsqueeze(0)).sum(0)
        count = sums[0].item()
        self.record_metric(mode, "nonfinite_tokens", sums[1].item())  # all ranks' tokens with a NaN/inf loss
        for (key, _), total in zip(present, sums[2:].tolist()):
            self.record_metric(mode, key, total / count if count > 0 else 0.0)
