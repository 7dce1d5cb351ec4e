"""The cases of bench_losses.py: the shapes, losses, paths and anchors it measures, and the worker that measures one
case (inputs, the loss function of each path or anchor, one forward + backward for memory, the timed repeats) in the
fresh interpreter bench_losses.py starts for it."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from _harness import malloc_trim as _malloc_trim
from _harness import maxrss_kib as _maxrss_kib
from _harness import reset_peak_rss as _reset_peak_rss
from _harness import rss_kib as _rss_kib

REPO_ROOT = Path(__file__).resolve().parent.parent

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
IGNORED_FRACTION = 0.1


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
