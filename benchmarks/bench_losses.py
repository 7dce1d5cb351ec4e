#!/usr/bin/env python
"""Benchmark of the distmatch token losses: peak memory above the inputs and wall time of forward + backward.

A measurement script, never a pass/fail test. It prints a markdown table (shape x loss x path) plus ratios to the
full-logits cross-entropy that transformers computes by default ("hf_ce"), measured in the same run, next to two
more anchors: PyTorch's chunked ``F.linear_cross_entropy(..., options=LinearCrossEntropyOptions())`` and TRL's fused
LM-head NLL (``trl.kernels.ChunkedLogProbFunction``, called the way ``SFTTrainer``'s fused LM head calls it).

Every case runs in its own fresh interpreter (this file re-executed with ``--_worker``), so that one case's
allocator state or peak can not leak into the next:

1. build the inputs (hidden [N, d] and weight [V, d] fp32 with requires_grad, labels [N] with ~10% -100, and
   for EMO a frozen copy of the weight as cost embedding);
2. warm up on a tiny problem with the same code path (thread pool, lazy imports, kernels), ``gc.collect()``,
   ``malloc_trim``, touch the inputs;
3. baseline: CPU, reset the peak-RSS high-water mark (``/proc/self/clear_refs`` = 5, which also resets
   ``ru_maxrss``) and read the current RSS from ``/proc/self/statm``; CUDA, ``memory_allocated()`` after
   ``reset_peak_memory_stats()``;
4. one forward + backward (``loss = sum(per-token) / n_valid; loss.backward()``); peak = ``ru_maxrss`` (KiB) on
   CPU, ``max_memory_allocated()`` on CUDA; extra = peak - baseline. The gradients of hidden and weight are
   part of the extra memory (they are outputs of the backward; the same for every row);
5. that run doubles as the warm-up of the timing: then ``--repeats`` timed forward + backward runs, median.

Usage (from the repository root)::

    python benchmarks/bench_losses.py --quick          # smollm2, fused rows + CE reference + anchors (make demo)
    python benchmarks/bench_losses.py --shapes smollm2 --out
    python benchmarks/bench_losses.py --shapes llama3-8b --losses ce,gem_linear --paths fused --repeats 1

See docs/benchmarks.md for what the columns mean and the targets.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from _harness import fmt, library_versions, run_worker_process, write_outputs
from _harness import malloc_trim as _malloc_trim
from _harness import maxrss_kib as _maxrss_kib
from _harness import reset_peak_rss as _reset_peak_rss
from _harness import rss_kib as _rss_kib

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "out"

SHAPES = {
    # name: hidden width d, vocabulary V, tokens N
    "smollm2": {"d": 576, "V": 49152, "N": 4096},  # SmolLM2-135M head
    "llama3-8b": {"d": 4096, "V": 128256, "N": 2048},  # Llama-3-8B head
    "llama3-8b-8k": {"d": 4096, "V": 128256, "N": 8192},  # the GPU comparison's shape (bf16)
    "tiny": {"d": 64, "V": 2048, "N": 512},  # smoke test of the harness only; not in the default shapes
}
DEFAULT_SHAPES = ["smollm2", "llama3-8b"]
TINY_SHAPE = {"d": 16, "V": 256, "N": 64}  # for the in-process warm-up before the baseline

LOSSES = ("ce", "gem_linear", "gem_ls", "emo", "dft", "eaft")
PATHS = ("reference", "chunked", "fused")
ANCHORS = ("hf_ce", "torch_lce", "trl_nll", "liger_flce", "cce")
CPU_ANCHORS = ("hf_ce", "torch_lce", "trl_nll")  # Liger's and CCE's kernels are CUDA-only
ANCHOR_LABELS = {
    "hf_ce": "transformers ForCausalLMLoss on full logits (the CE anchor)",
    "torch_lce": "torch F.linear_cross_entropy, options=LinearCrossEntropyOptions()",
    "trl_nll": "TRL fused LM head NLL (ChunkedLogProbFunction as SFTTrainer calls it)",
    "liger_flce": "Liger fused linear cross-entropy (liger-kernel wheel)",
    "cce": "Cut Cross Entropy linear_cross_entropy (cut-cross-entropy wheel)",
}
FUSED_CE = ("trl_nll", "liger_flce", "cce")  # with our fused ce: "the fastest fused CE" of GPU_TARGETS
IGNORED_FRACTION = 0.1

# CPU targets, as ratios to hf_ce of the same run: (max memory ratio, max time ratio).
TARGETS = {
    ("gem_linear", "fused"): (0.15, 1.4),
    ("gem_ls", "fused"): (0.15, 1.4),
    ("emo", "fused"): (0.25, 2.0),
}
# GPU targets: ratios to the fastest fused CE for time, to our own fused ce for memory.
GPU_TARGETS = {"gem_linear": (1.2, 1.15), "gem_ls": (1.2, 1.15), "emo": (1.2, 1.6)}
# What the anchors were expected to do at the smollm2 shape on the CPU machine (for comparison, not targets).
ANCHOR_CLAIMS = {
    "torch_lce": "about 0.14x memory, 1.8x time",
    "trl_nll": "about 4.6 GB, 2.6x time",
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------------
# Worker: one case in a fresh interpreter
# --------------------------------------------------------------------------------------------------------------


def _needs_cost_embedding(loss: str) -> bool:
    sys.path.insert(0, str(REPO_ROOT))
    from trl_ext.losses import LOSSES as SPECS

    return loss in SPECS and SPECS[loss].needs_cost_embedding


def _make_inputs(shape: dict, loss: str, device: str, seed: int = 0, dtype: str = "float32") -> dict:
    """Inputs built in place, without temporaries the size of the weight (they would raise the RSS peak)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    n, d, v = shape["N"], shape["d"], shape["V"]
    hidden = torch.randn(n, d, generator=gen).to(device=device, dtype=getattr(torch, dtype))
    # logits = hidden @ weight.T with unit variance per entry
    weight = torch.randn(v, d, generator=gen).mul_(d**-0.5).to(device=device, dtype=getattr(torch, dtype))
    labels = torch.randint(0, v, (n,), generator=gen)
    labels[torch.rand(n, generator=gen) < IGNORED_FRACTION] = -100
    labels = labels.to(device)
    inputs = {
        "hidden": hidden.requires_grad_(),
        "weight": weight.requires_grad_(),
        "labels": labels,
        "n_valid": int((labels != -100).sum()),
    }
    if _needs_cost_embedding(loss):
        inputs["cost_embedding"] = weight.detach().clone()  # frozen copy of the head
    return inputs


