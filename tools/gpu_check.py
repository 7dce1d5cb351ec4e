#!/usr/bin/env python
"""The GPU check (`tools/gpu_check.sh`; docs/benchmarks.md "The GPU check"): one command on a lent GPU machine.

Steps, each a child process under `timeout`, all of their output under the output folder (`--out`, default `$OUT`);
each step and each training run is one entry of tools/gpu_check_table.py:

* install: the kit's wheels (`make gpu-kit`: build/gpu-kit/wheels) offline into a target folder (`--site`) that goes
  first on PYTHONPATH, `--no-deps` (the image's torch is never touched); its `sitecustomize.py` processes the
  folder's `.pth` files (our `trl sft --loss` hook) and installs the training probe (benchmarks/_training_probe.py);
* `memory`: benchmarks/bench_fused_memory.py at Llama-3-8B's head (N 8192, bf16): our fused rows under each memory
  setting (chunk logits, weight-gradient accumulator, chunk budget) and Liger's, extra memory, time and float64 error;
* `train`: real `trl sft` runs on a model with Llama-3.2-1B's shapes built in code (d 2048, 16 layers, 32/8 heads,
  vocabulary 128,256), bf16, sequence 2,048, padding-free packing, the best attention available, gradient
  checkpointing: TRL with `--use_liger_kernel`, `--loss ce / gem_ls / emo / asft`, and LoRA (r 16) runs of TRL+Liger,
  `ce` and `gem_ls`; tokens/s and peak memory, ratios to TRL's default and each goal's (GPU goal 2: against
  TRL+Liger);
* `axolotl`: `axolotl train` with our plugin (`loss: gem_ls`) against Axolotl's CE with its Liger integration,
  sample packing, bf16, the same model (tools/gpu_check_axolotl.py); `not run` where Axolotl is not installed;
* `lm_eval`: `lm_eval run --model hf` with an NLU, the creative diversity and a code task on the `train` step's
  checkpoint, from local data, batched; its time per item (tools/gpu_check_lm_eval.py);
* `triton`: tests/losses/test_triton.py and test_kernel_contract.py (junit XML);
* `parity`: a packed padding-free batch against its documents one by one (loss and every gradient);
* `bench`: benchmarks/bench_losses.py at Llama-3-8B's head (N 8192, bf16) against full logits, Liger, CCE;
* `summary.md` (and `summary.json`): how each step's process ended, each part's verdict (`ok` / `pass` only when
  all its work succeeded), then the training and benchmark tables (docs/benchmarks.md "The summary").

Modules: tools/gpu_check_table.py (the entries), gpu_check_plan.py (what an entry is; choosing, timing and running
a command's steps), gpu_check_steps.py (what each step runs), gpu_check_verdicts.py (reading what they left),
gpu_check_summary.py (summary.md, the outcome), gpu_check_runner.py (processes, the install), gpu_check_worker.py
(the child side: model, data, parity, the lm_eval step's data), gpu_check_axolotl.py and gpu_check_lm_eval.py (those
steps); the training measurement is benchmarks/_training_probe.py.

`--device cpu` is the dry run: tiny shapes, every step, in well under a minute per step (a test runs it).
Bad arguments are refused in one line (`error: ...`, exit 2) before any work. Exit status 1 when a step failed (a
process failed or timed out, a benchmark row holds an error, a test failed, a training run failed), else 0; what was
not fully run (tests skipped that should run here, runs whose package is missing, no kit) reads `partial` / `not
run`, never `ok` or `pass`, and is listed on stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS = REPO_ROOT / "tools"
# The check's modules lie beside this file (also when it is loaded under another name, as the tests do).
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))
from gpu_check_plan import Context, Run, Step, chosen_steps, plan, run_plan, step_limits  # noqa: E402
from gpu_check_runner import SITECUSTOMIZE, Runner, launcher, wheels_not_for_this_python  # noqa: E402
from gpu_check_summary import outcome, summary_markdown  # noqa: E402
from gpu_check_table import RUNS, STEPS  # noqa: E402

DEFAULT_KIT = REPO_ROOT / "build" / "gpu-kit" / "wheels"


class Refused(Exception):
    """A bad argument, found before any work: printed as one `error: ...` line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise Refused(message)


