"""What a step and a training run of the GPU check are, and how a command's steps are chosen, timed and run.

The entries themselves are in tools/gpu_check_table.py (`STEPS`, `RUNS`): adding a step or a run is one entry
there. This module holds no step of its own: `plan` picks a command's steps from a table, `step_limits` gives each
its seconds, `run_plan` runs them and reads each one's verdict.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpu_check_runner import Runner, environment

#: The run the other runs' ratios are taken against (TRL's trainer with its default loss).
BASELINE = "trl"
#: The step whose limit is per process started (one a run) and set by `--run-limit`.
TRAIN = "train"


@dataclass
class Context:
    """What the steps work with: the checked arguments (tools/gpu_check.py `parse_args`), the runner of their
    processes, the training runs they may name, the kit, what the preparations made (`prepared`, by name) and the
    environment line."""

    args: argparse.Namespace
    runner: Runner
    runs: Mapping[str, Run]
    kit: Path
    kit_skip: str | None = None
    prepared: dict[str, Any] = field(default_factory=dict)
    #: The summary's environment line (`read_environment`): the packages' versions, the device.
    environment: dict[str, Any] = field(default_factory=dict)

    def read_environment(self) -> dict[str, Any]:
        """The packages' versions and the device as the steps' processes see them (the install step reads them once
        the kit is in place, before the other steps take the budget)."""
        self.environment = environment(self.args, self.runner.env)
        return self.environment


#: `(ctx, seconds) -> part`: a step's work, each process it starts limited to `seconds`.
StepRun = Callable[[Context, float], Any]


@dataclass(frozen=True)
class Step:
    """One step of the check (one entry of `gpu_check_table.STEPS`).

    * `name`: as `--steps` names it, and the key of its part in summary.json and summary.md.
    * `gpu_s`, `cpu_s`: seconds for each process it starts (for `train`, for each run) on the GPU and in the CPU
      dry run (`--budget` caps them all together).
    * `run(ctx, seconds)`: what it runs, through `ctx.runner` (with `ctx.args.tiny` for the dry run's shapes); returns
      its part, what it read back (`status`: its process's); a preparation returns what the steps that need it
      use, or None when it failed.
    * `verdict(part, device)`: how its verdict is read: `ok` / `pass` only when all its work succeeded
      (docs/benchmarks.md "The summary"); `partial...` / `not run...` when not everything ran; anything else fails.
    * `note(part)`: the part table's details column; `report(part)`: lines after the part table (optional).
    * `needs`: preparations run once, before the first step that needs them; a step whose preparation failed is
      not started (`not started (build failed)`).
    * `when`: `chosen` (when `--steps` names it), `always` (every run, first: the install), `needed` (a
      preparation, no part of its own: the model and data).
    """

    name: str
    gpu_s: float
    cpu_s: float
    run: StepRun
    verdict: Callable[[dict[str, Any], str], str] | None = None
    note: Callable[[dict[str, Any]], str] | None = None
    report: Callable[[dict[str, Any]], list[str]] | None = None
    needs: tuple[str, ...] = ()
    when: Literal["chosen", "always", "needed"] = "chosen"


@dataclass(frozen=True)
class Goal:
    """A training run's goal (GPU goal 2): its tokens/s at least `speed` times the run `vs`'s, and its peak
    memory at most `memory` times that run's (None: not asked; both None: measured and reported only)."""

    vs: str
    speed: float | None = None
    memory: float | None = None

    def text(self) -> str:
        asked = [f">= {self.speed:g}x tokens/s" if self.speed is not None else ""]
        asked.append(f"<= {self.memory:g}x peak memory" if self.memory is not None else "")
        return ", ".join(a for a in asked if a) or "reported"


@dataclass(frozen=True)
class Run:
    """One `trl sft` run of the train step (one entry of `gpu_check_table.RUNS`).

    * `args`: its `trl sft` arguments besides the common ones (model, data, shapes, precision: `train_args`).
    * `settings`: the fused path's settings as `trl sft` options (docs/losses.md "Memory-efficient paths:
      settings"), option -> value, e.g. `{"loss_chunk_logits": "input"}`.
    * `trainer`: the trainer class that must train it (another one makes the run an error row: the `trl sft --loss`
      hook did not act).
    * `needs`: a package besides TRL, (its distribution as the environment line names it, as pip names it);
      without it the run is not started and reads `not run (needs ...)`, never ok.
    * `gpu_default`, `cpu_default`: in the default `--runs` of the GPU run and of the CPU dry run.
    * `goal`: what it is measured against (`Goal`), read into the summary's goals table; None: no goal.
    """

    name: str
    args: tuple[str, ...] = ()
    settings: Mapping[str, str | float] = field(default_factory=dict)
    trainer: str = "DistMatchSFTTrainer"
    needs: tuple[str, str] | None = None
    gpu_default: bool = False
    cpu_default: bool = False
    goal: Goal | None = None

    def argv(self) -> list[str]:
        """Its own `trl sft` arguments: `args`, then each setting as `--option value`."""
        options = flags(self.settings)
        return [*self.args, *options]


def flags(options: Mapping[str, Any]) -> list[str]:
    """Command-line options: `--name value` for each."""
    return [word for name, value in options.items() for word in (f"--{name}", str(value))]


def by_name(entries: Iterable[Run]) -> dict[str, Run]:
    """A table of runs keyed by name (a name given twice is a mistake in the table)."""
    table: dict[str, Run] = {}
    for entry in entries:
        if entry.name in table:
            raise ValueError(f"two runs named {entry.name!r}")
        table[entry.name] = entry
    return table


def chosen_steps(table: Sequence[Step]) -> list[str]:
    """The names `--steps` accepts, in the table's order."""
    return [step.name for step in table if step.when == "chosen"]


def plan(table: Sequence[Step], chosen: Iterable[str]) -> list[Step]:
    """The steps a command runs, in the table's order: the `always` ones, the chosen ones, and before the first
    chosen step that needs a preparation, that preparation (once)."""
    entries = {step.name: step for step in table}
    wanted = set(chosen)
    planned: list[Step] = []
    for step in table:
        if step.when == "always" or (step.when == "chosen" and step.name in wanted):
            planned += [entries[need] for need in step.needs if entries[need] not in planned]
            planned.append(step)
    return planned


def step_limits(args: argparse.Namespace, table: Sequence[Step]) -> dict[str, float]:
    """Seconds per process of each step: its GPU or CPU entry; a training run's from `--run-limit` when given."""
    limits = {step.name: step.cpu_s if args.tiny else step.gpu_s for step in table}
    if TRAIN in limits:
        limits[TRAIN] = args.run_limit or limits[TRAIN]
    return limits


def run_plan(ctx: Context, steps: Sequence[Step], limits: Mapping[str, float]) -> dict[str, Any]:
    """Run `steps` in order; their parts by name, each with its verdict (the preparations' results go to
    `ctx.prepared`)."""
    parts: dict[str, Any] = {}
    for step in steps:
        failed = [need for need in step.needs if ctx.prepared.get(need) is None]
        if failed:
            parts[step.name] = {"verdict": f"not started ({failed[0]} failed)"}
            continue
        part = step.run(ctx, limits[step.name])
        if step.when == "needed":
            ctx.prepared[step.name] = part
            continue
        if step.verdict is not None:
            part["verdict"] = step.verdict(part, ctx.args.device)
        parts[step.name] = part
    return parts
