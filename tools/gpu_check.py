#!/usr/bin/env python
"""The GPU check (`tools/gpu_check.sh`; docs/benchmarks.md "The GPU check"): one command on a lent GPU machine.

Steps, each a child process under `timeout`, all of their output under the output folder (`--out`, default `$OUT`):

* install: the kit's wheels (`make gpu-kit`: build/gpu-kit/wheels) offline into a target folder (`--site`) that goes
  first on PYTHONPATH, `--no-deps` (the image's torch is never touched); its `sitecustomize.py` processes the
  folder's `.pth` files (our `trl sft --loss` hook) and installs the training probe (tools/gpu_check_worker.py);
* a. `triton`: tests/losses/test_triton.py (junit XML);
* `memory`: benchmarks/bench_fused_memory.py at Llama-3-8B's head (N 8192, bf16): our fused rows under each memory
  setting (chunk logits, weight-gradient accumulator, chunk budget) and Liger's, extra memory, time and float64 error;
* b. `bench`: benchmarks/bench_losses.py at Llama-3-8B's head (N 8192, bf16) against full logits, TRL, Liger, CCE;
* c. `train`: real `trl sft` runs on a Llama-3-style model built in code (vocabulary 128,256), bf16, sequence 2,048,
  padding-free packing, the best attention available, gradient checkpointing: TRL's default loss with and without
  `--use_liger_kernel`, and `--loss ce / gem_ls / emo / asft`; tokens/s and peak memory, ratios to TRL's default;
* d. `parity`: a packed padding-free batch against its documents one by one (loss and every gradient);
* e. `summary.md` (and `summary.json`): how each step's process ended, each part's verdict (`ok` / `pass` only when
  all its work succeeded), then the training and benchmark tables (docs/benchmarks.md "The summary").

`--device cpu` is the dry run: tiny shapes, every step, in well under a minute per step (a test runs it).
Bad arguments are refused in one line (`error: ...`, exit 2) before any work. Exit status 1 when a step failed (a
process failed or timed out, a benchmark row holds an error, a test failed, a training run failed), else 0; what was
not fully run (tests skipped that should run here, runs whose package is missing, no kit) reads `partial` / `not
run`, never `ok` or `pass`, and is listed on stderr.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
TOOLS = REPO_ROOT / "tools"
sys.path.insert(0, str(TOOLS))
from gpu_check_worker import LAUNCHED_ENV, PROBE_ENV, best_attention, train_summary  # noqa: E402

DEFAULT_KIT = REPO_ROOT / "build" / "gpu-kit" / "wheels"
BASELINE = "trl"
# Training runs: name -> extra `trl sft` arguments.
TRAIN_RUNS: dict[str, tuple[str, ...]] = {
    "trl": (),
    "trl_liger": ("--use_liger_kernel", "true"),
    "ce": ("--loss", "ce"),
    "gem_ls": ("--loss", "gem_ls"),
    "emo": ("--loss", "emo"),
    "asft": ("--loss", "asft"),
    "gem_ls_lowmem": ("--loss", "gem_ls"),
    "emo_lowmem": ("--loss", "emo"),
    "gem_ls_tiles": ("--loss", "gem_ls"),
    "emo_tiles": ("--loss", "emo"),
}
# Runs with the fused path's memory settings (docs/losses.md "Chunk logits" and "Weight-gradient accumulator") besides their arguments.
LOW_MEMORY_ENV = {"DISTMATCH_CHUNK_LOGITS": "input", "DISTMATCH_GRAD_WEIGHT_ACCUM": "weight",
                  "DISTMATCH_CHUNK_MEMORY_MB": "64"}  # fmt: skip
# ... and with d weight by vocabulary tile in the backward (docs/losses.md "Liger's memory at our speed"), in 60 MiB:
# at Llama-3-8B's head below the 63 MiB Liger's fused linear CE takes beside the gradients.
TILES_ENV = {**LOW_MEMORY_ENV, "DISTMATCH_GRAD_WEIGHT_ACCUM": "tiles", "DISTMATCH_CHUNK_MEMORY_MB": "60"}
TRAIN_RUN_ENV: dict[str, dict[str, str]] = {"gem_ls_lowmem": LOW_MEMORY_ENV, "emo_lowmem": LOW_MEMORY_ENV,
                                            "gem_ls_tiles": TILES_ENV, "emo_tiles": TILES_ENV}  # fmt: skip
DEFAULT_RUNS = ("trl", "trl_liger", "ce", "gem_ls", "emo", "asft")
# The dry run's: TRL's trainer (the ratios' baseline) and ours through the `trl sft --loss` hook; the other losses
# take the same path at these shapes, Liger's kernels need a GPU, and so do the low-memory and tiles settings.
CPU_DEFAULT_RUNS = ("trl", "gem_ls")
# Runs that need a package besides TRL: run -> (distribution as the environment line names it, as pip names it).
# Without it the run is not started and reads "not run (needs ...)" (never ok).
RUN_NEEDS = {"trl_liger": ("liger_kernel", "liger-kernel")}
STEPS = ("triton", "memory", "parity", "train", "bench")  # in this order (the benchmark takes what is left)
# Seconds per step on the GPU (the whole run fits one 9-minute command; `--budget` caps the sum) and on the CPU.
# Measured on an H200 (2026-11-27, benchmarks/results/gpu-2026-11-27): triton 28 s (before the bf16-chunk variants), build 25-29 s (cold imports), parity
# 26 s, a `trl sft` run 48-55 s (36-42 s of it before the first step: two interpreters' imports, data, model), a
# benchmark case 10-30 s.
LIMITS = {
    "install": 40,
    "triton": 80,
    "memory": 150,
    "build": 45,
    "parity": 40,
    "train_run": 55,
    "bench": 150,
}
CPU_LIMITS = {
    "install": 60,
    "triton": 120,
    "memory": 90,
    "bench": 120,
    "build": 60,
    "train_run": 120,
    "parity": 90,
}
SITECUSTOMIZE = """\
# Written by tools/gpu_check.py: the kit folder's .pth files (the distmatch `trl sft` hook) and the training probe.
import os, site, sys
site.addsitedir(os.path.dirname(os.path.abspath(__file__)))
if os.environ.get({probe_env!r}):
    sys.path.insert(0, {tools!r})
    import gpu_check_worker
    gpu_check_worker.install_probe()