def _loss_fn(case: dict):
    """A function inputs -> scalar loss (sum over tokens / n_valid) for this case."""
    import torch
    import torch.nn.functional as F

    path, loss, chunk_size = case["path"], case["loss"], case.get("chunk_size")

    if path == "hf_ce":
        from transformers.loss.loss_utils import ForCausalLMLoss

        def fn(x: dict):
            logits = F.linear(x["hidden"], x["weight"])
            # Exactly what a transformers causal LM computes by default under Trainer: ForCausalLMLoss with the
            # batch's num_items_in_batch (a tensor) -> fixed_cross_entropy(reduction="sum") / num_items. The labels
            # are already aligned, so they go in as shift_labels (same computation as the internal shift).
            num_items = torch.tensor(x["n_valid"], device=logits.device)
            return ForCausalLMLoss(
                logits,
                x["labels"],
                vocab_size=logits.shape[-1],
                num_items_in_batch=num_items,
                shift_labels=x["labels"],
            )

        return fn

    if path == "torch_lce":

        def fn(x: dict):
            # Defaults of the options object; ignore_index defaults to -100 for class-index targets.
            out = F.linear_cross_entropy(
                x["hidden"],
                x["weight"],
                x["labels"],
                reduction="sum",
                options=torch.nn.LinearCrossEntropyOptions(),
            )
            return out / x["n_valid"]

        return fn

    if path == "liger_flce":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss(reduction="sum")

        def fn(x: dict):
            out = liger(x["weight"], x["hidden"], x["labels"])  # (lin_weight, input, target)
            return (out[0] if isinstance(out, tuple) else out) / x["n_valid"]

        return fn

    if path == "cce":
        from cut_cross_entropy import linear_cross_entropy

        return lambda x: (
            linear_cross_entropy(x["hidden"], x["weight"], x["labels"], reduction="sum") / x["n_valid"]
        )

    if path == "trl_nll":
        from trl.kernels import ChunkedLogProbFunction
        from trl.kernels.chunked_logprob import _use_triton
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE, maybe_gather_lm_head_ctx

        def fn(x: dict):
            # Mirrors trl.trainer.utils.add_fused_lm_head's `_fused_forward` with SFTTrainer's settings:
            # outputs=("log_probs", "entropy", "is_top1"), temperature 1, no softcap, logit_scale 1, the default
            # 32768-wide vocabulary chunks; valid rows only on Triton devices, every row (labels clamped) otherwise.
            hidden, weight, labels = x["hidden"], x["weight"], x["labels"]
            mask = labels != -100
            compact = _use_triton(hidden.device)
            with maybe_gather_lm_head_ctx(weight, None):
                per_token = ChunkedLogProbFunction.apply(
                    hidden[mask] if compact else hidden,
                    weight,
                    None,
                    labels[mask] if compact else labels.clamp(min=0),
                    1.0,
                    _CHUNKED_LOGPROB_CHUNK_SIZE,
                    None,
                    1.0,
                    ("log_probs", "entropy", "is_top1"),
                )
            log_probs = per_token[0]
            if compact:
                log_probs = log_probs.new_zeros(mask.shape).masked_scatter(mask, log_probs)
            else:
                log_probs = log_probs.masked_fill(~mask, 0)
            return -log_probs.sum() / mask.sum().clamp(min=1)

        return fn

    sys.path.insert(0, str(REPO_ROOT))
    from trl_ext.losses import fused_token_loss, token_loss
    from trl_ext.losses.reference import reference_token_loss

    def params(x: dict) -> dict:
        return {"cost_embedding": x["cost_embedding"]} if "cost_embedding" in x else {}

    if path == "reference":
        return lambda x: (
            reference_token_loss(loss, F.linear(x["hidden"], x["weight"]), x["labels"], **params(x)).sum()
            / x["n_valid"]
        )
    if path == "chunked":
        return lambda x: (
            token_loss(
                loss, F.linear(x["hidden"], x["weight"]), x["labels"], chunk_size=chunk_size, **params(x)
            ).sum()
            / x["n_valid"]
        )
    if path == "fused":
        return lambda x: (
            fused_token_loss(
                loss, x["hidden"], x["weight"], x["labels"], chunk_size=chunk_size, **params(x)
            ).sum()
            / x["n_valid"]
        )
    raise ValueError(f"unknown path {path!r}; choose from {PATHS + ANCHORS}")


