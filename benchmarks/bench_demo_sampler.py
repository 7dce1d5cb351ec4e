#!/usr/bin/env python
"""Does a last-bit change of the model's numbers change the demo's samples? Hugging Face's sampling against the
demo's sampler (examples/demo/demo_sampling.py).

A measurement script, never a pass/fail test. The demo's base model (SmolLM2-135M-Instruct, float32, 2 threads)
samples K continuations of the first held-out prompts twice, in two fresh interpreters that differ only in torch's
own CPU kernels (``ATEN_CPU_CAPABILITY=avx2`` and ``=default``: other summation orders in softmax, norms and
reductions, i.e. what another CPU kind does to the last bits). Each interpreter draws with both samplers:

* ``hf``: ``eval_tasks.generation.hf_generate`` (``model.generate`` with ``torch.multinomial``, seeded per batch),
  what the demo used before;
* ``demo``: ``demo_sampling.sample_batch`` (float64 inverse CDF in token-id order, numpy uniforms per sample).

It prints, per sampler, how many samples are identical between the two kernel sets, and the largest difference of
the logits of one forward pass (so the last bits did change).

Usage (from the repository root)::

    python benchmarks/bench_demo_sampler.py                 # 6 prompts x 6 samples x 32 tokens; CPU, ~3 min alone
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "demo"
CAPABILITIES = ("avx2", "default")


def _worker(args: argparse.Namespace) -> None:
    sys.path[:0] = [str(REPO), str(DEMO)]
    import torch
    from demo_config import config_from
    from demo_model import resolve_model
    from demo_sampling import sample_batch
    from demo_train import read_records
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval_tasks import generation as G

    torch.set_num_threads(2)
    flags = ["--progress", "0", "--samples", str(args.samples), "--max-new-tokens", str(args.tokens)]
    cfg = config_from({}, flags + (["--model", args.model] if args.model else []))
    model_dir = resolve_model(cfg, lambda message: None)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = read_records(cfg.heldout_file)[: args.prompts]
    encoded = G.encode_prompts(tokenizer, [{"id": i, "prompt": p["prompt"]} for i, p in enumerate(prompts)])
    sampling = G.Sampling(num_samples=args.samples, max_new_tokens=args.tokens, seed=cfg.seed)
    out: dict[str, list[str]] = {"hf": [], "demo": []}
    for start in range(0, len(encoded), cfg.gen_batch):
        ids = [e.ids for e in encoded[start : start + cfg.gen_batch]]
        for rows in G.hf_generate(model, tokenizer, ids, sampling, cfg.seed + start):
            out["hf"] += rows
        positions = list(range(start, start + len(ids)))
        kwargs = {"temperature": 1.0, "top_k": 50, "top_p": 0.9, "seed": cfg.seed}
        for rows in sample_batch(
            model, tokenizer, ids, positions, num_samples=args.samples, max_new_tokens=args.tokens, **kwargs
        ):
            out["demo"] += rows
    with torch.no_grad():
        logits = model(torch.tensor([encoded[0].ids])).logits[0, -1]
    result = {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "samples": out,
        "logits": logits.tolist(),
    }
    Path(args.worker_out).write_text(json.dumps(result), encoding="utf-8")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=6, help="held-out prompts (default 6)")
    parser.add_argument("--samples", type=int, default=6, help="samples per prompt (default 6)")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per sample (default 32)")
    parser.add_argument("--model", help="HF model folder (default: the demo's SmolLM2-135M-Instruct)")
    parser.add_argument("--_worker", dest="worker_out", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, int] | None:
    args = parse_args(argv)
    if args.worker_out:
        _worker(args)
        return None
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for capability in CAPABILITIES:
            path = Path(tmp) / f"{capability}.json"
            env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "OMP_WAIT_POLICY": "PASSIVE"}
            cmd = [sys.executable, __file__, "--prompts", str(args.prompts), "--samples", str(args.samples)]
            cmd += ["--tokens", str(args.tokens), "--_worker", str(path)] + (
                ["--model", args.model] if args.model else []
            )
            subprocess.run(cmd, env=env, check=True)
            results[capability] = json.loads(path.read_text(encoding="utf-8"))
    a, b = (results[c] for c in CAPABILITIES)
    diff = max(abs(x - y) for x, y in zip(a["logits"], b["logits"]))
    print(f"torch kernels: {a['capability']} vs {b['capability']}; largest logit difference {diff:.3g}")
    print("| sampler | samples identical |")
    print("|---|---|")
    identical = {}
    for name in ("hf", "demo"):
        identical[name] = sum(x == y for x, y in zip(a["samples"][name], b["samples"][name]))
        print(f"| {name} | {identical[name]} / {len(a['samples'][name])} |")
    return identical


if __name__ == "__main__":
    main()
