#!/usr/bin/env python
"""Peak memory per rank of the loss step with and without sharding: 2 CPU processes, fused vs logits path.

A measurement script, never a pass/fail test. Each case — setup x loss x path — is one `torchrun --nproc_per_node
2` launch of this file (``--_worker``); each rank:

1. builds the same random Llama (float32) in code: a real-size LM head (default SmolLM2-135M's, d=576,
   V=49152) on a short backbone (``--layers``, default 2), and wraps it: ``ddp`` (no sharding:
   `DistributedDataParallel`, every rank holds the whole model), ``fsdp2`` (`fully_shard` in accelerate's layout:
   each decoder layer, the embedding, `[final norm, lm_head]` with `reshard_after_forward=False`, the root),
   ``fsdp2_head`` (the head as its own unit that reshards after forward) or ``zero3`` (`deepspeed.initialize`,
   ZeRO stage 3, `stage3_param_persistence_threshold: 0`);
2. runs one warm-up loss step on 16 tokens per row (lazy initialisation, communication buffers), clears the
   gradients, `gc.collect()` and `malloc_trim`;
3. resets the peak-RSS high-water mark and reads the RSS (baseline), then runs **the loss step**: the patched
   forward (`trl_ext.model_forward`, path as asked) + backward of `sum(per-token loss) / tokens` on
   ``--tokens`` tokens per rank; **extra MiB** = `ru_maxrss` - baseline, per rank. The parameter gradients that
   the step leaves (sharded or not) are part of it.

Usage (from the repository root)::

    python benchmarks/bench_sharded_loss.py                 # ddp / fsdp2 / fsdp2_head / zero3 x fused / logits, ce
    python benchmarks/bench_sharded_loss.py --setups ddp,fsdp2 --losses ce,emo --out

See docs/benchmarks.md ("Sharded training: loss-step memory per rank").
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

from _harness import (
    fmt,
    library_versions,
    malloc_trim,
    maxrss_kib,
    reset_peak_rss,
    rss_kib,
    run_worker_process,
    write_outputs,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "out"
SETUPS = ("ddp", "fsdp2", "fsdp2_head", "zero3")
PATHS = ("fused", "logits")
LOSSES = ("ce", "gem_linear", "gem_ls", "emo", "ce_entropy", "tailr", "mixce")
WORLD = 2


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------------
# Worker: one case, one rank of a torchrun launch
# --------------------------------------------------------------------------------------------------------------


def _build_model(case: dict):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=case["vocab"],
        hidden_size=case["d"],
        intermediate_size=2 * case["d"],
        num_hidden_layers=case["layers"],
        num_attention_heads=max(1, case["d"] // 64),
        num_key_value_heads=max(1, case["d"] // 192),
        max_position_embeddings=max(2048, case["seq"]),
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def _wrap(model, setup: str):
    """(module whose forward is called, the inner HF model, engine or None)."""
    import torch

    if setup == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model), model, None
    if setup in ("fsdp2", "fsdp2_head"):
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        if setup == "fsdp2":
            fully_shard(model.model.embed_tokens)
            fully_shard([model.model.norm, model.lm_head], reshard_after_forward=False)
        else:
            fully_shard(model.lm_head, reshard_after_forward=True)
        fully_shard(model)
        return model, model, None
    if setup == "zero3":
        import deepspeed

        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
        }
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        return engine, engine.module, engine
    raise ValueError(f"unknown setup {setup!r}; valid: {', '.join(SETUPS)}")


def run_worker(case: dict) -> dict | None:
    import gc

    import torch
    import torch.distributed as dist

    from trl_ext.model_forward import LossRequest, frozen_head_copy, install_loss_forward

    torch.set_num_threads(case["threads"])
    if case["setup"] == "zero3":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = _build_model(case)
    cost = model.lm_head.weight.detach().clone() if case["loss"] == "emo" else None
    wrapped, inner, engine = _wrap(model, case["setup"])
    if cost is not None and case["setup"] != "ddp":
        # the copy a trainer takes under sharding: the whole head on every rank
        cost = frozen_head_copy(inner)
    install_loss_forward(inner)
    request = LossRequest(
        name=case["loss"], params={}, cost_embedding=cost, force_logits_path=case["path"] == "logits"
    )
    gen = torch.Generator().manual_seed(100 + rank)
    rows = case["tokens"] // case["seq"]

    def batch(seq: int) -> dict:
        ids = torch.randint(0, case["vocab"], (rows, seq), generator=gen)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    def step(inputs: dict) -> tuple[float, str]:
        out = wrapped(**inputs, distmatch_loss=request)
        loss = out.per_token_loss.sum() / out.label_mask.sum()
        if engine is not None:
            engine.backward(loss)
        else:
            loss.backward()
        return loss.item(), out.path

    step(batch(16))  # warm-up
    if engine is not None:
        engine.step()  # lr 0: clears the partitioned gradients
    else:
        wrapped.zero_grad(set_to_none=True)
    main = batch(case["seq"])
    gc.collect()
    malloc_trim()
    dist.barrier()
    reset_ok = reset_peak_rss()
    baseline = rss_kib()
    start = time.perf_counter()
    loss_value, path = step(main)
    seconds = time.perf_counter() - start
    peak = maxrss_kib()
    mine = {
        "rank": rank,
        "baseline_mib": baseline / 1024,
        "peak_mib": peak / 1024,
        "extra_mib": (peak - baseline) / 1024,
        "seconds": seconds,
        "loss_value": loss_value,
        "path_reported": path,
        "peak_reset": reset_ok,
    }
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    dist.barrier()
    if engine is not None:
        engine.destroy()
    from trl_ext.teardown import release_process_groups_at_exit

    release_process_groups_at_exit()  # the groups and their threads end at exit, as in the trainers
    if rank != 0:
        return None
    return {**case, "ranks": everyone, "torch": torch.__version__}


# --------------------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------------------


def results_table(results: list[dict]) -> str:
    lines = [
        "| setup | loss | path | path reported | peak MiB rank 0 / 1 | extra MiB rank 0 / 1 | before MiB rank 0 / 1 | "
        "× ddp logits (peak) | step s | loss rank 0 |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = {
        r["loss"]: max(x["peak_mib"] for x in r["ranks"])
        for r in results
        if "error" not in r and r["setup"] == "ddp" and r["path"] == "logits"
    }
    for r in results:
        if "error" in r:
            lines.append(f"| {r['setup']} | {r['loss']} | {r['path']} | error: {r['error']} | | | | | | |")
            continue
        r0, r1 = r["ranks"][0], r["ranks"][1]
        peak = max(r0["peak_mib"], r1["peak_mib"])
        ratio = peak / base[r["loss"]] if r["loss"] in base else None
        lines.append(
            f"| {r['setup']} | {r['loss']} | {r['path']} | {r0['path_reported']} | "
            f"{r0['peak_mib']:.0f} / {r1['peak_mib']:.0f} | {r0['extra_mib']:.0f} / {r1['extra_mib']:.0f} | "
            f"{r0['baseline_mib']:.0f} / {r1['baseline_mib']:.0f} | {fmt(ratio, '.2f')} | "
            f"{max(r0['seconds'], r1['seconds']):.1f} | {r0['loss_value']:.4f} |"
        )
    return "\n".join(lines)


def report(results: list[dict], meta: dict) -> str:
    head = (
        f"Loss-step memory per rank, {WORLD} CPU processes (gloo), {meta['date']}: torch {meta['torch']}, "
        f"transformers {meta['transformers']}; LM head d={meta['d']}, V={meta['vocab']}, {meta['layers']} "
        f"decoder layers, {meta['tokens']} tokens per rank ({meta['seq']} per row), float32, "
        f"{meta['threads']} thread(s) per rank. peak = the process's ru_maxrss during the loss step (high-water "
        "mark reset before it: interpreter, libraries, the rank's parameters and everything the step allocates); "
        "before = its RSS just before the step; extra = peak - before; × ddp logits = the larger rank's peak / "
        "that of the unsharded logits path of the same loss."
    )
    return f"{head}\n\n{results_table(results)}\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    def csv(choices: tuple[str, ...], what: str):
        def parse(text: str) -> list[str]:
            items = [t for t in text.split(",") if t]
            bad = [t for t in items if t not in choices]
            if bad or not items:
                raise argparse.ArgumentTypeError(f"unknown {what} {bad}; valid: {', '.join(choices)}")
            return items

        return parse

    p = argparse.ArgumentParser(prog="bench_sharded_loss.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--setups", type=csv(SETUPS, "setup"), default=list(SETUPS), help="comma list (default all)"
    )
    p.add_argument("--losses", type=csv(LOSSES, "loss"), default=["ce"], help="comma list (default ce)")
    p.add_argument("--paths", type=csv(PATHS, "path"), default=list(PATHS), help="comma list (default both)")
    p.add_argument(
        "--cases",
        default=None,
        metavar="SETUP:PATH,...",
        help="only these (setup, path) pairs, each loss (instead of every setup x path)",
    )
    p.add_argument("--d", type=int, default=576, help="hidden width (default 576, SmolLM2-135M)")
    p.add_argument("--vocab", type=int, default=49152, help="vocabulary (default 49152, SmolLM2-135M)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    p.add_argument("--tokens", type=int, default=2048, help="tokens per rank (default 2048)")
    p.add_argument("--seq", type=int, default=512, help="tokens per row (default 512)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1; 2 ranks)")
    p.add_argument("--case-timeout", type=float, default=None, help="seconds before a case is abandoned")
    p.add_argument("--out", nargs="?", const=str(DEFAULT_OUT), default=None, help="write .md and .json here")
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args._worker and (args.tokens % args.seq or args.tokens < args.seq):
        p.error("--tokens must be a positive multiple of --seq")
    if args.cases is not None:
        pairs = [tuple(c.split(":")) for c in args.cases.split(",") if c]
        bad = [":".join(c) for c in pairs if len(c) != 2 or c[0] not in SETUPS or c[1] not in PATHS]
        if bad or not pairs:
            p.error(
                f"--cases: {bad or 'none'} not SETUP:PATH with SETUP in {', '.join(SETUPS)} and PATH in "
                f"{', '.join(PATHS)}"
            )
        args.cases = pairs
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args._worker:
        result = run_worker(json.loads(args._worker))
        if result is not None:
            print(json.dumps(result), flush=True)
        return 0
    versions = library_versions()
    meta = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python benchmarks/bench_sharded_loss.py " + " ".join(argv),
        **{k: getattr(args, k) for k in ("d", "vocab", "layers", "tokens", "seq", "threads")},
        "memory_method": "ru_maxrss - RSS from /proc/self/statm per rank, one torchrun launch per case",
        **versions,
    }
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}"]
    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    results = []
    pairs = args.cases or [(s, p) for s in args.setups for p in args.paths]
    cases = [(s, loss, p) for s, p in pairs for loss in args.losses]
    for i, (setup, loss, path) in enumerate(cases, 1):
        log(f"case {i}/{len(cases)}: {setup} {loss} {path}")
        case = {
            "setup": setup,
            "loss": loss,
            "path": path,
            **{k: getattr(args, k) for k in ("d", "vocab", "layers", "tokens", "seq", "threads")},
        }
        result = run_worker_process(__file__, case, args.case_timeout, env=env, launcher=launcher)
        if "error" in result:
            log(f"case {i}/{len(cases)}: ERROR {result['error']}")
        else:
            log(
                f"case {i}/{len(cases)}: extra MiB per rank {[round(r['extra_mib']) for r in result['ranks']]}"
            )
        results.append(result)
    text = report(results, meta)
    print(text, end="")
    if args.out:
        stem = f"bench_sharded_loss-{meta['date'].replace(':', '')}"
        log(f"wrote {write_outputs(args.out, stem, text, meta, results)}.md and .json")
    return 1 if all("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
