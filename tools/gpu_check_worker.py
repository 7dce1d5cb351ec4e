#!/usr/bin/env python
"""The child side of `tools/gpu_check.py`: the training step's model and data, the `lm_eval` step's data and
encoder, and the packing parity check.

Run as `python tools/gpu_check_worker.py build|eval-assets|parity ...` with the kit's folder on PYTHONPATH. The
probe each `trl sft` run of the training step reports through is the training measurement
benchmarks/_training_probe.py (the kit folder's `sitecustomize.py` installs it). Only the standard library is
imported at the top (the driver imports `best_attention` from here).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

# Llama-3-style decoders built in code. `llama32_1b` (the GPU default, GPU goal 2): Llama-3.2-1B's shapes, d
# 2048, 16 layers, GQA 32/8 heads, SwiGLU 8192, rope theta 5e5, vocabulary 128,256, the head tied to the embedding
# as in that model (1.24 B parameters). `llama3`: the same widths on 4 layers, the head untied (the 2026-11-27 and
# 11-28 runs, 769 M). `tiny`: the CPU dry run's, tied like the GPU default.
MODEL_SHAPES: dict[str, dict[str, int | bool]] = {
    "llama32_1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    "llama3": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 4,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
    },
}


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


def build(out: Path, shape: str, n_examples: int, device: str = "cpu") -> dict[str, Any]:
    """A random Llama-3-style model + a byte-level BPE tokenizer (trained in code) and SFT data, saved under `out`.
    On a GPU the model is initialised there and saved in bf16 (the runs load it in bf16: half the bytes to write
    and read)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(REPO_ROOT))
    from trl_ext.testing import CHAT_TEMPLATE, build_tokenizer, write_sft_jsonl

    tokenizer = build_tokenizer(300)
    tokenizer.chat_template = tokenizer.chat_template or CHAT_TEMPLATE
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = LlamaConfig(**MODEL_SHAPES[shape], rope_theta=500000.0, rms_norm_eps=1e-5, **special)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    if device.startswith("cuda"):
        model = model.to(torch.bfloat16)
    model_dir = out / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    # `--dataset_name <dir>`: datasets' json loader, split train
    (out / "data").mkdir(parents=True, exist_ok=True)
    write_sft_jsonl(out / "data" / "train.jsonl", n=n_examples)
    params = sum(p.numel() for p in model.parameters())
    return {"model": str(model_dir), "data": str(out / "data"), "params": params, **MODEL_SHAPES[shape]}


def eval_assets(out: Path) -> dict[str, Any]:
    """The `lm_eval` step's local data and encoder, under `out`: every distmatch task's fixture splits (the real
    datasets' columns; tests/helpers/eval_fixtures.py) and the code tasks' fixture problems in one
    `DISTMATCH_EVAL_DATA_DIR`, and a tiny random Sentence-BERT encoder built in code (the NLU tasks' retriever and
    the creative task's `sbert_diversity`: the 87 MiB offline all-MiniLM-L6-v2 is not carried, so that metric's
    values mean nothing here; its cost is counted)."""
    import shutil
    import string

    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    sys.path.insert(0, str(REPO_ROOT))
    from tests.helpers.eval_fixtures import write_eval_data

    data = write_eval_data(out / "eval-data")
    shutil.copytree(REPO_ROOT / "tests" / "eval" / "fixtures" / "code", data, dirs_exist_ok=True)
    words = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *(f"##{w}" for w in words)]
    hf = out / "encoder-hf"
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(hf / "vocab.txt")).save_pretrained(hf)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    BertModel(config).save_pretrained(hf)
    word = models.Transformer(str(hf), max_seq_length=128)
    encoder = out / "encoder"
    SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension())]).save(
        str(encoder)
    )
    return {"data": str(data), "encoder": str(encoder)}


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
        output_dir=str(out / "parity"),
        loss=loss,
        padding_free=True,
        max_length=None,
        report_to="none",
        use_cpu=cpu,
        bf16=dtype == "bfloat16",
        per_device_train_batch_size=n_docs,
    )
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
    padding_free = "attention_mask" not in packed and packed["input_ids"].shape[0] == 1
    assert padding_free, "the batch is not padding-free"
    got, g_packed = loss_and_grads([packed])
    want, g_docs = loss_and_grads([batch([i]) for i in docs])
    worst = max(float((g_packed[n] - g_docs[n]).norm() / g_docs[n].norm().clamp_min(1e-30)) for n in g_docs)
    tol = {"bfloat16": 2e-2, "float16": 1e-2}.get(dtype, 1e-4)
    loss_rel = abs(got - want) / abs(want)
    return {
        "loss": loss,
        "attention": attn,
        "dtype": dtype,
        "documents": n_docs,
        "tokens": packed["input_ids"].numel(),
        "loss_packed": got,
        "loss_documents": want,
        "loss_rel_err": loss_rel,
        "grad_rel_err_max": worst,
        "tolerance": tol,
        "ok": loss_rel <= tol and worst <= tol,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--shape", choices=sorted(MODEL_SHAPES), default="llama32_1b")
    b.add_argument("--examples", type=int, default=6000)
    b.add_argument("--device", default="cpu", help="where the model is initialised (cuda: saved in bf16)")
    e = sub.add_parser("eval-assets")
    e.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("parity")
    for flag in ("--model", "--data", "--out"):
        p.add_argument(flag, type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--loss", default="gem_ls")
    args = parser.parse_args(argv)
    if args.command == "build":
        result = build(args.out, args.shape, args.examples, args.device)
        (args.out / "build.json").write_text(json.dumps(result, indent=1))
    elif args.command == "eval-assets":
        result = eval_assets(args.out)
        (args.out / "eval-assets.json").write_text(json.dumps(result, indent=1))
    else:
        result = parity(args.model, args.data, args.out, args.device, args.dtype, args.loss)
        (args.out / "parity.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