def _positive(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise Refused(f"{name} {value}: a positive number of seconds is accepted")


def parse_args(
    argv: list[str] | None = None, steps: Sequence[Step] = STEPS, runs: Mapping[str, Run] = RUNS
) -> argparse.Namespace:
    """The arguments, checked against the tables `steps` and `runs`: a bad one raises `Refused` (main prints it in
    one line)."""
    names, run_names = chosen_steps(steps), ",".join(runs)
    gpu_default = ",".join(run.name for run in runs.values() if run.gpu_default)
    cpu_default = ",".join(run.name for run in runs.values() if run.cpu_default)
    parser = OneLineParser(description=(__doc__ or "").split("\n")[0])
    default_out = os.environ.get("OUT") or str(REPO_ROOT / "benchmarks" / "out" / "gpu-check")
    parser.add_argument("--out", type=Path, default=Path(default_out), help="results folder (default $OUT)")
    parser.add_argument(
        "--kit",
        type=Path,
        default=None,
        help="the wheels of `make gpu-kit` (default build/gpu-kit/wheels; when that is missing the environment's "
        "packages are used)",
    )
    parser.add_argument(
        "--site",
        type=Path,
        default=Path("/tmp/distmatch-gpu-check-site"),
        help="target folder of the kit's install (put first on PYTHONPATH)",
    )
    parser.add_argument(
        "--device", default="cuda", help="cuda (the GPU run) or cpu (the dry run: tiny shapes)"
    )
    parser.add_argument(
        "--scratch",
        type=Path,
        default=Path("/tmp/distmatch-gpu-check"),
        help="model, data and the runs' output folders (GiBs on the GPU; not under --out)",
    )
    parser.add_argument("--steps", default=",".join(names), help=f"comma list of {','.join(names)}")
    parser.add_argument(
        "--runs",
        default=None,
        help=f"training runs: {run_names} (default {gpu_default}; on the CPU {cpu_default})",
    )
    parser.add_argument("--budget", type=float, default=515.0, help="seconds for all steps together")
    parser.add_argument("--train-steps", type=int, default=None)
    parser.add_argument(
        "--run-limit", type=float, default=None, help="seconds per training run (default: the step table's)"
    )
    args = parser.parse_args(argv)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise Refused(
            f"--device {args.device!r}: cuda, cuda:N (the GPU run) or cpu (the dry run) is accepted"
        )
    args.tiny = not args.device.startswith("cuda")
    args.steps = [s for s in args.steps.split(",") if s]
    if args.runs is None:
        args.runs = cpu_default if args.tiny else gpu_default
    args.runs = [r for r in args.runs.split(",") if r]
    unknown = sorted(set(args.steps) - set(names)) + sorted(set(args.runs) - set(runs))
    if unknown:
        raise Refused(
            f"unknown step or run: {', '.join(unknown)} (steps: {','.join(names)}; runs: {run_names})"
        )
    if not args.steps:
        raise Refused(f"--steps is empty: a comma list of {','.join(names)} is accepted")
    if "train" in args.steps and not args.runs:
        raise Refused(f"--runs is empty: a comma list of {run_names} is accepted")
    _positive("--budget", args.budget)
    _positive("--run-limit", args.run_limit)
    if args.train_steps is not None and args.train_steps < 2:
        raise Refused(
            f"--train-steps {args.train_steps}: at least 2 is accepted (a run's first step is untimed)"
        )
    args.train_steps = args.train_steps or (3 if args.tiny else 20)
    args.warmup_steps = 1 if args.tiny else 3
    args.seq_len = 128 if args.tiny else 2048
    args.batch_size = 1 if args.tiny else 4
    return args


def writable_folder(name: str, path: Path) -> None:
    """`path` is (or is made) a folder this process can write in; refused otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".gpu_check_write_test.{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise Refused(f"{name} {path}: not a folder this user can write ({err.strerror or err})") from None


def resolve_kit(args: argparse.Namespace) -> tuple[Path, str | None]:
    """The kit folder and, when nothing is to be installed from it, why. A `--kit` given but missing or without
    wheels is refused; the default kit missing means the environment's packages (a warning on stderr and in the
    summary). A kit for another Python (`make gpu-kit` builds for the image's 3.12) is refused on the GPU, and on
    the CPU dry run left uninstalled (warned): pip would refuse it, and nothing of it may be unpacked."""
    kit = args.kit or DEFAULT_KIT
    wheels = sorted(kit.glob("*.whl")) if kit.is_dir() else []
    if args.kit is not None and not wheels:
        why = (
            "no such folder" if not kit.exists() else "not a folder" if not kit.is_dir() else "no *.whl in it"
        )
        raise Refused(
            f"--kit {kit}: {why}; the folder of `make gpu-kit`'s wheels (build/gpu-kit/wheels) is accepted"
        )
    if not wheels:
        return kit, f"no kit: {kit} is missing (`make gpu-kit`)"
    foreign = wheels_not_for_this_python(wheels)
    if not foreign:
        return kit, None
    here = f"Python {platform.python_version()} ({sys.executable})"
    what = f"{len(foreign)} of its {len(wheels)} wheels ({foreign[0]}, ...) are not for {here}"
    if not args.tiny:
        fix = "run with the image's Python (PYTHON=...), for which `make gpu-kit` built it"
        raise Refused(f"--kit {kit}: {what}; {fix}")
    return kit, f"not installed: the kit is for another Python: {what}"


def prepare_site(site: Path) -> None:
    """An empty install folder: one this check made before is emptied (an earlier kit must not shadow this run's
    packages); a non-empty folder it did not make is refused."""
    if site.is_dir() and any(site.iterdir()):
        ours = site / "sitecustomize.py"
        if not (
            ours.is_file() and ours.read_text(errors="replace").startswith(SITECUSTOMIZE.splitlines()[0])
        ):
            why = "not empty and not made by tools/gpu_check.py; an empty or new folder is accepted"
            raise Refused(f"--site {site}: {why}")
        shutil.rmtree(site)
    writable_folder("--site", site)
    writable_folder("--site", launcher(site).parent)


def preflight(args: argparse.Namespace) -> tuple[Path, str | None]:
    """Everything checked before any work: torch importable, the kit, the folders writable; warns (stderr) when
    no kit is to be installed."""
    if importlib.util.find_spec("torch") is None:
        which = "tools/gpu_check.sh uses the repository's .venv when PYTHON is unset, python3 without one"
        raise Refused(
            f"this Python ({sys.executable}) has no torch: set PYTHON to an interpreter with torch ({which})"
        )
    kit = resolve_kit(args)
    writable_folder("--out", args.out)
    writable_folder("--scratch", args.scratch)
    prepare_site(args.site)
    if kit[1]:
        print(
            f"gpu_check: warning: {kit[1]}; the steps use this environment's packages",
            file=sys.stderr,
            flush=True,
        )
    return kit


def main(argv: list[str] | None = None, steps: Sequence[Step] = STEPS, runs: Mapping[str, Run] = RUNS) -> int:
    """The check over the tables `steps` and `runs` (tools/gpu_check_table.py; a test passes its own): exit status
    0, 1 when something failed, 2 for a bad argument."""
    try:
        args = parse_args(argv, steps, runs)
        kit, skip = preflight(args)
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    limits = step_limits(args, steps)
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    quiet = {"TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled", "DO_NOT_TRACK": "1"}
    cache = {"HF_DATASETS_CACHE": str(args.scratch / "hf-datasets-cache")}
    env = {**os.environ, **offline, **quiet, **cache}
    # Bytecode is written (the kit is installed --no-compile): each run after the first reuses what the first compiled.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # The working tree first (its distmatch, not the kit wheel's, which may be older), then the kit's folder.
    paths = (str(REPO_ROOT), str(args.site), env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    ctx = Context(args, Runner(args.out, env, args.budget), runs, kit, skip)
    result: dict[str, Any] = {"mode": f"{'dry run, tiny shapes' if args.tiny else 'full'} on {args.device}"}
    parts = run_plan(ctx, plan(steps, args.steps), limits)
    # The install step reads the environment line; a table without one reads it now.
    environment = ctx.environment or ctx.read_environment()
    result.update(install=parts.pop("install", None), environment=environment, **parts)
    result["records"] = ctx.runner.records
    text = summary_markdown(result, steps)
    (args.out / "summary.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (args.out / "summary.md").write_text(text)
    sys.stdout.write(text)
    failed, partial = outcome(result, steps)
    if partial:
        print(f"gpu_check: not fully run: {'; '.join(partial)}", file=sys.stderr)
    if failed:
        print(f"gpu_check: failed: {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