"""
TRL_LAUNCHER = "import sys\nfrom trl.cli import main\n\nif __name__ == '__main__':\n    sys.exit(main())\n"


class Runner:
    """Runs the steps' commands under `timeout` within one overall deadline; records each one."""

    def __init__(self, out: Path, env: dict[str, str], budget_s: float) -> None:
        self.out, self.env, self.deadline = out, env, time.monotonic() + budget_s
        self.records: list[dict[str, Any]] = []

    def run(
        self, name: str, cmd: list[str], limit_s: float, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        left = self.deadline - time.monotonic() - 2
        record: dict[str, Any] = {"step": name, "command": " ".join(cmd)}
        if left < 5:
            record.update(status="skipped", note="no time left in the budget", seconds=0.0)
            self.records.append(record)
            return record
        limit = int(min(limit_s, left))
        log_path = self.out / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with log_path.open("w") as log:
            proc = subprocess.Popen(["timeout", "-k", "5", str(limit), *cmd], stdout=log, stderr=subprocess.STDOUT,
                                    env=env or self.env, cwd=REPO_ROOT, start_new_session=True)  # fmt: skip
            rc = proc.wait()
        try:  # what the step left behind (an accelerate launch's child after a timeout), by its process group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        status = "ok" if rc == 0 else "timeout" if rc in (124, 137) else "failed"
        record.update(status=status, rc=rc, seconds=round(time.monotonic() - start, 1), limit_s=limit,
                      log=str(log_path.relative_to(self.out)))  # fmt: skip
        if status != "ok":
            record["tail"] = log_path.read_text(errors="replace")[-1500:]
        self.records.append(record)
        return record


def launcher(site_dir: Path) -> Path:
    """The `trl` console script as TRL's wheel installs it; beside the target folder, not in it (a script's folder
    comes first on sys.path, and the working tree's distmatch must win over the kit's wheel)."""
    return site_dir.parent / f"{site_dir.name}-bin" / "trl"


def wheels_not_for_this_python(wheels: list[Path]) -> list[str]:
    """The wheels whose tags this interpreter does not accept (what pip would refuse as `not a supported wheel on
    this platform`): `make gpu-kit` builds for the GPU image's Python 3.12 / x86-64."""
    try:
        from packaging.tags import sys_tags
        from packaging.utils import parse_wheel_filename
    except ImportError:
        try:
            from pip._vendor.packaging.tags import sys_tags
            from pip._vendor.packaging.utils import parse_wheel_filename
        except ImportError:  # no way to tell here: pip decides
            return []
    accepted = set(sys_tags())
    refused = []
    for wheel in wheels:
        try:
            tags = parse_wheel_filename(wheel.name)[3]
        except Exception:  # a name pip cannot read either: pip refuses it, in one line
            continue
        if not tags & accepted:
            refused.append(wheel.name)
    return refused


def pip_error(log: str) -> str:
    """pip's own reason, in one line: its first `ERROR:` line (else the last line it wrote)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("ERROR:")), lines[-1] if lines else "no output")


def install(
    kit: Path, site_dir: Path, runner: Runner, limit: float, skip: str | None = None
) -> dict[str, Any]:
    """The install plan: every kit wheel, --no-deps, into `site_dir`; the sitecustomize and the `trl` launcher.
    Only pip installs: wheels pip refuses are reported (one line) and never unpacked (a half-installed kit would
    shadow the environment's packages). `skip`: why nothing is installed (no kit, or a kit for another Python)."""
    site_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(kit.glob("*.whl")) if kit.is_dir() and not skip else []
    plan: dict[str, Any] = {"site": str(site_dir), "kit": str(kit), "wheels": [w.name for w in wheels]}
    if wheels:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--upgrade", "--target", str(site_dir), *map(str, wheels)]  # fmt: skip
        record = plan["record"] = runner.run("install", cmd, limit)
        if record["status"] == "failed":
            reason = pip_error(record.get("tail", ""))
            record["note"] = f"pip refused the kit ({reason.rstrip('.')}): nothing installed"
            print(f"gpu_check: install: pip refused the kit {kit} ({reason.rstrip('.')}): nothing was installed, the "
                  "steps use this environment's packages", file=sys.stderr, flush=True)  # fmt: skip
        status, note = record["status"], record.get("note")
        plan["verdict"] = "ok" if status == "ok" else f"{status}: {note}" if note else status
    else:
        plan["verdict"] = plan["skip"] = skip or f"no kit: no wheels in {kit}"
    (site_dir / "sitecustomize.py").write_text(SITECUSTOMIZE.format(probe_env=PROBE_ENV, tools=str(TOOLS)))
    launcher(site_dir).parent.mkdir(parents=True, exist_ok=True)
    launcher(site_dir).write_text(TRL_LAUNCHER)
    return plan


def junit_counts(path: Path) -> dict[str, int]:
    """pytest's counts from its junit XML: tests, failures, errors, skipped, and passed (the rest)."""
    if not path.is_file():
        return {}
    suite = ET.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def junit_skips(path: Path) -> dict[str, int]:
    """How many tests skipped for each reason (pytest's skip message), most first."""
    if not path.is_file():
        return {}
    reasons = Counter(skip.get("message") or (skip.text or "").strip() or "no reason given"
                      for case in ET.parse(path).getroot().iter("testcase") for skip in case.findall("skipped"))  # fmt: skip
    return dict(reasons.most_common())


# A skip whose reason says the test needs a GPU: expected on the CPU (that test does not run there).
GPU_ONLY_SKIP = re.compile(r"\b(needs?|requires?) (a )?(GPU|CUDA)\b", re.IGNORECASE)


def triton_verdict(status: str, counts: dict[str, int], skips: dict[str, int], device: str) -> str:
    """`pass` only when pytest ended ok, nothing failed or errored, a test passed and no test skipped that should run
    on this device: on a GPU every skip counts, on the CPU all but those whose reason says they need a GPU. Else
    `partial: P passed, S skipped`; `FAIL` when pytest failed, `timeout` when it was cut, `no results` without XML."""
    if status != "ok":
        return "FAIL" if status == "failed" else status
    if not counts:
        return "no results"
    if counts["failures"] or counts["errors"]:
        return "FAIL"
    gpu_only = (
        0 if device.startswith("cuda") else sum(n for why, n in skips.items() if GPU_ONLY_SKIP.search(why))
    )
    if counts["passed"] > 0 and counts["skipped"] == gpu_only:
        return "pass"
    return f"partial: {counts['passed']} passed, {counts['skipped']} skipped"


def train_args(run: str, build: dict[str, Any], args: argparse.Namespace, out_dir: Path) -> list[str]:
    cuda = args.device.startswith("cuda")
    common = [
        "--model_name_or_path", build["model"], "--dataset_name", build["data"], "--output_dir", str(out_dir),
        "--max_steps", str(args.train_steps), "--per_device_train_batch_size", str(args.batch_size),
        "--max_length", str(args.seq_len), "--packing", "true", "--padding_free", "true",
        "--gradient_checkpointing", "true", "--attn_implementation", best_attention(args.device),
        "--learning_rate", "1e-5", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
        "--seed", "0", "--disable_tqdm", "true", "--dataloader_num_workers", "0",
    ]  # fmt: skip
    common += (
        ["--dtype", "bfloat16", "--bf16", "true"] if cuda else ["--dtype", "float32", "--use_cpu", "true"]
    )
    return common + list(TRAIN_RUNS[run])


def step_build(args: argparse.Namespace, runner: Runner, limits: dict[str, float]) -> dict[str, Any] | None:
    """The model and data of the training and parity steps, in the scratch folder (never under --out)."""
    shape, examples = ("tiny", 300) if args.tiny else ("llama3", 6000)
    cmd = [sys.executable, str(TOOLS / "gpu_check_worker.py"), "build", "--out", str(args.scratch),
           "--shape", shape, "--examples", str(examples)]  # fmt: skip
    if runner.run("build", cmd, limits["build"])["status"] != "ok":
        return None
    return json.loads((args.scratch / "build.json").read_text())


def step_parity(
    args: argparse.Namespace, runner: Runner, limits: dict[str, float], build: dict[str, Any]
) -> dict:
    cmd = [sys.executable, str(TOOLS / "gpu_check_worker.py"), "parity", "--model", build["model"], "--data",
           build["data"], "--out", str(args.scratch), "--device", args.device,
           "--dtype", "float32" if args.tiny else "bfloat16"]  # fmt: skip
    found = args.scratch / "parity.json"
    found.unlink(missing_ok=True)  # never a previous run's result
    rec = runner.run("parity", cmd, limits["parity"])
    parity = json.loads(found.read_text()) if found.is_file() else {}
    if rec["status"] != "ok":
        parity["verdict"] = rec["status"]
    else:
        parity["verdict"] = "pass" if parity.get("ok") else "FAIL" if "ok" in parity else "not measured"
    return parity


def run_result(run: str, status: str, probe: Path, warmup: int, steps: int) -> dict[str, Any]:
    """One training run's row from its probe record. A run stopped by its time limit keeps the steps it measured
    (the probe writes after each step), marked partial; a failed run, one without steps to time, or one trained by
    the wrong trainer (the `trl sft --loss` hook did not act) is an error row."""
    if status not in ("ok", "timeout") or not probe.is_file():
        return {"error": status if status != "ok" else "no probe record"}
    try:
        result = train_summary(json.loads(probe.read_text()), warmup)
    except ValueError as err:
        return {"error": f"{status}: {err}"}
    wanted = "SFTTrainer" if run.startswith(BASELINE) else "DistMatchSFTTrainer"
    if result.get("trainer_class") != wanted:
        return {"error": f"trained by {result.get('trainer_class')}, not {wanted}"}
    if status != "ok" or not result["finished"]:
        result["partial"] = f"{status} after {result['steps_done']} of {steps} steps"
    return result


def train_verdict(runs: dict[str, dict[str, Any]]) -> str:
    """`errors` if any run failed (or none ran), else `partial` if any was cut by its limit, else `ok`."""
    if not runs or any("error" in r for r in runs.values()):
        return "errors"
    return "partial" if any(r.get("partial") for r in runs.values()) else "ok"


def train_part_verdict(runs: dict[str, dict[str, Any]]) -> str:
    """The train step's verdict: `train_verdict` over the runs that were started; runs not started (their package
    missing) make an `ok` step `partial` (never `ok`), and a step with no run started `not run`."""
    started = {run: r for run, r in runs.items() if "not_run" not in r}
    not_run = [f"{run} not run ({r['not_run']})" for run, r in runs.items() if "not_run" in r]
    if not not_run:
        return train_verdict(runs)
    if not started:
        return "not run: " + ", ".join(not_run)
    verdict = train_verdict(started)
    return verdict if verdict == "errors" else f"partial: {', '.join(not_run)}"


def add_ratios(runs: dict[str, dict[str, Any]]) -> str:
    """Each measured run's tokens/s and peak memory as ratios to the baseline run's (TRL's default loss:
    `speed_x_trl` = run / baseline tokens per second, `memory_x_trl` = run / baseline peak MiB). Returns the baseline's
    state: `ok`; `partial: ...` (the ratios are taken, each marked `ratio_note`); or why there are no ratios."""
    base = runs.get(BASELINE)
    if base is None:
        return f"no {BASELINE} run"
    if "tokens_per_s" not in base:
        return f"{BASELINE} {'not run' if 'not_run' in base else 'failed'}: {base.get('error') or base.get('not_run')}"
    for result in runs.values():
        if "tokens_per_s" in result:
            result["speed_x_trl"] = result["tokens_per_s"] / base["tokens_per_s"]
            result["memory_x_trl"] = result["peak_mib"] / base["peak_mib"]
            if base.get("partial"):
                result["ratio_note"] = f"against a partial {BASELINE} run ({base['partial']})"
    return f"partial: {base['partial']}" if base.get("partial") else "ok"


def step_limits(args: argparse.Namespace) -> dict[str, float]:
    """Seconds per step: the GPU or CPU table, a training run's from `--run-limit` when given."""
    limits = dict(CPU_LIMITS if args.tiny else LIMITS)
    limits["train_run"] = args.run_limit or limits["train_run"]
    return limits


def step_train(
    args: argparse.Namespace,
    runner: Runner,
    limits: dict[str, float],
    site: Path,
    build: dict[str, Any],
    environment: dict[str, Any],
) -> dict[str, Any]:
    work = args.out / "train"  # the probes' records; the runs' output folders go to the scratch folder
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Any] = {}
    for run in args.runs:
        module, package = RUN_NEEDS.get(run, (None, None))
        if module and not environment.get(module):  # not started: it could only fail
            runs[run] = {"not_run": f"needs {package}"}
            continue
        probe = work / f"{run}.probe.json"
        probe.unlink(missing_ok=True)
        env = {**runner.env, **TRAIN_RUN_ENV.get(run, {}), PROBE_ENV: str(probe), LAUNCHED_ENV: repr(time.time()),
               "PYTHONUNBUFFERED": "1"}  # fmt: skip
        cmd = [sys.executable, str(launcher(site)), "sft", *train_args(run, build, args, args.scratch / run)]
        rec = runner.run(f"train_{run}", cmd, limits["train_run"], env=env)
        runs[run] = run_result(run, rec["status"], probe, args.warmup_steps, args.train_steps)
    baseline = add_ratios(runs)
    return {"model": build, "runs": runs, "baseline": baseline, "seq_len": args.seq_len,
            "batch_size": args.batch_size, "steps": args.train_steps, "warmup_steps": args.warmup_steps}  # fmt: skip


def step_triton(args: argparse.Namespace, runner: Runner, limits: dict[str, float]) -> dict[str, Any]:
    xml = args.out / "triton_tests.xml"
    xml.unlink(missing_ok=True)  # never a previous run's results
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=",
           f"--junitxml={xml}", "tests/losses/test_triton.py"]  # fmt: skip
    rec = runner.run("triton", cmd, limits["triton"])
    counts, skips = junit_counts(xml), junit_skips(xml)
    return {
        "counts": counts,
        "skips": skips,
        "verdict": triton_verdict(rec["status"], counts, skips, args.device),
    }


