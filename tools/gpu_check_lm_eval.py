"""The GPU check's `lm_eval` step (GPU goal 4): `lm_eval --model hf` with three distmatch tasks, an NLU task
(`distmatch_sst2`: 8 retrieved demonstrations, loglikelihood), the creative diversity task
(`distmatch_poem_diversity`: several samples a prompt, the three diversity metrics) and a code task through the
sandbox (`distmatch_humaneval`, `--confirm_run_unsafe_code`), on the checkpoint the `train` step wrote, from local
data (tools/gpu_check_worker.py `eval-assets`: the fixture splits and a tiny encoder built in code), batched; its
time per item.

lm-eval is not in the GPU image: `make gpu-kit` carries the `--no-deps` set these tasks import when it fits
(tools/gpu_kit_extras.py), else the step reads `not run` with what does not fit.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from gpu_check_axolotl import extras_line
from gpu_check_plan import Context, flags
from gpu_check_runner import REPO_ROOT

WORKER = str(Path(__file__).resolve().parent / "gpu_check_worker.py")
TASKS = ("distmatch_sst2", "distmatch_poem_diversity", "distmatch_humaneval")
#: The runs whose checkpoint is evaluated, first found first (a full model: the LoRA runs save an adapter).
CHECKPOINT_RUNS = ("gem_ls", "ce", "emo", "asft", "trl_liger", "trl")


def checkpoint(ctx: Context) -> Path | None:
    """The model the `train` step saved (its runs' output folders in the scratch folder), or None."""
    for run in CHECKPOINT_RUNS:
        folder = ctx.args.scratch / run
        if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
            return folder
    return None


def lm_eval_args(ctx: Context, model: Path, assets: dict[str, str], out: Path) -> list[str]:
    """`lm_eval run` with the three tasks: the hf model in the training precision, batched, a few items a task,
    the retriever and Sentence-BERT encoder built in code, short generations."""
    args = ctx.args
    gpu = args.device.startswith("cuda")
    limit, samples, tokens = (16, 4, 128) if gpu else (2, 3, 12)
    metadata = {
        "num_samples": samples,
        "code_samples": 2,
        "retriever_model": assets["encoder"],
        "sbert_model": assets["encoder"],
    }
    options = {
        "model": "hf",
        "model_args": f"pretrained={model},dtype={'bfloat16' if gpu else 'float32'},max_length=4096",
        "tasks": ",".join(TASKS),
        "include_path": REPO_ROOT / "eval_tasks",
        "device": args.device,
        "batch_size": 16 if gpu else 4,
        "limit": limit,
        "output_path": out,
        "metadata": json.dumps(metadata),
        "gen_kwargs": f"max_gen_toks={tokens}",
        "seed": 0,
    }
    return [sys.executable, "-m", "lm_eval", "run", *flags(options), "--confirm_run_unsafe_code"]


def read_results(out: Path, seconds: float) -> dict[str, Any]:
    """What lm-eval wrote (its `results_*.json`): each task's items and metrics, the items in all, and the seconds
    per item of the whole command (model load and the sandbox included) and of lm-eval's own evaluation."""
    found = sorted(out.glob("*/results_*.json"))
    if not found:
        return {}
    results = json.loads(found[-1].read_text())
    tasks = {}
    for task in TASKS:
        metrics = results.get("results", {}).get(task, {})
        items = (results.get("n-samples", {}).get(task) or {}).get("effective", 0)
        values = {k.split(",")[0]: v for k, v in metrics.items() if "," in k and "_stderr" not in k}
        tasks[task] = {"items": items, "metrics": values}
    items = sum(t["items"] for t in tasks.values())
    evaluation = float(results.get("total_evaluation_time_seconds") or 0.0)
    return {
        "tasks": tasks,
        "items": items,
        "seconds": seconds,
        "evaluation_seconds": evaluation,
        "s_per_item": seconds / items if items else None,
        "evaluation_s_per_item": evaluation / items if items else None,
    }


def run_lm_eval(ctx: Context, limit: float) -> dict[str, Any]:
    """The local data and encoder (once), then `lm_eval run` on the `train` step's checkpoint; not run without
    lm-eval or without a checkpoint."""
    if not ctx.environment.get("lm_eval"):
        return {"not_run": extras_line(ctx.kit, "lm_eval")}
    model = checkpoint(ctx)
    if model is None:
        return {"not_run": f"no checkpoint of {', '.join(CHECKPOINT_RUNS)} from the train step"}
    assets_dir = ctx.args.scratch / "eval-assets"
    shutil.rmtree(assets_dir, ignore_errors=True)
    rec = ctx.runner.run(
        "lm_eval_assets", [sys.executable, WORKER, "eval-assets", "--out", str(assets_dir)], limit
    )
    if rec["status"] != "ok":
        return {"status": rec["status"], "model": str(model)}
    assets = json.loads((assets_dir / "eval-assets.json").read_text())
    out = ctx.args.out / "lm_eval"
    shutil.rmtree(out, ignore_errors=True)
    env = {
        **ctx.runner.env,
        "DISTMATCH_EVAL_DATA_DIR": assets["data"],
        "DISTMATCH_LM_EVAL_HOOK": "0",  # the tasks come through --include_path
        "XDG_CACHE_HOME": str(ctx.args.scratch / "xdg"),
        "DISTMATCH_EVAL_CACHE": str(ctx.args.scratch / "retrieval"),
    }
    start = time.monotonic()
    rec = ctx.runner.run("lm_eval", lm_eval_args(ctx, model, assets, out), limit, env=env)
    found = read_results(out, time.monotonic() - start)
    return {"status": rec["status"], "model": str(model), **found}


def lm_eval_verdict(part: dict[str, Any]) -> str:
    """`ok` when lm-eval ended ok and scored every task on at least one item; `not run: ...`; else the process's
    status or `no results` / `missing: TASK`."""
    if "not_run" in part:
        return f"not run: {part['not_run']}"
    if part.get("status") != "ok":
        return part.get("status", "failed")
    if not part.get("tasks"):
        return "no results"
    missing = [task for task, t in part["tasks"].items() if not t["items"] or not t["metrics"]]
    return f"missing: {', '.join(missing)}" if missing else "ok"


def lm_eval_note(part: dict[str, Any]) -> str:
    if not part.get("tasks"):
        return part.get("not_run", "")
    per_item = part.get("s_per_item")
    return (
        f"{part['items']} items, {part['seconds']:.1f} s, {per_item:.2f} s an item "
        f"({part['evaluation_s_per_item']:.2f} s in lm-eval's evaluation), checkpoint {Path(part['model']).name}"
    )


def lm_eval_report(part: dict[str, Any]) -> list[str]:
    """Each task's items and metrics."""
    if not part.get("tasks"):
        return []

    def metrics(values: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v:.3g}" for k, v in values.items() if isinstance(v, float | int))

    rows = [f"| {task} | {t['items']} | {metrics(t['metrics'])} |" for task, t in part["tasks"].items()]
    return [
        "",
        "lm-eval (`lm_eval run --model hf`):",
        "",
        "| task | items | metrics |",
        "|---|---:|---|",
        *rows,
    ]
