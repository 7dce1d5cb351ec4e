"""Memory and time of the anchored loss (`asft`) on its fused path, as ratios to its logits path.

    python benchmarks/bench_anchored.py [--N 2048 --d 576 --V 49152 --repeats 3 --threads 2 --cases ... --out DIR]

One fresh interpreter per case (`_harness.run_worker_process`), CPU float32 by default (`--device cuda --dtype
bfloat16` on a GPU), forward + backward of the loss only
(the two models' final hidden states and heads are given; the reference model's forward is not included). Cases:

* `asft logits`: both models' `N x V` logits materialised (`h @ W.T`, `h_ref @ W_ref.T`), then `token_loss` in chunks;
* `asft official`: the same logits, then the ASFT authors' formula on full logits (`reference_token_loss`);
* `asft fused`: `fused_token_loss(..., reference_hidden=, reference_weight=)`, no `N x V` logits of either model;
* `emo fused` and `ce fused`: the other fused losses, for comparison (the anchored loss should cost about what EMO costs).

Extra memory is the peak resident set size during the step minus the resident size with the inputs allocated (on
CUDA: the allocator's peak minus what the inputs hold).
Prints a Markdown table (also written to DIR/bench_anchored.md with the raw numbers in DIR/bench_anchored.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    REPO_ROOT,
    fmt,
    malloc_trim,
    maxrss_kib,
    reset_peak_rss,
    rss_kib,
    run_worker_process,
)

CASES = ("asft logits", "asft official", "asft fused", "emo fused", "ce fused")


def _worker(case: dict) -> dict:
    sys.path.insert(0, str(REPO_ROOT))
    import torch

    from trl_ext.losses import fused_token_loss, token_loss
    from trl_ext.losses.reference import reference_token_loss

    torch.set_num_threads(case["threads"])
    n, d, v = case["N"], case["d"], case["V"]
    device, dtype = torch.device(case["device"]), getattr(torch, case["dtype"])
    gen = torch.Generator().manual_seed(0)

    def make(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    hidden = make(n, d, scale=d**-0.5).requires_grad_()
    weight = make(v, d).requires_grad_()
    ref_hidden, ref_weight = make(n, d, scale=d**-0.5), make(v, d)
    labels = torch.randint(0, v, (n,), generator=gen).to(device)
    labels[: n // 10] = -100
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    loss_name, path = case["case"].split()

    def step() -> float:
        if path == "fused":
            extra = (
                {"reference_hidden": ref_hidden, "reference_weight": ref_weight}
                if loss_name == "asft"
                else {"cost_embedding": weight.detach()}
                if loss_name == "emo"
                else {}
            )
            loss = fused_token_loss(loss_name, hidden, weight, labels, **extra)
        else:
            logits = hidden @ weight.T
            with torch.no_grad():
                ref_logits = ref_hidden @ ref_weight.T
            fn = token_loss if path == "logits" else reference_token_loss
            loss = fn(loss_name, logits, labels, reference_logits=ref_logits)
        total = loss.sum() / n
        total.backward()
        hidden.grad = weight.grad = None
        return float(total.detach())

    step()  # warm-up (allocator, kernels)
    sync()
    if cuda:  # the GPU's allocator: the peak over what the inputs hold
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        value = step()
        extra = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        malloc_trim()
        base = rss_kib()
        reset_peak_rss()
        value = step()
        extra = max(maxrss_kib() - base, 0) / 1024
    times = []
    for _ in range(case["repeats"]):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return {**case, "loss_value": value, "extra_mib": extra, "time_s": statistics.median(times)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--N", type=int, default=2048, help="tokens")
    parser.add_argument("--d", type=int, default=576, help="hidden width (both models)")
    parser.add_argument("--V", type=int, default=49152, help="vocabulary")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._worker:
        return args
    for name in ("N", "d", "V", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(
            f"--cases: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(CASES)}"
        )
    args.case_list = cases
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args._worker:
        print(json.dumps(_worker(json.loads(args._worker))))
        return 0
    cases = args.case_list
    common = {"N": args.N, "d": args.d, "V": args.V, "repeats": args.repeats, "threads": args.threads}
    common |= {"device": args.device, "dtype": args.dtype}
    results = [run_worker_process(__file__, {**common, "case": case}, timeout=1800) for case in cases]
    base = next((r for r in results if r["case"] == "asft logits" and "error" not in r), None)
    lines = [
        f"N = {args.N}, d = {args.d}, V = {args.V}, {args.dtype} on {args.device}"
        + (f", {args.threads} threads" if args.device == "cpu" else "")
        + f", median of {args.repeats}",
        "",
        "| case | extra memory (MiB) | time (s) | memory / asft logits | time / asft logits |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['error']} | | | |")
            continue
        mem = r["extra_mib"] / base["extra_mib"] if base and base["extra_mib"] > 0 else None
        tim = r["time_s"] / base["time_s"] if base else None
        lines.append(
            f"| {r['case']} | {r['extra_mib']:.1f} | {r['time_s']:.3f} | {fmt(mem, '.3f')} | {fmt(tim, '.2f')} |"
        )
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_anchored.md").write_text(table + "\n")
    (args.out / "bench_anchored.json").write_text(json.dumps({"results": results}, indent=1))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