def benchmark_verdict(status: str, rows: list[dict[str, Any]]) -> str:
    """`ok` only when the script ended ok and wrote rows, none of them an error; else the process's status, or
    `errors: E of R rows`, or `no rows`."""
    errors = sum("error" in row for row in rows)
    if status != "ok":
        return status
    if errors:
        return f"errors: {errors} of {len(rows)} rows"
    return "ok" if rows else "no rows"


def _benchmark_step(
    runner: Runner, name: str, cmd: list[str], limit: float, out: Path, key: str
) -> dict[str, Any]:
    """Run a benchmark script that writes its report (`.json` with rows under `key`, and `.md`) into `out`; only a
    report written by this run counts (`out` may hold an earlier run's)."""
    start = time.time()
    rec = runner.run(name, cmd, limit)
    reports = sorted(p for p in out.glob("*.json") if p.stat().st_mtime >= start - 1)
    rows = json.loads(reports[-1].read_text()).get(key, []) if reports else []
    return {"rows": len(rows), "errors": len([r for r in rows if "error" in r]),
            "report": reports[-1].with_suffix(".md").read_text() if reports else "",
            "verdict": benchmark_verdict(rec["status"], rows)}  # fmt: skip


def step_memory(args: argparse.Namespace, runner: Runner, limits: dict[str, float]) -> dict[str, Any]:
    out = args.out / "memory"
    if args.tiny:  # the settings the PyTorch closed forms run (16-bit chunks need the Triton kernel)
        flags = ["--shape", "tiny", "--dtype", "float32", "--settings", "default,accum-weight",
                 "--repeats", "1"]  # fmt: skip
    else:
        flags = ["--shape", "llama3-8b-8k", "--dtype", "bfloat16", "--repeats", "3"]
    cmd = [sys.executable, "benchmarks/bench_fused_memory.py", "--device", args.device, *flags,
           "--out", str(out)]  # fmt: skip
    return _benchmark_step(runner, "memory", cmd, limits["memory"], out, "rows")


