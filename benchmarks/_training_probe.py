"""The training measurement: tokens per second and peak memory of a transformers `Trainer` run, and each run's ratios
to a baseline run. One module for both tools that measure training: benchmarks/bench_trl_training.py (a trainer built
in its worker process) and the GPU check's `trl sft` runs (tools/gpu_check_steps.py, through `install_probe`).

* `attach(trainer, record)` measures a trainer's run into `record` (a plain dict, JSON as it stands): each training
  step's input tokens, counted as its batch enters `training_step` (the attention mask's ones; every token without a
  mask, as in padding-free packing), the wall clock when training begins and at each step's end (CUDA synchronised
  first), the logged losses and the peak memory: CUDA's `max_memory_allocated` since training began (the model, its
  gradients and the optimizer state included), the process's `ru_maxrss` on a CPU.
* `install_probe()` attaches it to every `Trainer` the process creates when `DISTMATCH_GPU_CHECK_PROBE` names a file,
  and rewrites the record there after every step, so a run stopped by its time limit keeps the steps it measured.
  The GPU check's kit installs it at every interpreter start, so this module imports only the standard library at
  its top.
* `summarise(record, warmup)`: tokens/s over the steps after the first `warmup` (their tokens over their wall time:
  from the end of the last untimed step, or training's start, to the end of the last step), seconds per step, peak
  MiB, the first and last logged loss, the trainable parameters (a LoRA run's adapter).
* `add_ratios(runs, baseline)`: each measured run's tokens/s and peak MiB over the baseline run's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: The file a `trl sft` run's probe writes its record to (set by the GPU check for each run).
PROBE_ENV = "DISTMATCH_GPU_CHECK_PROBE"
#: The wall clock (`time.time()`) when the GPU check started the run's command: the start-up times count from it.
LAUNCHED_ENV = "DISTMATCH_GPU_CHECK_LAUNCHED"


def new_record() -> dict[str, Any]:
    """An empty measurement record, for `attach`."""
    return {"tokens": 0, "step_tokens": [], "step_end_s": [], "losses": [], "finished": False}


def peak_mib(cuda: bool) -> tuple[float, str]:
    """The peak memory so far, in MiB, and how it is measured."""
    if cuda:
        import torch

        return torch.cuda.max_memory_allocated() / 2**20, "cuda max_memory_allocated since training began"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "ru_maxrss (whole process)"


def _run_options(args: Any) -> dict[str, Any]:
    """The distmatch options set on the trainer's arguments (the loss's and the fused path's settings, given as
    options or taken from their environment fallback): what the run trained with. None for TRL's own trainer."""
    if not hasattr(args, "loss"):
        return {}
    from distmatch._loss_names import LOSS_OPTION_NAMES

    return {name: getattr(args, name) for name in LOSS_OPTION_NAMES if getattr(args, name, None) is not None}


def attach(
    trainer: Any,
    record: dict[str, Any],
    write: Callable[[], None] | None = None,
    launched: float | None = None,
) -> None:
    """Measure `trainer`'s training into `record` (from `new_record`). `write()` is called after every step and when
    training ends, with `record` up to date; `launched`: when the run's command started (`time.time()`), for the
    start-up times `trainer_ready_after_s` and `first_step_after_s`."""
    import torch
    from transformers import TrainerCallback

    cuda = trainer.args.device.type == "cuda"
    model = getattr(trainer, "model", None)
    record.update(
        trainable_params=None
        if model is None
        else sum(p.numel() for p in model.parameters() if p.requires_grad),
        trainer_class=type(trainer).__name__,
        device=torch.cuda.get_device_name(trainer.args.device) if cuda else "cpu",
        settings=_run_options(trainer.args),
    )
    if launched is not None:
        record["trainer_ready_after_s"] = time.time() - launched

    def save() -> None:  # after every step: kept small, its time falls into the next step's
        record["peak_mib"], record["memory_method"] = peak_mib(cuda)
        if write is not None:
            write()

    class Probe(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            record["train_begin_s"] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            record["step_end_s"].append(time.perf_counter())
            record["step_tokens"].append(record["tokens"])
            if len(record["step_end_s"]) == 1 and launched is not None:
                record["first_step_after_s"] = time.time() - launched
            save()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                record["losses"].append(float(logs["loss"]))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            record["finished"] = True
            save()

    training_step = trainer.training_step

    def counted_step(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        mask = inputs.get("attention_mask")
        record["tokens"] += int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel())
        return training_step(model, inputs, *args, **kwargs)

    trainer.training_step = counted_step  # the instance's: the trainer's loop calls self.training_step
    trainer.add_callback(Probe())


# ---------------------------------------------------------------------------------------------------------------
# The probe of the GPU check's `trl sft` runs: every Trainer of the process, without an import at start-up


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Patches `transformers.trainer.Trainer` right after that module is executed (no import at start-up)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "transformers.trainer":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            measure_every_trainer(module.Trainer, Path(os.environ[PROBE_ENV]))

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install_probe() -> None:
    """When `DISTMATCH_GPU_CHECK_PROBE` names a file, measure every Trainer this process creates into it."""
    if os.environ.get(PROBE_ENV) and not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())


