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

The cases and the worker are in ``_loss_cases.py``, the ratios, targets and tables in ``_loss_tables.py``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys

from _harness import library_versions, run_worker_process, write_outputs
from _loss_cases import (
    ANCHORS,
    CPU_ANCHORS,
    DEFAULT_SHAPES,
    LOSSES,
    PATHS,
    REPO_ROOT,
    SHAPES,
    log,
    run_worker,
)
from _loss_tables import add_ratios, report

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "out"

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