def step_bench(args: argparse.Namespace, runner: Runner, limits: dict[str, float]) -> dict[str, Any]:
    out = args.out / "bench"
    if args.tiny:
        flags = [
            "--shapes",
            "tiny",
            "--losses",
            "ce",
            "--anchors",
            "hf_ce",
            "--repeats",
            "1",
            "--threads",
            "1",
        ]
    else:  # Llama-3-8B's head, N 8192, bf16: full logits, Liger, CCE and our fused rows
        flags = ["--shapes", "llama3-8b-8k", "--losses", "ce,gem_ls,emo", "--dtype", "bfloat16",
                 "--anchors", "hf_ce,liger_flce,cce", "--repeats", "3", "--case-timeout", "40"]  # fmt: skip
    cmd = [sys.executable, "benchmarks/bench_losses.py", "--paths", "fused", *flags, "--out", str(out)]
    return _benchmark_step(runner, "bench", cmd, limits["bench"], out, "results")


# ---------------------------------------------------------------------------------------------------------------
# Summary


def fmt(value: Any, digits: int = 2) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) >= 10**-digits or value == 0 else f"{value:.2e}"
    return "" if value is None else str(value)


BASELINE_NOTE = f"(ratio to the `{BASELINE}` run)"


def ratio(run: dict[str, Any], key: str) -> str:
    return fmt(run[key]) if key in run else "n/a"