def _fwd_bwd(fn, x: dict, sync) -> tuple[float, float, float]:
    """One forward + backward: (wall seconds, CPU seconds of this process, loss value)."""
    x["hidden"].grad = None
    x["weight"].grad = None
    start, cpu_start = time.perf_counter(), time.process_time()
    loss = fn(x)
    loss.backward()
    sync()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    value = float(loss.detach())
    if value != value or abs(value) == float("inf"):
        raise RuntimeError(f"non-finite loss {value}")
    return elapsed, cpu, value


def run_worker(case: dict) -> dict:
    import gc

    import torch

    torch.set_num_threads(case["threads"])
    device = case["device"]
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    name = f"{case['shape']}/{case['loss']}/{case['path']}"

    x = _make_inputs(SHAPES[case["shape"]], case["loss"], device, dtype=case["dtype"])
    fn = _loss_fn(case)

    # Tiny warm-up: thread pool, lazy imports, first-call allocations; small enough not to move the RSS.
    tiny = _make_inputs(TINY_SHAPE, case["loss"], device, seed=1, dtype=case["dtype"])
    _fwd_bwd(fn, tiny, sync)
    del tiny
    x["hidden"].grad = x["weight"].grad = None
    checksum = sum(float(t.detach().sum()) for t in x.values() if torch.is_tensor(t))  # touch the inputs
    gc.collect()
    _malloc_trim()

    if cuda:
        torch.cuda.empty_cache()
        sync()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
        log(f"{name}: baseline {baseline / 2**20:.0f} MiB allocated; forward + backward for memory")
        loss_value = _fwd_bwd(fn, x, sync)[2]
        peak = torch.cuda.max_memory_allocated()
        mem = {
            "baseline_mib": baseline / 2**20,
            "peak_mib": peak / 2**20,
            "method": "cuda max_memory_allocated",
        }
    else:
        reset_ok = _reset_peak_rss()
        baseline = _rss_kib()
        polluted = max(0, _maxrss_kib() - baseline)  # a peak already above the baseline would hide the run's
        log(f"{name}: baseline RSS {baseline / 1024:.0f} MiB; forward + backward for memory")
        loss_value = _fwd_bwd(fn, x, sync)[2]
        peak = _maxrss_kib()
        mem = {
            "baseline_mib": baseline / 1024,
            "peak_mib": peak / 1024,
            "method": "ru_maxrss - statm RSS" + (" (high-water mark reset)" if reset_ok else ""),
            "baseline_polluted_mib": polluted / 1024,
        }
        if polluted > 1024:
            log(f"{name}: WARNING peak RSS was already {polluted / 1024:.0f} MiB above the baseline")
    mem["extra_mib"] = mem["peak_mib"] - mem["baseline_mib"]
    grads = sum(t.grad.numel() * t.grad.element_size() for t in (x["hidden"], x["weight"]))
    log(f"{name}: extra {mem['extra_mib']:.0f} MiB (of which {grads / 2**20:.0f} MiB are the gradients)")

    times, cpu_times = [], []
    for i in range(case["repeats"]):
        gc.collect()
        elapsed, cpu, _ = _fwd_bwd(fn, x, sync)
        times.append(elapsed)
        cpu_times.append(cpu)
        log(f"{name}: run {i + 1}/{case['repeats']} {elapsed:.2f} s wall, {cpu:.2f} s CPU")

    return {
        **case,
        **mem,
        "grads_mib": grads / 2**20,
        "times_s": times,
        "time_s": statistics.median(times),
        "time_min_s": min(times),
        "cpu_times_s": cpu_times,
        "cpu_s": statistics.median(cpu_times),
        "loss_value": loss_value,
        "n_valid": x["n_valid"],
        "input_checksum": checksum,
        "torch": torch.__version__,
    }


