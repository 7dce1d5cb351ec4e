#!/usr/bin/env python
"""The child side of `tools/gpu_check.py`: the training benchmark's model and data, the packing parity check, and
the probe that each `trl sft` run of the benchmark reports through.

Run as `python tools/gpu_check_worker.py build|parity ...` with the kit's folder on PYTHONPATH; the probe is
installed by the kit folder's `sitecustomize.py` when `DISTMATCH_GPU_CHECK_PROBE` names a file. Only the standard
library is imported at the top (the probe runs at every interpreter start of a training run).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
PROBE_ENV = "DISTMATCH_GPU_CHECK_PROBE"
LAUNCHED_ENV = "DISTMATCH_GPU_CHECK_LAUNCHED"

# A Llama-3-style decoder: Llama-3.2-1B's widths (d 2048, GQA 32/8 heads, SwiGLU 8192, rope theta 5e5) and
# Llama-3's vocabulary (128,256) on 4 of its 16 layers, the head untied. `tiny`: the CPU dry run's.
MODEL_SHAPES: dict[str, dict[str, int]] = {
    "llama3": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 4, "num_attention_heads": 32,
               "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 512},
}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# The probe: tokens/s and peak memory of a `trl sft` run, rewritten after every step (a run stopped by its time
# limit still has its steps measured) and when training ends


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Patches `transformers.trainer.Trainer` right after that module is executed (no import at start-up)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "transformers.trainer":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch_trainer(module.Trainer)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install_probe() -> None:
    if os.environ.get(PROBE_ENV) and not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())


def _patch_trainer(trainer_cls: Any) -> None:
    import torch
    from transformers import TrainerCallback

    record: dict[str, Any] = {
        "tokens": 0,
        "step_tokens": [],
        "step_end_s": [],
        "losses": [],
        "finished": False,
    }
    cuda = torch.cuda.is_available()
    record["device"] = torch.cuda.get_device_name() if cuda else "cpu"
    # The fused path's settings the training process ran with (docs/losses.md "Chunk logits").
    record["settings"] = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith("DISTMATCH_") and k not in (PROBE_ENV, LAUNCHED_ENV)
    }
    launched = float(os.environ.get(LAUNCHED_ENV, "nan"))  # wall clock when the driver started `trl sft`

    def write() -> None:  # after every step: kept small, its time falls into the next step's
        if cuda:
            record["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        else:
            import resource

            record["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        target = Path(os.environ[PROBE_ENV])
        target.with_suffix(".tmp").write_text(json.dumps(record))
        target.with_suffix(".tmp").replace(target)

    class Probe(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            record["step_end_s"].append(time.perf_counter())
            record["step_tokens"].append(record["tokens"])
            if len(record["step_end_s"]) == 1:
                record["first_step_after_s"] = time.time() - launched
            write()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                record["losses"].append(float(logs["loss"]))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            record["finished"] = True
            write()

    init, training_step = trainer_cls.__init__, trainer_cls.training_step

    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        record["trainer_ready_after_s"] = time.time() - launched
        self.add_callback(Probe())
        record["trainer_class"] = type(self).__name__

    def patched_step(self: Any, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        mask = inputs.get("attention_mask")
        record["tokens"] += int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel())
        return training_step(self, model, inputs, *args, **kwargs)

    trainer_cls.__init__, trainer_cls.training_step = patched_init, patched_step


def train_summary(record: dict[str, Any], warmup: int) -> dict[str, Any]:
    """Tokens/s over the steps after `warmup` (each step's end synchronised), peak MiB, first and last loss."""
    ends, tokens = record["step_end_s"], record["step_tokens"]
    if len(ends) <= warmup + 1:
        warmup = 0 if len(ends) > 1 else -1
    if warmup < 0:
        raise ValueError(f"{len(ends)} steps recorded: too few to time")
    seconds = ends[-1] - ends[warmup]
    counted = tokens[-1] - tokens[warmup]
    losses = record.get("losses") or [float("nan")]
    return {"tokens_per_s": counted / seconds, "peak_mib": record["peak_mib"], "timed_steps": len(ends) - 1 - warmup,
            "s_per_step": seconds / (len(ends) - 1 - warmup), "loss_first": losses[0], "loss_last": losses[-1],
            "device": record.get("device"), "trainer_class": record.get("trainer_class"),
            "finished": record.get("finished", False), "steps_done": len(ends),
            "trainer_ready_after_s": record.get("trainer_ready_after_s"),
            "first_step_after_s": record.get("first_step_after_s"), "settings": record.get("settings", {})}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Model and data


def best_attention(device: str) -> str:
    if device.startswith("cuda"):
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return "sdpa"


def build(out: Path, shape: str, n_examples: int) -> dict[str, Any]:
    """A random Llama-3-style model + a byte-level BPE tokenizer (trained in code) and SFT data, saved under `out`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(REPO_ROOT))
    from trl_ext.testing import CHAT_TEMPLATE, build_tokenizer, write_sft_jsonl

    tokenizer = build_tokenizer(300)
    tokenizer.chat_template = tokenizer.chat_template or CHAT_TEMPLATE
    config = LlamaConfig(
        **MODEL_SHAPES[shape], rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model_dir = out / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (out / "data").mkdir(
        parents=True, exist_ok=True
    )  # `--dataset_name <dir>`: datasets' json loader, split train
    write_sft_jsonl(out / "data" / "train.jsonl", n=n_examples)
    params = sum(p.numel() for p in model.parameters())
    return {"model": str(model_dir), "data": str(out / "data"), "params": params, **MODEL_SHAPES[shape]}


# ---------------------------------------------------------------------------------------------------------------
# Packing parity: one padding-free packed batch against its documents one by one, through DistMatchSFTTrainer


def parity(
    model_dir: Path, data: Path, out: Path, device: str, dtype: str, loss: str, n_docs: int = 4
) -> dict:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(REPO_ROOT))
    from trl_ext.config import DistMatchSFTConfig
    from trl_ext.trainer import DistMatchSFTTrainer

    torch.manual_seed(0)
    attn = best_attention(device)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=getattr(torch, dtype), attn_implementation=attn
    )
    model.to(device)
    cpu = not device.startswith("cuda")
    args = DistMatchSFTConfig(
        output_dir=str(out / "parity"), loss=loss, padding_free=True, max_length=None, report_to="none",
        use_cpu=cpu, bf16=dtype == "bfloat16", per_device_train_batch_size=n_docs,
    )  # fmt: skip
    dataset = load_dataset("json", data_files=str(data / "train.jsonl"), split=f"train[:{n_docs * 4}]")
    trainer = DistMatchSFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    keep = ("input_ids", "labels", "completion_mask", "assistant_masks", "seq_lengths")

    def batch(indices: list[int]) -> dict[str, Any]:
        rows = [{k: v for k, v in trainer.train_dataset[i].items() if k in keep} for i in indices]
        return {k: v.to(device) if hasattr(v, "to") else v for k, v in trainer.data_collator(rows).items()}

    def loss_and_grads(batches: list[dict[str, Any]]) -> tuple[float, dict[str, torch.Tensor]]:
        trainer.model.zero_grad(set_to_none=True)
        total = 0.0
        for b in batches:  # summed token losses (num_items_in_batch=1), gradients accumulated
            value = trainer.compute_loss(trainer.model, b, num_items_in_batch=1)
            value.backward()
            total += float(value.detach())
        grads = {
            n: p.grad.detach().float().clone()
            for n, p in trainer.model.named_parameters()
            if p.grad is not None
        }
        return total, grads

    trainer.model.train()
    docs = list(range(n_docs))
    packed = batch(docs)
    assert "attention_mask" not in packed and packed["input_ids"].shape[0] == 1, (
        "the batch is not padding-free"
    )
    got, g_packed = loss_and_grads([packed])
    want, g_docs = loss_and_grads([batch([i]) for i in docs])
    worst = max(float((g_packed[n] - g_docs[n]).norm() / g_docs[n].norm().clamp_min(1e-30)) for n in g_docs)
    tol = {"bfloat16": 2e-2, "float16": 1e-2}.get(dtype, 1e-4)
    loss_rel = abs(got - want) / abs(want)
    return {"loss": loss, "attention": attn, "dtype": dtype, "documents": n_docs, "tokens": packed["input_ids"].numel(),
            "loss_packed": got, "loss_documents": want, "loss_rel_err": loss_rel, "grad_rel_err_max": worst,
            "tolerance": tol, "ok": loss_rel <= tol and worst <= tol}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--shape", choices=sorted(MODEL_SHAPES), default="llama3")
    b.add_argument("--examples", type=int, default=6000)
    p = sub.add_parser("parity")
    for flag in ("--model", "--data", "--out"):
        p.add_argument(flag, type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--loss", default="gem_ls")
    args = parser.parse_args(argv)
    if args.command == "build":
        result = build(args.out, args.shape, args.examples)
        (args.out / "build.json").write_text(json.dumps(result, indent=1))
    else:
        result = parity(args.model, args.data, args.out, args.device, args.dtype, args.loss)
        (args.out / "parity.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