def process_status(rec: dict[str, Any]) -> str:
    """What the step's process did: `exit 0` (not `ok`: whether its work succeeded is the part's verdict)."""
    if rec["status"] in ("ok", "failed"):
        return f"exit {rec.get('rc', '?')}"
    if rec["status"] == "timeout":
        return f"timeout ({rec.get('limit_s')} s)"
    return rec["status"]


def install_note(plan: dict[str, Any]) -> str:
    if plan.get("skip"):
        return "the steps use this environment's packages"
    return f"{len(plan.get('wheels', []))} wheels into {plan.get('site')}"


def triton_note(part: dict[str, Any]) -> str:
    c = part.get("counts") or {}
    if not c:
        return "no junit XML"
    text = (f"{c['passed']} passed, {c['failures']} failed, {c['errors']} errors, {c['skipped']} skipped, "
            f"of {c['tests']} tests")  # fmt: skip
    skips = part.get("skips") or {}
    return text + ("; skipped: " + "; ".join(f"{n} {why}" for why, n in skips.items()) if skips else "")


def train_note(part: dict[str, Any]) -> str:
    runs = part.get("runs", {})
    measured = len([r for r in runs.values() if "tokens_per_s" in r])
    text = f"{measured} of {len(runs)} runs measured"
    not_run = [f"{run} ({r['not_run']})" for run, r in runs.items() if "not_run" in r]
    return text + (f"; not run: {', '.join(not_run)}" if not_run else "")


