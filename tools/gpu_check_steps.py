"""What each step of the GPU check runs (the `run` of its entry in tools/gpu_check_table.py): its commands, at the
GPU's shapes or, in the CPU dry run (`ctx.args.tiny`), at tiny ones, and what it reads back into its part."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from gpu_check_plan import BASELINE, Context, Run, flags
from gpu_check_runner import install, launcher, training_probe
from gpu_check_verdicts import goal_rows, junit_counts, junit_skips, read_benchmark_report, run_result
from gpu_check_worker import best_attention

TOOLS = Path(__file__).resolve().parent
WORKER = str(TOOLS / "gpu_check_worker.py")


def run_install(ctx: Context, limit: float) -> dict[str, Any]:
    """The kit's wheels into the install folder every step imports from (`install`); then the environment line, the
    packages the steps will import."""
    plan = install(ctx.kit, ctx.args.site, ctx.runner, limit, ctx.kit_skip)
    ctx.read_environment()
    return plan


def run_triton(ctx: Context, limit: float) -> dict[str, Any]:
    """The kernel tests (test_triton.py, test_kernel_contract.py) under pytest, counts and skip reasons from junit."""
    xml = ctx.args.out / "triton_tests.xml"
    xml.unlink(missing_ok=True)  # never a previous run's results
    pytest = [sys.executable, *"-m pytest -q -p no:cacheprovider -p no:xdist -o addopts=".split()]
    rec = ctx.runner.run(
        "triton",
        [*pytest, f"--junitxml={xml}", "tests/losses/test_triton.py", "tests/losses/test_kernel_contract.py"],
        limit,
    )
    return {"status": rec["status"], "counts": junit_counts(xml), "skips": junit_skips(xml)}


def benchmark(ctx: Context, name: str, cmd: list[str], limit: float, out: Path, key: str) -> dict[str, Any]:
    """Run a benchmark script that writes its report (`.json` with rows under `key`, and `.md`) into `out`; only a
    report written by this run counts."""
    start = time.time()
    rec = ctx.runner.run(name, cmd, limit)
    return {"status": rec["status"], **read_benchmark_report(out, key, start)}


def run_memory(ctx: Context, limit: float) -> dict[str, Any]:
    """benchmarks/bench_fused_memory.py: our fused rows under each memory setting, and Liger's."""
    out = ctx.args.out / "memory"
    if ctx.args.tiny:  # the settings the PyTorch closed forms run (16-bit chunks need the Triton kernel)
        shape = {"shape": "tiny", "dtype": "float32", "settings": "default,accum-weight", "repeats": 1}
    else:
        shape = {"shape": "llama3-8b-8k", "dtype": "bfloat16", "repeats": 3}
    script = [sys.executable, "benchmarks/bench_fused_memory.py"]
    cmd = [*script, *flags({"device": ctx.args.device, **shape, "out": out})]
    return benchmark(ctx, "memory", cmd, limit, out, "rows")


def run_bench(ctx: Context, limit: float) -> dict[str, Any]:
    """benchmarks/bench_losses.py: our fused rows against full logits, Liger and CCE."""
    out = ctx.args.out / "bench"
    if ctx.args.tiny:
        cases = {"shapes": "tiny", "losses": "ce", "anchors": "hf_ce", "repeats": 1, "threads": 1}
    else:  # Llama-3-8B's head, N 8192, bf16: full logits, Liger, CCE and our fused rows
        cases = {
            "shapes": "llama3-8b-8k",
            "losses": "ce,gem_ls,emo",
            "dtype": "bfloat16",
            "anchors": "hf_ce,liger_flce,cce",
            "repeats": 3,
            "case-timeout": 40,
        }
    cmd = [sys.executable, "benchmarks/bench_losses.py", *flags({"paths": "fused", **cases, "out": out})]
    return benchmark(ctx, "bench", cmd, limit, out, "results")


