"""The GPU check's `axolotl` step (GPU goal 3): `axolotl train` with our plugin (`loss: gem_ls`) against
Axolotl's own cross-entropy with its Liger integration, `sample_packing: true`, bf16, on the model and data of the
`build` step; tokens/s and peak memory from the training probe (benchmarks/_training_probe.py: it measures every
transformers `Trainer`, Axolotl's too).

Axolotl is not in the GPU image: `make gpu-kit` computes the `--no-deps` set its `axolotl train` imports beyond the
image and the kit (tools/gpu_kit_extras.py) and carries it when it fits the carry limit; when it does not, the kit
says what does not fit, with sizes (`build/gpu-kit/kit.json`, `extras`), and this step reads `not run` with that
line. The dry run trains Axolotl's plain cross-entropy and our plugin on the tiny model in `.venv-axolotl` (Axolotl
and TRL 1.16 do not share a virtual environment here).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_check_plan import Context, Goal
from gpu_check_runner import REPO_ROOT, training_probe
from gpu_check_verdicts import goal_rows, run_result
from gpu_check_worker import best_attention

#: `axolotl train` as its console script runs it (the kit's wheels install no script into the install folder).
AXOLOTL_MAIN = "from axolotl.cli.main import main; main()"
#: The CPU dry run's Axolotl environment, when the check's interpreter has no Axolotl.
AXOLOTL_VENV = REPO_ROOT / ".venv-axolotl" / "bin" / "python"
PLUGIN = "axolotl_distmatch.DistMatchPlugin"
LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"
CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"


@dataclass(frozen=True)
class AxolotlRun:
    """One `axolotl train` run: its config's own keys (`config`, over `axolotl_config`'s common ones), the trainer
    class that must train it, a package it needs (as `gpu_check_plan.Run.needs`), its goal, and whether it is a
    default run on the GPU or the CPU."""

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    trainer: str = "AxolotlTrainer"
    needs: tuple[str, str] | None = None
    gpu_default: bool = False
    cpu_default: bool = False
    goal: Goal | None = None


LIGER = {
    "plugins": [LIGER_PLUGIN],
    "liger_rope": True,
    "liger_rms_norm": True,
    "liger_glu_activation": True,
    "liger_fused_linear_cross_entropy": True,
}
AXOLOTL_RUNS: dict[str, AxolotlRun] = {
    run.name: run
    for run in (
        # Axolotl's CE with its Liger integration (the kernels TRL's `--use_liger_kernel` applies): the bar.
        AxolotlRun("axolotl_liger", LIGER, needs=("liger_kernel", "liger-kernel"), gpu_default=True),
        # Axolotl's plain CE: the dry run's baseline (Liger's kernels need a GPU); on the GPU on request.
        AxolotlRun("axolotl_ce", cpu_default=True),
        AxolotlRun(
            "axolotl_gem_ls",
            {"plugins": [PLUGIN], "loss": "gem_ls"},
            trainer="DistMatchTrainer",
            gpu_default=True,
            cpu_default=True,
            goal=Goal("axolotl_liger"),
        ),
        AxolotlRun(
            "axolotl_cce",
            {"plugins": [CCE_PLUGIN], "cut_cross_entropy": True},
            needs=("cut_cross_entropy", "cut-cross-entropy"),
        ),
    )
}


def axolotl_config(ctx: Context, run: AxolotlRun, out_dir: Path) -> dict[str, Any]:
    """The run's Axolotl config: the built model and data (chat template), packing (`sample_packing`), the `train`
    step's shapes, steps and precision, gradient checkpointing, the best attention, then the run's own keys."""
    args, build = ctx.args, ctx.prepared["build"]
    gpu = args.device.startswith("cuda")
    attention = best_attention(args.device)
    dataset = {
        "path": str(Path(build["data"]) / "train.jsonl"),
        "ds_type": "json",
        "type": "chat_template",
        "chat_template": "tokenizer_default",
        "field_messages": "messages",
        "roles_to_train": ["assistant"],
    }
    config = {
        "base_model": build["model"],
        "tokenizer_type": "AutoTokenizer",
        "datasets": [dataset],
        "dataset_prepared_path": str(args.scratch / "axolotl-prepared"),
        "val_set_size": 0.0,
        "output_dir": str(out_dir),
        "sequence_len": args.seq_len,
        "sample_packing": True,
        "micro_batch_size": args.batch_size,
        "gradient_accumulation_steps": 1,
        "max_steps": args.train_steps,
        "learning_rate": 1.0e-5,
        "optimizer": "adamw_torch",
        "lr_scheduler": "constant",
        "bf16": gpu,
        "fp16": False,
        "tf32": False,
        "gradient_checkpointing": True,
        "save_strategy": "no",
        "logging_steps": 1,
        "dataloader_num_workers": 0,
        "dataset_num_proc": 1,
        "seed": 0,
        **(
            {"flash_attention": True}
            if attention == "flash_attention_2"
            else {"attn_implementation": attention}
        ),
    }
    return {**config, **run.config}


def axolotl_python(ctx: Context) -> tuple[str | None, str]:
    """The interpreter that runs `axolotl train` and why: the check's own when Axolotl is installed there (the
    environment line names its version), else on the CPU `.venv-axolotl`; None when there is none (the kit's
    `extras` line says why)."""
    if ctx.environment.get("axolotl"):
        return sys.executable, f"axolotl {ctx.environment['axolotl']}"
    if ctx.args.tiny and AXOLOTL_VENV.is_file():
        return str(AXOLOTL_VENV), "the dry run's .venv-axolotl"
    return None, extras_line(ctx.kit, "axolotl")


def extras_line(kit: Path, name: str) -> str:
    """What the kit (`make gpu-kit`'s kit.json beside the wheels) says of an optional set: carried, or what does
    not fit, with sizes."""
    manifest = kit.parent / "kit.json"
    extras = json.loads(manifest.read_text()).get("extras", {}) if manifest.is_file() else {}
    if name not in extras:
        return f"needs {name}: not in the image, and no kit line for it (`make gpu-kit`)"
    return f"needs {name}: {extras[name]['line']}"


def run_axolotl(ctx: Context, limit: float) -> dict[str, Any]:
    """Each default run (the GPU's or the dry run's) as `axolotl train CONFIG --launcher python` in its own process,
    measured by the probe; each goal's ratios (`goal_rows`)."""
    args = ctx.args
    python, why = axolotl_python(ctx)
    chosen = [run for run in AXOLOTL_RUNS.values() if (run.cpu_default if args.tiny else run.gpu_default)]
    work = args.out / "axolotl"
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Any] = {}
    versions = ctx.environment if python == sys.executable else {}
    for run in chosen:
        if python is None:
            runs[run.name] = {"not_run": why}
            continue
        if run.needs and python == sys.executable and not versions.get(run.needs[0]):
            runs[run.name] = {"not_run": f"needs {run.needs[1]}"}
            continue
        out_dir = args.scratch / run.name
        shutil.rmtree(out_dir, ignore_errors=True)
        config = work / f"{run.name}.yml"
        config.write_text(json.dumps(axolotl_config(ctx, run, out_dir), indent=1))  # YAML reads JSON
        probe = work / f"{run.name}.probe.json"
        probe.unlink(missing_ok=True)
        measured = {training_probe.PROBE_ENV: str(probe), training_probe.LAUNCHED_ENV: repr(time.time())}
        env = {**ctx.runner.env, **measured, "PYTHONUNBUFFERED": "1", "AXOLOTL_DO_NOT_TRACK": "1"}
        cmd = [python, "-c", AXOLOTL_MAIN, "train", str(config), "--launcher", "python"]
        rec = ctx.runner.run(run.name, cmd, limit, env=env)
        result = run_result(run, rec["status"], probe, args.warmup_steps, args.train_steps)  # type: ignore[arg-type]
        runs[run.name] = result
    baseline = next(iter(runs), "")
    return {
        "python": python,
        "why": why,
        "runs": runs,
        "baseline": training_probe.add_ratios(runs, baseline),
        "goals": goal_rows(runs, AXOLOTL_RUNS),  # type: ignore[arg-type]
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "steps": args.train_steps,
    }