def summary_markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [f"# GPU check {env['date']}", "",
             f"{env['device_name']}; torch {env['torch']}, Triton {env.get('triton')}, transformers "
             f"{env.get('transformers')}, TRL {env.get('trl')}, Liger-Kernel {env.get('liger_kernel')}, "
             f"CCE {env.get('cut_cross_entropy')}; Python {env['python']}; mode {result['mode']}", "",
             "| step | process | seconds | note |", "|---|---|---:|---|"]  # fmt: skip
    notes = {
        "install": install_note,
        "triton": triton_note,
        "bench": lambda r: f"{r.get('rows', 0)} rows, {r.get('errors', 0)} with an error",
        "memory": lambda r: f"{r.get('rows', 0)} rows, {r.get('errors', 0)} with an error",
        "train": train_note,
        "parity": lambda r: (f"loss rel. err. {fmt(r['loss_rel_err'])}, worst gradient rel. err. "
                             f"{fmt(r['grad_rel_err_max'])} (tolerance {r['tolerance']})") if "ok" in r else "",
    }  # fmt: skip
    for rec in result["records"]:
        lines.append(
            f"| {rec['step']} | {process_status(rec)} | {fmt(rec.get('seconds'), 1)} | {rec.get('note', '')} |"
        )
    lines += ["", "| part | verdict | details |", "|---|---|---|"]
    for step in ("install", *STEPS):
        part = result.get(step)
        if part is None:
            if step != "install":
                lines.append(f"| {step} | not run | |")
            continue
        verdict = part.get("verdict", "")
        lines.append(f"| {step} | {verdict} | {notes[step](part)} |")
    train = result.get("train") or {}
    if train.get("runs"):
        model = train.get("model") or {}
        lines += ["", f"Training: `trl sft`, {train.get('steps')} steps ({train.get('warmup_steps')} untimed), batch "
                  f"{train.get('batch_size')} x {train.get('seq_len')} tokens packed padding-free, model d "
                  f"{model.get('hidden_size')}, {model.get('num_hidden_layers')} layers, vocabulary "
                  f"{model.get('vocab_size')}, {model.get('params', 0) / 1e6:.0f} M parameters", "",
                  "| run | trainer | tokens/s | x TRL default | peak MiB | x TRL default | s/step | loss first -> last "
                  "| first step after s |", "|---|---|---:|---:|---:|---:|---:|---|---:|"]  # fmt: skip
        marked = False
        for run, r in train["runs"].items():
            if "not_run" in r:
                lines.append(f"| {run} | not run ({r['not_run']}) | | | | | | | |")
                continue
            if "error" in r:
                lines.append(f"| {run} | error: {r['error']} | | | | | | | |")
                continue
            mark = "*" if r.get("ratio_note") else ""
            marked = marked or bool(mark)
            trainer = r["trainer_class"] + (f" ({r['partial']})" if r.get("partial") else "")
            lines.append(f"| {run} | {trainer} | {r['tokens_per_s']:.0f} | {ratio(r, 'speed_x_trl')}{mark} | "
                         f"{r['peak_mib']:.0f} | {ratio(r, 'memory_x_trl')}{mark} | {fmt(r['s_per_step'], 3)} | "
                         f"{fmt(r['loss_first'], 3)} -> {fmt(r['loss_last'], 3)} | "
                         f"{fmt(r.get('first_step_after_s'), 1)} |")  # fmt: skip
        baseline = train.get("baseline", "ok")
        if marked:
            lines += [
                "",
                f"\\* x TRL default {BASELINE_NOTE}: against a partial run ({baseline.removeprefix('partial: ')})",
            ]
        elif baseline != "ok":
            lines += ["", f"x TRL default {BASELINE_NOTE}: none ({baseline})"]
    memory = result.get("memory") or {}
    if memory.get("report"):
        lines += ["", "Memory settings (benchmarks/bench_fused_memory.py):", "", memory["report"].strip()]
    bench = result.get("bench") or {}
    if bench.get("report"):
        lines += ["", "Loss benchmark (benchmarks/bench_losses.py):", "", bench["report"].strip()]
    return "\n".join(lines) + "\n"


