#!/usr/bin/env python
"""The fused rows' memory, time and accuracy under their memory settings, beside Liger's fused linear CE.

A measurement script, never a pass/fail test. One process measures every (loss x setting) case in turn: the
settings are environment variables the fused path reads at each call (docs/losses.md "Chunk logits" and "Weight-gradient accumulator"):

* ``DISTMATCH_CHUNK_LOGITS``: the chunk's logits in float32 (default) or in the inputs' dtype (``input``);
* ``DISTMATCH_GRAD_WEIGHT_ACCUM``: the weight gradient accumulated in float32 (default) or the head's dtype, or
  formed by vocabulary tile in the backward (``tiles``);
* ``DISTMATCH_CHUNK_MEMORY_MB``: the chunk's budget (512 MiB on CUDA by default).

Per case: extra memory (CUDA ``max_memory_allocated`` above the inputs, the gradients included; on a CPU the peak
resident set, which an earlier case's high-water mark can hide: use bench_losses.py there), the median time of
forward + backward, and the error of the loss and of both gradients against float64 (the same inputs in float64,
row chunks through the autograd reference; relative Frobenius norms). Liger's fused linear CE, when installed, is
measured the same way on the ``ce`` rows. ``--profile`` adds, per case, the operations (CUDA kernels on a GPU) that
took the most self time in one more forward + backward under ``torch.profiler``: where a setting's time goes.

    python benchmarks/bench_fused_memory.py --device cuda --out      # needs: gpu; Llama-3-8B's head, N 8192, bf16
    python benchmarks/bench_fused_memory.py --device cpu --shape tiny --dtype float32 --settings default
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from _loss_cases import REPO_ROOT, SHAPES, _fwd_bwd, _loss_fn, _make_inputs, log

sys.path.insert(0, str(REPO_ROOT))
from trl_ext.losses import reference_token_loss  # noqa: E402
from trl_ext.losses.chunked import CHUNK_LOGITS_ENV, CHUNK_MEMORY_ENV, GRAD_WEIGHT_ACCUM_ENV  # noqa: E402

# name -> (chunk logits, weight-gradient accumulator, chunk budget MiB or None for the device default)
SETTINGS: dict[str, tuple[str, str, int | None]] = {
    "default": ("float32", "float32", None),
    "accum-weight": ("float32", "weight", None),
    "accum-weight-128": ("float32", "weight", 128),
    "input-512": ("input", "weight", 512),
    "input-128": ("input", "weight", 128),
    "input-64": ("input", "weight", 64),
    "input-32": ("input", "weight", 32),
    "input-64-accum-f32": ("input", "float32", 64),
    # d weight by vocabulary tile in the backward (docs/losses.md "Liger's memory at our speed")
    "tiles": ("float32", "tiles", None),
    "tiles-input-60": ("input", "tiles", 60),  # 60 MiB: below the 63 MiB Liger takes beside the gradients
}
LIGER = "liger_flce"


def _apply(setting: str) -> None:
    logits, accum, budget = SETTINGS[setting]
    os.environ[CHUNK_LOGITS_ENV], os.environ[GRAD_WEIGHT_ACCUM_ENV] = logits, accum
    if budget is None:
        os.environ.pop(CHUNK_MEMORY_ENV, None)
    else:
        os.environ[CHUNK_MEMORY_ENV] = str(budget)


def exact_grads(loss: str, x: dict, rows_per_chunk: int = 1024) -> dict:
    """Loss, d hidden and d weight in float64 (sum over tokens / n_valid), row chunk by row chunk."""
    h, w = x["hidden"].detach().double(), x["weight"].detach().double()
    params = {"cost_embedding": x["cost_embedding"].double()} if "cost_embedding" in x else {}
    total, grad_h, grad_w = 0.0, torch.zeros_like(h), torch.zeros_like(w)
    for start in range(0, h.shape[0], rows_per_chunk):
        hc = h[start : start + rows_per_chunk]
        logits = (hc @ w.T).requires_grad_()
        value = reference_token_loss(
            loss, logits, x["labels"][start : start + rows_per_chunk], **params
        ).sum()
        (g,) = torch.autograd.grad(value / x["n_valid"], logits)
        total += float(value) / x["n_valid"]
        grad_h[start : start + rows_per_chunk] = g @ w
        grad_w.addmm_(g.T, hc)
        del logits, g
    return {"loss": total, "hidden": grad_h, "weight": grad_w}


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def measure(fn, x: dict, repeats: int, cuda: bool, exact: dict | None) -> dict:
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    _fwd_bwd(fn, x, sync)  # warm-up: kernels compiled, self-check done
    x["hidden"].grad = x["weight"].grad = None
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        import resource

        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _, _, value = _fwd_bwd(fn, x, sync)
    if cuda:
        extra = (torch.cuda.max_memory_allocated() - baseline) / 2**20
    else:
        extra = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline) / 2**20
    row = {"extra_mib": extra, "loss_value": value}
    if exact is not None:
        row.update(
            loss_err=abs(value - exact["loss"]) / abs(exact["loss"]),
            hidden_err=_rel(x["hidden"].grad, exact["hidden"]),
            weight_err=_rel(x["weight"].grad, exact["weight"]),
        )
    times = [_fwd_bwd(fn, x, sync)[0] for _ in range(repeats)]
    row["time_ms"] = 1000 * statistics.median(times)
    return row


def profile_case(fn, x: dict, cuda: bool, top: int = 10) -> list[dict]:
    """The `top` operations by self time (device time on CUDA, CPU time elsewhere) of one forward + backward."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        _fwd_bwd(fn, x, torch.cuda.synchronize if cuda else (lambda: None))
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    return [
        {"op": e.key[:90], "calls": e.count, "ms": getattr(e, key) / 1000}
        for e in events[:top]
        if getattr(e, key) > 0
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default="llama3-8b-8k", choices=sorted(SHAPES))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--losses", default="ce,gem_ls,emo")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {', '.join(SETTINGS)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--no-exact", action="store_true", help="skip the float64 errors")
    parser.add_argument(
        "--profile", action="store_true", help="per case, the operations taking the most self time"
    )
    parser.add_argument("--out", nargs="?", const=str(REPO_ROOT / "benchmarks" / "out"), default=None)
    args = parser.parse_args(argv)
    args.settings = args.settings.split(",")
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        parser.error(f"--settings: unknown {', '.join(unknown)}; choose from {', '.join(SETTINGS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = args.settings
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    try:
        import liger_kernel  # noqa: F401

        anchors = [LIGER] if cuda else []
    except ImportError:
        anchors = []
    rows = []
    for loss in args.losses.split(","):
        x = _make_inputs(SHAPES[args.shape], loss, args.device, dtype=args.dtype)
        for t in ("hidden", "weight"):
            x[t].requires_grad_()
        exact = None if args.no_exact else exact_grads(loss, x)
        cases = [(s, "fused") for s in settings] + [(a, a) for a in anchors if loss == "ce"]
        for setting, path in cases:
            if path == "fused":
                _apply(setting)
            log(f"{loss} {setting}")
            try:
                fn = _loss_fn({"path": path, "loss": loss})
                row = measure(fn, x, args.repeats, cuda, exact)
                if args.profile:
                    row["profile"] = profile_case(fn, x, cuda)
            except Exception as err:  # a case that cannot run on this device is a row saying why
                row = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
            rows.append({"loss": loss, "setting": setting, **row})
            log(f"{loss} {setting}: {row}")
        del x, exact
        gc.collect()
    report = table(rows, args)
    print(report)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now().strftime("%Y-%m-%dT%H%M%S")
        (out / f"fused_memory-{args.shape}-{stamp}.md").write_text(report + "\n")
        (out / f"fused_memory-{args.shape}-{stamp}.json").write_text(
            json.dumps({"args": vars(args), "rows": rows}, indent=1)
        )
    return 0 if rows and not all("error" in r for r in rows) else 1


def table(rows: list[dict], args: argparse.Namespace) -> str:
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU (peak RSS: rough)"
    shape = SHAPES[args.shape]
    lines = [
        f"Fused rows by memory setting: N {shape['N']}, d {shape['d']}, V {shape['V']}, {args.dtype}, {device}, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}",
        "",
        "| loss | setting (logits, dW accumulator, chunk MiB) | extra MiB | ms | loss err | d hidden err "
        "| d weight err |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        what = (
            r["setting"]
            if r["setting"] not in SETTINGS
            else "{} ({}, {}, {})".format(r["setting"], *(v or "default" for v in SETTINGS[r["setting"]]))
        )
        if "error" in r:
            lines.append(f"| {r['loss']} | {what} | error: {r['error']} | | | | |")
            continue
        errs = [f"{r[k]:.2e}" if k in r else "" for k in ("loss_err", "hidden_err", "weight_err")]
        lines.append(
            f"| {r['loss']} | {what} | {r['extra_mib']:.0f} | {r['time_ms']:.1f} | " + " | ".join(errs) + " |"
        )
    profiled = [r for r in rows if r.get("profile")]
    if profiled:
        unit = "device" if args.device.startswith("cuda") else "CPU"
        lines += [
            "",
            f"Most {unit} self time per case (one forward + backward under torch.profiler):",
            "",
            "| loss | setting | operation | calls | ms |",
            "|---|---|---|---:|---:|",
        ]
        for r in profiled:
            for p in r["profile"]:
                op = p["op"].replace("|", "/")
                lines.append(f"| {r['loss']} | {r['setting']} | `{op}` | {p['calls']} | {p['ms']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