# --------------------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------------------


def _csv(choices: tuple[str, ...], what: str):
    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad}; choose from {', '.join(choices)}")
        return items

    return parse


def build_cases(args: argparse.Namespace) -> list[dict]:
    common = {
        "device": args.device,
        "threads": args.threads,
        "repeats": args.repeats,
        "chunk_size": args.chunk_size,
        "dtype": args.dtype,
        "kernels": args.kernels,
    }
    cases = []
    for shape in args.shapes:
        for anchor in args.anchors:
            cases.append({**common, "shape": shape, "loss": "ce", "path": anchor})
        for loss in args.losses:
            for path in args.paths:
                if args.quick and path == "reference" and loss != "ce":
                    continue
                cases.append({**common, "shape": shape, "loss": loss, "path": path})
    return cases


def run_case(case: dict, timeout: float | None) -> dict:
    return run_worker_process(__file__, case, timeout, env={"DISTMATCH_KERNELS": case["kernels"]})


def add_ratios(results: list[dict]) -> None:
    anchor = {r["shape"]: r for r in results if r["path"] == "hf_ce" and "error" not in r}
    for r in results:
        a = anchor.get(r["shape"])
        ok = a is not None and "error" not in r
        r["time_ratio"] = r["time_s"] / a["time_s"] if ok else None
        r["cpu_ratio"] = r["cpu_s"] / a["cpu_s"] if ok else None
        r["memory_ratio"] = r["extra_mib"] / a["extra_mib"] if ok and a["extra_mib"] > 0 else None
    add_fused_ce_ratios(results)