def environment(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    # The dry run reads versions only (importing torch costs seconds); the GPU run asks torch for the card.
    probe = (
        "import json, importlib.metadata as m\n"
        f"torch = __import__('torch') if {not args.tiny} else None\n"
        "names = ['triton', 'transformers', 'trl', 'liger_kernel', 'cut_cross_entropy', 'datasets', 'distmatch']\n"
        "def v(n):\n    try:\n        return m.version(n)\n    except Exception:\n        return None\n"
        "cuda = torch is not None and torch.cuda.is_available()\n"
        "print(json.dumps({'torch': torch.__version__ if torch else v('torch'), 'cuda': torch.version.cuda if torch "
        "else None, 'device_name': torch.cuda.get_device_name() if cuda else 'cpu', **{n: v(n) for n in names}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"torch": None}
    found.setdefault("device_name", args.device)
    return {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "python": platform.python_version(), "executable": sys.executable, "host": platform.node(),
            **found}  # fmt: skip


class Refused(Exception):
    """A bad argument, found before any work: printed as one `error: ...` line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise Refused(message)


def _positive(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise Refused(f"{name} {value}: a positive number of seconds is accepted")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked: a bad one raises `Refused` (main prints it in one line)."""
    parser = OneLineParser(description=__doc__.split("\n")[0])
    default_out = os.environ.get("OUT") or str(REPO_ROOT / "benchmarks" / "out" / "gpu-check")
    parser.add_argument("--out", type=Path, default=Path(default_out), help="results folder (default $OUT)")
    parser.add_argument("--kit", type=Path, default=None, help="the wheels of `make gpu-kit` (default "
                        "build/gpu-kit/wheels; when that is missing the environment's packages are used)")  # fmt: skip
    parser.add_argument("--site", type=Path, default=Path("/tmp/distmatch-gpu-check-site"),
                        help="target folder of the kit's install (put first on PYTHONPATH)")  # fmt: skip
    parser.add_argument(
        "--device", default="cuda", help="cuda (the GPU run) or cpu (the dry run: tiny shapes)"
    )
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/distmatch-gpu-check"),
                        help="model, data and the runs' output folders (GiBs on the GPU; not under --out)")  # fmt: skip
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma list of {','.join(STEPS)}")
    parser.add_argument("--runs", default=None, help=f"training runs: {','.join(TRAIN_RUNS)} (default "
                        f"{','.join(DEFAULT_RUNS)}; on the CPU {','.join(CPU_DEFAULT_RUNS)})")  # fmt: skip
    parser.add_argument("--budget", type=float, default=515.0, help="seconds for all steps together")
    parser.add_argument("--train-steps", type=int, default=None)
    parser.add_argument("--run-limit", type=float, default=None, help="seconds per training run (default: the "
                        "step table's)")  # fmt: skip
    args = parser.parse_args(argv)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise Refused(
            f"--device {args.device!r}: cuda, cuda:N (the GPU run) or cpu (the dry run) is accepted"
        )
    args.tiny = not args.device.startswith("cuda")
    args.steps = [s for s in args.steps.split(",") if s]
    if args.runs is None:
        args.runs = ",".join(CPU_DEFAULT_RUNS if args.tiny else DEFAULT_RUNS)
    args.runs = [r for r in args.runs.split(",") if r]
    unknown = sorted(set(args.steps) - set(STEPS)) + sorted(set(args.runs) - set(TRAIN_RUNS))
    if unknown:
        raise Refused(f"unknown step or run: {', '.join(unknown)} (steps: {','.join(STEPS)}; runs: "
                      f"{','.join(TRAIN_RUNS)})")  # fmt: skip
    if not args.steps:
        raise Refused(f"--steps is empty: a comma list of {','.join(STEPS)} is accepted")
    if "train" in args.steps and not args.runs:
        raise Refused(f"--runs is empty: a comma list of {','.join(TRAIN_RUNS)} is accepted")
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
        raise Refused(f"--kit {kit}: {what}; run with the image's Python (PYTHON=...), for which `make gpu-kit` "
                      "built it")  # fmt: skip
    return kit, f"not installed: the kit is for another Python: {what}"


def prepare_site(site: Path) -> None:
    """An empty install folder: one this check made before is emptied (an earlier kit must not shadow this run's
    packages); a non-empty folder it did not make is refused."""
    if site.is_dir() and any(site.iterdir()):
        ours = site / "sitecustomize.py"
        if not (
            ours.is_file() and ours.read_text(errors="replace").startswith(SITECUSTOMIZE.splitlines()[0])
        ):
            raise Refused(f"--site {site}: not empty and not made by tools/gpu_check.py; an empty or new folder is "
                          "accepted")  # fmt: skip
        shutil.rmtree(site)
    writable_folder("--site", site)
    writable_folder("--site", launcher(site).parent)


def preflight(args: argparse.Namespace) -> tuple[Path, str | None]:
    """Everything checked before any work: torch importable, the kit, the folders writable; warns (stderr) when
    no kit is to be installed."""
    if importlib.util.find_spec("torch") is None:
        raise Refused(f"this Python ({sys.executable}) has no torch: set PYTHON to an interpreter with torch "
                      "(tools/gpu_check.sh uses the repository's .venv when PYTHON is unset, python3 without one)")  # fmt: skip
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


PASSING = ("ok", "pass")
NOT_FULLY_RUN = ("partial", "not run", "no kit", "not installed")


def outcome(result: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(what failed, what was not fully run): every step process not `ok` and every part whose verdict is neither a
    pass nor one of NOT_FULLY_RUN (a failure; a step named by both reads with its part's verdict), and the parts not
    fully run."""
    failed = {r["step"]: f"{r['step']} ({r['status']})" for r in result["records"] if r["status"] != "ok"}
    partial = []
    for step in ("install", *STEPS):
        verdict = (result.get(step) or {}).get("verdict")
        if verdict is None or verdict in PASSING:
            continue
        if not verdict.startswith(NOT_FULLY_RUN):
            failed[step] = f"{step} ({verdict})"
        elif step not in failed:
            partial.append(f"{step} ({verdict})")
    return list(failed.values()), partial


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        kit, skip = preflight(args)
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    limits = step_limits(args)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled", "DO_NOT_TRACK": "1",
           "HF_DATASETS_CACHE": str(args.scratch / "hf-datasets-cache")}  # fmt: skip
    # Bytecode is written (the kit is installed --no-compile): each run after the first reuses what the first compiled.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # The working tree first (its distmatch, not the kit wheel's, which may be older), then the kit's folder.
    paths = (str(REPO_ROOT), str(args.site), env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    runner = Runner(args.out, env, args.budget)
    result: dict[str, Any] = {"mode": f"{'dry run, tiny shapes' if args.tiny else 'full'} on {args.device}"}
    result["install"] = install(kit, args.site, runner, limits["install"], skip)
    result["environment"] = environment(args, env)
    if "triton" in args.steps:
        result["triton"] = step_triton(args, runner, limits)
    if "memory" in args.steps:
        result["memory"] = step_memory(args, runner, limits)
    build = step_build(args, runner, limits) if {"parity", "train"} & set(args.steps) else None
    if "parity" in args.steps:
        result["parity"] = step_parity(args, runner, limits, build) if build else {"verdict": "no model"}
    if "train" in args.steps:
        train = (
            step_train(args, runner, limits, args.site, build, result["environment"])
            if build
            else {"runs": {}}
        )
        train["verdict"] = train_part_verdict(train.get("runs", {}))
        result["train"] = train
    if "bench" in args.steps:  # last: it takes what is left of the budget
        result["bench"] = step_bench(args, runner, limits)
    result["records"] = runner.records
    (args.out / "summary.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (args.out / "summary.md").write_text(summary_markdown(result))
    sys.stdout.write(summary_markdown(result))
    failed, partial = outcome(result)
    if partial:
        print(f"gpu_check: not fully run: {'; '.join(partial)}", file=sys.stderr)
    if failed:
        print(f"gpu_check: failed: {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
