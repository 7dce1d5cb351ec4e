"""Real parts for tests/eval/test_next_token_contract.py: a tiny seeded LlamaForCausalLM and the project's byte-level
BPE tokenizer (trl_ext.testing.build_tokenizer, with a BOS post-processor and a chat template), saved once with
``save_pretrained`` (the model in bfloat16, so that a load in float32 is a choice the loader makes) and loaded back
with the Auto classes; forward pre-hooks that record what a model is given (spies: the model still computes); and the
float64 oracle, a float64 load of the same checkpoint run on each unpadded sequence alone.

Everything is built once per process and cached (mutmut forks its test processes from one that already built them).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "TEMPLATE",
    "checkpoint",
    "enc",
    "greedy_text",
    "model_calls",
    "oracle",
    "oracle_distribution",
    "tokenizer",
    "use_model",
]

#: Every turn as <|role|>content</s>; the generation prompt <|assistant|>.
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@functools.cache
def checkpoint() -> Path:
    """The saved checkpoint's folder (model in bfloat16 + tokenizer), removed when the building process exits."""
    from tokenizers import processors
    from transformers import LlamaConfig, LlamaForCausalLM

    from trl_ext.testing import build_tokenizer

    tok = build_tokenizer()
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)]
    )
    tok.chat_template = TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.3,  # peaked next-token distributions: a wrong statistic is far from the right one
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    folder = Path(tempfile.mkdtemp(prefix="distmatch-next-token-"))
    owner = os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(folder, ignore_errors=True))
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@functools.cache
def _model(dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint(), dtype=dtype).eval()


@functools.cache
def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint())


def tokenizer(template: str | None = TEMPLATE, *, pad: str | None = "<pad>", eos: str | None = "</s>") -> Any:
    """A fresh copy of the saved tokenizer, with its chat template, pad and EOS tokens as asked."""
    tok = copy.deepcopy(_tokenizer())
    tok.chat_template = template
    if pad != "<pad>":
        tok.pad_token = pad
    if eos != "</s>":
        tok.eos_token = eos
    return tok


def enc(text: str, special: bool) -> list[int]:
    """The saved tokenizer's ids of `text` (with its BOS token when `special`)."""
    return list(_tokenizer()(text, add_special_tokens=special)["input_ids"])


@functools.cache
def greedy_text(steps: int = 12) -> str:
    """The float32 model's greedy continuation of BOS, decoded: text whose tokens are often the top-1 token."""
    ids = [_tokenizer().bos_token_id]
    with torch.no_grad():
        for _ in range(steps):
            logits = _model(torch.float32)(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return _tokenizer().decode(ids[1:], skip_special_tokens=True)


def _record(calls: list[dict[str, Any]]):
    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        calls.append({"input_ids": kwargs.get("input_ids"), "attention_mask": kwargs.get("attention_mask")})

    return hook


@contextlib.contextmanager
def use_model(device: str | None = None) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """(the float32 model, or a copy of it on `device`; the list of what each forward pass is given)."""
    model = _model(torch.float32)
    if device is not None:
        model = copy.deepcopy(model).to(device)
    calls: list[dict[str, Any]] = []
    handle = model.register_forward_pre_hook(_record(calls), with_kwargs=True)
    try:
        yield model, calls
    finally:
        handle.remove()


@contextlib.contextmanager
def model_calls() -> Iterator[list[dict[str, Any]]]:
    """What each causal LM loaded inside the block is called with: its parameters' dtype and device, and the input
    ids its embedding is given (a global forward pre-hook: the model is loaded by the code under test)."""
    from transformers import PreTrainedModel

    calls: list[dict[str, Any]] = []

    def hook(module: Any, args: Any) -> None:
        if isinstance(module, PreTrainedModel) and type(module).__name__.endswith("ForCausalLM"):
            param = next(module.parameters())
            calls.append({"dtype": param.dtype, "device": param.device})
        elif isinstance(module, torch.nn.Embedding) and calls and "input_ids" not in calls[-1]:
            calls[-1]["input_ids"] = args[0]

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def _logp(ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(_model(torch.float64)(input_ids=torch.tensor([ids])).logits[0], dim=-1)


def oracle(rows: list[tuple[list[int], int]]) -> dict[str, Any]:
    """The documented means over the scored tokens ids[start:] of each row, in float64, each row run alone."""
    nll, ent, top1, correct = [], [], [], []
    for ids, start in rows:
        logp = _logp(ids)
        for t in range(start, len(ids)):
            p = logp[t - 1].exp()
            nll.append(float(-logp[t - 1, ids[t]]))
            ent.append(float(-(p * logp[t - 1]).sum()))
            top1.append(float(p.max()))
            correct.append(float(int(p.argmax()) == ids[t]))
    n = len(nll)
    mean_nll = sum(nll) / n
    return {
        "perplexity": math.exp(mean_nll),
        "mean_nll": mean_nll,
        "mean_entropy": sum(ent) / n,
        "mean_top1_prob": sum(top1) / n,
        "top1_accuracy": sum(correct) / n,
        "num_tokens": n,
    }


def oracle_distribution(ids: list[int]) -> tuple[torch.Tensor, float]:
    """(the float64 next-token probabilities after `ids`, their entropy in nats)."""
    logp = _logp(ids)[-1]
    p = logp.exp()
    return p, float(-(p * logp).sum())