def axolotl_note(part: dict[str, Any]) -> str:
    runs = part.get("runs", {})
    measured = len([r for r in runs.values() if "tokens_per_s" in r])
    return f"{measured} of {len(runs)} runs measured, with {part.get('why', '')}"


def axolotl_report(part: dict[str, Any]) -> list[str]:
    """The Axolotl table: each run's tokens/s, peak MiB, both over the first run's (Axolotl with Liger on the GPU),
    and the goals table."""
    from gpu_check_summary import fmt, goals_report, ratio

    runs = part.get("runs") or {}
    if not runs:
        return []
    first = next(iter(runs))
    lines = [
        "",
        f"Axolotl: `axolotl train`, sample packing, {part.get('steps')} steps, micro-batch {part.get('batch_size')} "
        f"x {part.get('seq_len')} tokens; ratios to `{first}`",
        "",
        f"| run | trainer | tokens/s | x {first} | peak MiB | x {first} | s/step | loss first -> last |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in runs.items():
        if "tokens_per_s" not in r:
            lines.append(
                f"| {name} | {r.get('error') or 'not run (' + r.get('not_run', '') + ')'} | | | | | | |"
            )
            continue
        lines.append(
            f"| {name} | {r['trainer_class']} | {r['tokens_per_s']:.0f} | {ratio(r, 'speed_ratio')} | "
            f"{r['peak_mib']:.0f} | {ratio(r, 'memory_ratio')} | {fmt(r['s_per_step'], 3)} | "
            f"{fmt(r['loss_first'], 3)} -> {fmt(r['loss_last'], 3)} |"
        )
    return lines + goals_report(
        part.get("goals") or [], "Goals (GPU goal 3: Axolotl; ratios within this command):"
    )