def add_fused_ce_ratios(results: list[dict]) -> None:
    """The GPU targets' ratios: time to the fastest fused CE of the shape (anchors + our fused ce), memory to our fused ce."""
    for shape in {r["shape"] for r in results}:
        ok = [r for r in results if r["shape"] == shape and "error" not in r]
        fused_ce = [r for r in ok if r["path"] in FUSED_CE or (r["path"] == "fused" and r["loss"] == "ce")]
        ours = next((r for r in ok if r["path"] == "fused" and r["loss"] == "ce"), None)
        if not fused_ce:
            continue
        fastest = min(fused_ce, key=lambda r: r["time_s"])
        for r in ok:
            r["fastest_fused_ce"] = fastest["path"] if fastest["path"] != "fused" else "distmatch fused ce"
            r["time_vs_fastest_fused_ce"] = r["time_s"] / fastest["time_s"]
            r["memory_vs_fused_ce"] = (
                r["extra_mib"] / ours["extra_mib"] if ours and ours["extra_mib"] else None
            )


def fused_ce_table(results: list[dict]) -> str:
    rows = [
        "| shape | loss | time ms | × fastest fused CE | target | extra MiB | × our fused ce | target | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        target = GPU_TARGETS.get(r["loss"]) if r["path"] == "fused" else None
        if target is None or "time_vs_fastest_fused_ce" not in r:
            continue
        memory, time_ratio = r["memory_vs_fused_ce"], r["time_vs_fastest_fused_ce"]
        met = memory is not None and memory <= target[0] and time_ratio <= target[1]
        rows.append(
            f"| {r['shape']} | {r['loss']} | {r['time_s'] * 1e3:.1f} | {time_ratio:.2f} ({r['fastest_fused_ce']}) | "
            f"≤ {target[1]} | {r['extra_mib']:.0f} | {fmt(memory, '.2f')} | ≤ {target[0]} | "
            f"{'met' if met else 'not met'} |"
        )
    return "\n".join(rows)


def results_table(results: list[dict]) -> str:
    rows = [
        "| shape | loss | path | time s | ×CE time | extra MiB | ×CE memory | CPU s | ×CE CPU | loss |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['shape']} | {r['loss']} | {r['path']} | error: {r['error']} | | | | | | |")
            continue
        rows.append(
            f"| {r['shape']} | {r['loss']} | {r['path']} | {r['time_s']:.2f} | {fmt(r['time_ratio'], '.2f')} | "
            f"{r['extra_mib']:.0f} | {fmt(r['memory_ratio'], '.2f')} | {r['cpu_s']:.2f} | "
            f"{fmt(r['cpu_ratio'], '.2f')} | {r['loss_value']:.4f} |"
        )
    return "\n".join(rows)


def targets_table(results: list[dict]) -> str:
    rows = [
        "| shape | loss | path | ×CE memory | target | ×CE time | target | status | ×CE CPU (info) |",
        "|---|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        target = TARGETS.get((r["loss"], r["path"]))
        if target is None:
            continue
        if "error" in r or r["memory_ratio"] is None or r["time_ratio"] is None:
            rows.append(
                f"| {r['shape']} | {r['loss']} | {r['path']} | - | ≤ {target[0]} | - | ≤ {target[1]} | not measured | |"
            )
            continue
        mem_ok, time_ok = r["memory_ratio"] <= target[0], r["time_ratio"] <= target[1]
        status = (
            "met"
            if mem_ok and time_ok
            else "not met ("
            + ", ".join(w for w, ok in (("memory", mem_ok), ("time", time_ok)) if not ok)
            + ")"
        )
        rows.append(
            f"| {r['shape']} | {r['loss']} | {r['path']} | {r['memory_ratio']:.3f} | ≤ {target[0]} | "
            f"{r['time_ratio']:.2f} | ≤ {target[1]} | {status} | {fmt(r['cpu_ratio'], '.2f')} |"
        )
    return "\n".join(rows)


def anchors_table(results: list[dict]) -> str:
    rows = [
        "| shape | anchor | what | extra MiB | ×CE memory | ×CE time | expected (smollm2) |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in results:
        if r["path"] not in ANCHORS:
            continue
        if "error" in r:
            rows.append(
                f"| {r['shape']} | {r['path']} | {ANCHOR_LABELS[r['path']]} | error: {r['error']} | | | |"
            )
            continue
        rows.append(
            f"| {r['shape']} | {r['path']} | {ANCHOR_LABELS[r['path']]} | {r['extra_mib']:.0f} | "
            f"{fmt(r['memory_ratio'], '.3f')} | {fmt(r['time_ratio'], '.2f')} | {ANCHOR_CLAIMS.get(r['path'], '')} |"
        )
    return "\n".join(rows)


def report(results: list[dict], meta: dict) -> str:
    shapes = ", ".join(
        f"{s} (d={SHAPES[s]['d']}, V={SHAPES[s]['V']}, N={SHAPES[s]['N']})" for s in meta["shapes"]
    )
    header = (
        f"# distmatch loss benchmark ({meta['date']})\n\n"
        f"`{meta['command']}`\n\n"
        f"device {meta['device']} ({meta['cpu']}), {meta['threads']} threads, torch {meta['torch']}, "
        f"transformers {meta['transformers']}, trl {meta['trl']}; {meta['dtype']} inputs; "
        f"DISTMATCH_KERNELS={meta['kernels']}; shapes {shapes}; "
        f"~{IGNORED_FRACTION:.0%} of labels -100; loss = sum / n_valid; time = median of {meta['repeats']} "
        f"forward+backward runs (after one warm-up run, which is also the memory run); extra = peak memory of one "
        f"forward+backward above the inputs ({meta['memory_method']}), gradients of hidden and weight included; "
        f"CPU s = CPU time of the case's process (all threads; less disturbed by other load than wall time); "
        f"loss = its value in the memory run; "
        f"ratios to hf_ce of the same shape and run; chunk size {meta['chunk_size'] or 'auto'}; 1-min load average "
        f"{meta['load_before']:.1f} before, {meta['load_after']:.1f} after (times are only clean near 0).\n"
    )
    return (
        f"{header}\n## Results\n\n{results_table(results)}\n\n## Anchors\n\n{anchors_table(results)}\n\n"
        f"## Targets (CPU, ratios to hf_ce)\n\n{targets_table(results)}\n\n"
        f"## Against the fused cross-entropies (the GPU targets)\n\n{fused_ce_table(results)}\n"
    )


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smollm2 only; fused rows, CE reference and the anchors; 1 repeat",
    )
    p.add_argument(
        "--shapes",
        type=_csv(tuple(SHAPES), "shape"),
        help=f"comma list of {', '.join(SHAPES)} (default: {','.join(DEFAULT_SHAPES)})",
    )
    p.add_argument(
        "--losses", type=_csv(LOSSES, "loss"), default=list(LOSSES), help="comma list (default: all)"
    )
    p.add_argument(
        "--paths", type=_csv(PATHS, "path"), help="comma list of reference, chunked, fused (default: all)"
    )
    p.add_argument(
        "--anchors",
        type=_csv(ANCHORS, "anchor"),
        help=f"comma list; hf_ce is always measured (default: {','.join(CPU_ANCHORS)}, on CUDA all)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="dtype of hidden and weight (default: float32 on CPU, bfloat16 on CUDA)",
    )
    p.add_argument(
        "--kernels",
        choices=("auto", "torch", "triton"),
        default="auto",
        help="DISTMATCH_KERNELS for our rows (default auto: Triton on CUDA)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        help="timed forward+backward runs per case, median reported (default 3, --quick 1)",
    )
    p.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help="rows per chunk for the chunked/fused rows (default: auto)",
    )
    p.add_argument(
        "--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1, ..."
    )
    p.add_argument(
        "--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads (default: all cores)"
    )
    p.add_argument(
        "--case-timeout", type=float, default=None, help="seconds before a case is abandoned (default: none)"
    )
    p.add_argument(
        "--out",
        nargs="?",
        const=str(DEFAULT_OUT),
        default=None,
        help=f"also write the report as markdown and the raw results as JSON into this folder (default {DEFAULT_OUT})",
    )
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.chunk_size is not None and args.chunk_size < 1:
        p.error("--chunk-size must be a positive integer")
    if args.quick:
        args.shapes = args.shapes or ["smollm2"]
        args.paths = args.paths or ["reference", "fused"]  # reference for ce only, see build_cases
        args.repeats = args.repeats or 1
    args.shapes = args.shapes or list(DEFAULT_SHAPES)
    args.paths = args.paths or list(PATHS)
    args.repeats = args.repeats or 3
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args._worker:
        print(json.dumps(run_worker(json.loads(args._worker))), flush=True)
        return 0

    versions = library_versions()
    if args.device == "auto":
        args.device = "cuda" if versions["cuda"] else "cpu"
    cuda = args.device.startswith("cuda")
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.anchors = args.anchors or list(ANCHORS if cuda else CPU_ANCHORS)
    if "hf_ce" not in args.anchors:
        args.anchors.insert(0, "hf_ce")
    cases = build_cases(args)
    meta = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python benchmarks/bench_losses.py " + " ".join(argv),
        "device": args.device,
        "cpu": _cpu_name(),
        "threads": args.threads,
        "repeats": args.repeats,
        "chunk_size": args.chunk_size,
        "dtype": args.dtype,
        "kernels": args.kernels,
        "shapes": args.shapes,
        "memory_method": "CUDA max_memory_allocated - memory_allocated"
        if args.device.startswith("cuda")
        else "ru_maxrss - RSS from /proc/self/statm, one process per case",
        **versions,
    }
    meta["load_before"] = os.getloadavg()[0]
    log(
        f"{len(cases)} cases on {args.device} with {args.threads} threads, {args.repeats} timed repeat(s) each"
    )
    if meta["load_before"] > 0.5:
        log(
            f"WARNING load average {meta['load_before']:.1f}: other processes share the CPU, times will be noisy"
        )
    results = []
    for i, case in enumerate(cases, 1):
        log(f"case {i}/{len(cases)}: {case['shape']} {case['loss']} {case['path']}")
        result = run_case(case, args.case_timeout)
        if "error" in result:
            log(f"case {i}/{len(cases)}: ERROR {result['error']}")
        results.append(result)

    meta["load_after"] = os.getloadavg()[0]
    add_ratios(results)
    text = report(results, meta)
    print(text)
    if args.out:
        stem = f"bench_losses-{'-'.join(args.shapes)}-{meta['date'].replace(':', '')}"
        log(f"wrote {write_outputs(args.out, stem, text, meta, results)}.md and .json")
    return 1 if all("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