def run_build(ctx: Context, limit: float) -> dict[str, Any] | None:
    """The model and data of the training and parity steps, in the scratch folder (never under --out); None when the
    build failed."""
    shape, examples = ("tiny", 300) if ctx.args.tiny else ("llama32_1b", 6000)
    what = {"out": ctx.args.scratch, "shape": shape, "examples": examples, "device": ctx.args.device}
    cmd = [sys.executable, WORKER, "build", *flags(what)]
    if ctx.runner.run("build", cmd, limit)["status"] != "ok":
        return None
    return json.loads((ctx.args.scratch / "build.json").read_text())


def run_parity(ctx: Context, limit: float) -> dict[str, Any]:
    """One padding-free packed batch against its documents one by one (tools/gpu_check_worker.py `parity`)."""
    args, build = ctx.args, ctx.prepared["build"]
    inputs = {"model": build["model"], "data": build["data"], "out": args.scratch}
    precision = {"device": args.device, "dtype": "float32" if args.tiny else "bfloat16"}
    found = args.scratch / "parity.json"
    found.unlink(missing_ok=True)  # never a previous run's result
    rec = ctx.runner.run("parity", [sys.executable, WORKER, "parity", *flags({**inputs, **precision})], limit)
    return {"status": rec["status"], **(json.loads(found.read_text()) if found.is_file() else {})}


def train_args(run: Run, ctx: Context, out_dir: Path) -> list[str]:
    """A run's `trl sft` arguments: the common ones (the built model and data, the shapes, packing padding-free, the
    best attention, gradient checkpointing, the precision), then the run's own (`Run.argv`)."""
    args, build = ctx.args, ctx.prepared["build"]
    common = {
        "model_name_or_path": build["model"],
        "dataset_name": build["data"],
        "output_dir": out_dir,
        "max_steps": args.train_steps,
        "per_device_train_batch_size": args.batch_size,
        "max_length": args.seq_len,
        "packing": "true",
        "padding_free": "true",
        "gradient_checkpointing": "true",
        "attn_implementation": best_attention(args.device),
        "learning_rate": "1e-5",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 0,
        "disable_tqdm": "true",
        "dataloader_num_workers": 0,
    }
    if args.device.startswith("cuda"):
        precision = {"dtype": "bfloat16", "bf16": "true"}
    else:
        precision = {"dtype": "float32", "use_cpu": "true"}
    return [*flags(common), *flags(precision), *run.argv()]


def run_train(ctx: Context, limit: float) -> dict[str, Any]:
    """Each chosen run as a real `trl sft` in its own process (the probe installed by the kit folder's
    sitecustomize records its steps), then each measured run's ratios to the baseline run's, and each goal's
    (`goal_rows`). A run whose package is missing is not started."""
    args = ctx.args
    work = args.out / "train"  # the probes' records; the runs' output folders go to the scratch folder
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Any] = {}
    for name in args.runs:
        run = ctx.runs[name]
        if run.needs and not ctx.environment.get(run.needs[0]):  # not started: it could only fail
            runs[name] = {"not_run": f"needs {run.needs[1]}"}
            continue
        probe = work / f"{name}.probe.json"
        probe.unlink(missing_ok=True)
        measured = {training_probe.PROBE_ENV: str(probe), training_probe.LAUNCHED_ENV: repr(time.time())}
        env = {**ctx.runner.env, **measured, "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, str(launcher(args.site)), "sft", *train_args(run, ctx, args.scratch / name)]
        rec = ctx.runner.run(f"train_{name}", cmd, limit, env=env)
        runs[name] = run_result(run, rec["status"], probe, args.warmup_steps, args.train_steps)
    return {
        "model": ctx.prepared.get("build"),
        "runs": runs,
        "baseline": training_probe.add_ratios(runs, BASELINE),
        "goals": goal_rows(runs, ctx.runs),
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "steps": args.train_steps,
        "warmup_steps": args.warmup_steps,
    }