def write_json(target: Path, record: dict[str, Any]) -> None:
    """`record` into `target`, replaced whole (a reader never sees half a record)."""
    target.with_suffix(".tmp").write_text(json.dumps(record))
    target.with_suffix(".tmp").replace(target)


def measure_every_trainer(trainer_cls: Any, target: Path) -> None:
    """Every `trainer_cls` created from now on is measured (`attach`), its record rewritten into `target`."""
    init = trainer_cls.__init__
    launched = os.environ.get(LAUNCHED_ENV)

    def measured_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        record = new_record()
        attach(self, record, lambda: write_json(target, record), float(launched) if launched else None)

    trainer_cls.__init__ = measured_init


# ---------------------------------------------------------------------------------------------------------------
# Reading a record


def summarise(record: dict[str, Any], warmup: int) -> dict[str, Any]:
    """Tokens/s over the steps after the first `warmup`, peak MiB, first and last loss (module docstring). A run cut
    before its untimed steps were done is timed after its first step; fewer than two steps (one without training's
    start) cannot be timed: ValueError."""
    ends, tokens = record["step_end_s"], record["step_tokens"]
    begin = record.get("train_begin_s")
    # times[i]: when step i + 1 began (training's start, or step i's end); counts[i]: the tokens trained before it
    times, counts = [begin, *ends], [0, *tokens]
    if len(ends) <= warmup or (warmup == 0 and begin is None):
        warmup = 1
    if len(ends) <= warmup:
        raise ValueError(f"{len(ends)} steps recorded: too few to time")
    seconds = times[-1] - times[warmup]
    counted = counts[-1] - counts[warmup]
    timed = len(ends) - warmup
    losses = record.get("losses") or [math.nan]
    return {
        "tokens_per_s": counted / seconds,
        "timed_tokens": counted,
        "timed_seconds": seconds,
        "timed_steps": timed,
        "s_per_step": seconds / timed,
        "step_seconds": [None if start is None else end - start for start, end in zip(times, ends)],
        "peak_mib": record["peak_mib"],
        "memory_method": record.get("memory_method"),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "device": record.get("device"),
        "trainer_class": record.get("trainer_class"),
        "trainable_params": record.get("trainable_params"),
        "finished": record.get("finished", False),
        "steps_done": len(ends),
        "trainer_ready_after_s": record.get("trainer_ready_after_s"),
        "first_step_after_s": record.get("first_step_after_s"),
        "settings": record.get("settings", {}),
    }


def add_ratios(runs: Mapping[str, dict[str, Any]], baseline: str) -> str:
    """Each measured run's `speed_ratio` (its tokens/s over the baseline run's) and `memory_ratio` (its peak MiB over
    the baseline run's). Against a baseline cut short (its `partial` says how) the ratios are taken and each run is
    marked `ratio_note`. Returns the baseline's state: `ok`, `partial: ...`, or why there are no ratios."""
    base = runs.get(baseline)
    if base is None:
        return f"no {baseline} run"
    if "tokens_per_s" not in base:
        state = "not run" if "not_run" in base else "failed"
        return f"{baseline} {state}: {base.get('error') or base.get('not_run')}"
    for result in runs.values():
        if "tokens_per_s" in result:
            result["speed_ratio"] = result["tokens_per_s"] / base["tokens_per_s"]
            result["memory_ratio"] = result["peak_mib"] / base["peak_mib"]
            if base.get("partial"):
                result["ratio_note"] = f"against a partial {baseline} run ({base['partial']})"
    return f"partial: {base['partial']}" if base.get("partial") else "ok"
