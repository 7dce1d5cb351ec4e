"""Next-token statistics of a checkpoint: perplexity, mean token entropy, mean top-1 probability on a dataset, and
a prompt's first-response-token distribution (GEM figure 6)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from distmatch.optional import require
from eval_tasks.metrics.inputs import EVAL_EXTRA as _EVAL

__all__ = ["GEM_FIGURE6_PROMPTS", "NextTokenStats", "next_token_distribution", "next_token_stats"]

#: The three one-token-answer prompts of GEM's figure 6 (appendix E.1).
GEM_FIGURE6_PROMPTS = (
    "Complete this sequence with a single letter: A, B, C, ___",
    "Give me a single-digit number",
    "Tell me a type of fruit",
)


@dataclass
class NextTokenStats:
    """Token-level statistics of a model on a dataset (scored tokens only; means are over tokens)."""

    perplexity: float  # exp(mean NLL)
    mean_nll: float
    mean_entropy: float  # nats, mean over tokens of H(p(. | prefix))
    mean_top1_prob: float  # mean over tokens of max_v p(v | prefix)
    top1_accuracy: float  # fraction of tokens whose argmax is the target
    num_tokens: int
    num_sequences: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _load_model_and_tokenizer(model: Any, tokenizer: Any, device: str | None, dtype: Any = None):
    torch = require("torch", extra=_EVAL, feature="Next-token statistics")
    if isinstance(model, (str, os.PathLike)):
        transformers = require("transformers", extra=_EVAL, feature="Next-token statistics")
        path = os.fspath(model)
        try:
            tokenizer = tokenizer or transformers.AutoTokenizer.from_pretrained(path)
            model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
        except Exception as err:
            raise ValueError(f"Could not load checkpoint {path!r}: {type(err).__name__}: {err}") from err
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    elif tokenizer is None:
        raise ValueError("Pass the tokenizer together with a loaded model (or give a checkpoint path).")
    model.eval()
    return model, tokenizer


def _use_chat(tokenizer: Any, chat_template: str | bool) -> bool:
    if chat_template in (True, "always"):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("chat_template='always' but the tokenizer has no chat template.")
        return True
    if chat_template in (False, "never"):
        return False
    if chat_template != "auto":
        raise ValueError(f"chat_template must be 'auto', 'always' or 'never', got {chat_template!r}.")
    return bool(getattr(tokenizer, "chat_template", None))


def _ids(tokenizer: Any, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _scoring_example(tokenizer: Any, record: Any, chat: bool, index: int) -> tuple[list[int], int]:
    """(token ids, index of the first scored token) of one record: text | prompt+response | messages."""
    if isinstance(record, str):
        record = {"text": record}
    if not isinstance(record, Mapping):
        raise ValueError(f"record #{index}: expected a JSON object, got {type(record).__name__}.")
    if "text" in record:
        ids = _ids(tokenizer, record["text"], True)
        return ids, 1
    if "messages" in record:
        messages = list(record["messages"])
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError(
                f"record #{index}: 'messages' must end with an assistant turn (the scored response)."
            )
        if not chat:
            raise ValueError(f"record #{index}: 'messages' records need a tokenizer with a chat template.")
        prompt_text = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        full_text = tokenizer.apply_chat_template(messages, tokenize=False)
        response_text = (
            full_text[len(prompt_text) :] if full_text.startswith(prompt_text) else messages[-1]["content"]
        )
        prompt_ids = _ids(tokenizer, prompt_text, False)
        return prompt_ids + _ids(tokenizer, response_text, False), len(prompt_ids)
    response = record.get("response", record.get("completion"))
    if "prompt" in record and isinstance(response, str):
        if chat:
            messages = [
                {"role": "user", "content": record["prompt"]},
                {"role": "assistant", "content": response},
            ]
            return _scoring_example(tokenizer, {"messages": messages}, True, index)
        prompt_ids = _ids(tokenizer, record["prompt"], True)
        response_ids = _ids(tokenizer, response, False)
        if tokenizer.eos_token_id is not None:
            response_ids.append(tokenizer.eos_token_id)
        return prompt_ids + response_ids, len(prompt_ids)
    raise ValueError(
        f"record #{index}: needs 'text', 'messages', or 'prompt' with 'response'/'completion' (keys: {sorted(record)})."
    )


def next_token_stats(
    model: Any,
    tokenizer: Any,
    records: Iterable[Any],
    *,
    batch_size: int = 8,
    max_length: int = 1024,
    chat_template: str | bool = "auto",
    device: str | None = None,
    progress: bool = False,
) -> NextTokenStats:
    """Perplexity, mean token entropy, mean top-1 probability and top-1 accuracy of `model` on `records`.

    `model`: a causal LM (or a checkpoint path, then `tokenizer` may be None). `records`: strings or mappings with
    ``text`` (every token after the first is scored), ``prompt`` + ``response``/``completion`` or ``messages``
    (only the response / last assistant turn is scored; the chat template is applied when the tokenizer has one).
    Sequences are truncated to `max_length` tokens. CE, entropy and top-1 correctness come from
    ``trl_ext.losses.token_loss("ce", ..., return_stats=True)``; the top-1 probability is exp(z_max - z_y - CE).
    """
    torch = require("torch", extra=_EVAL, feature="Next-token statistics")
    from trl_ext.losses import token_loss

    model, tokenizer = _load_model_and_tokenizer(model, tokenizer, device)
    chat = _use_chat(tokenizer, chat_template)
    examples = []
    for i, record in enumerate(records):
        ids, start = _scoring_example(tokenizer, record, chat, i)
        ids = ids[:max_length]
        if len(ids) - max(start, 1) < 1:
            continue  # nothing left to score after truncation
        examples.append((ids, max(start, 1)))
    if not examples:
        raise ValueError("No scorable tokens: the dataset is empty or every response was truncated away.")
    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    sums = {"nll": 0.0, "entropy": 0.0, "top1_prob": 0.0, "top1_correct": 0.0}
    count = 0
    batches = range(0, len(examples), batch_size)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="next-token stats", unit="batch")
    with torch.no_grad():
        for b in batches:
            chunk = examples[b : b + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            labels = torch.full((len(chunk), width), -100, dtype=torch.long)
            for row, (ids, start) in enumerate(chunk):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention[row, : len(ids)] = 1
                labels[row, start : len(ids)] = torch.tensor(ids[start:])
            logits = model(input_ids=input_ids.to(dev), attention_mask=attention.to(dev)).logits
            flat_logits = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
            flat_labels = labels[:, 1:].reshape(-1).to(dev)
            keep = flat_labels != -100
            flat_logits, flat_labels = flat_logits[keep], flat_labels[keep]
            ce, stats = token_loss("ce", flat_logits, flat_labels, return_stats=True)
            target_logit = flat_logits.gather(1, flat_labels[:, None]).squeeze(1)
            top1_prob = torch.exp(flat_logits.max(dim=1).values - target_logit - stats.ce)
            sums["nll"] += float(stats.ce.double().sum())
            sums["entropy"] += float(stats.entropy.double().sum())
            sums["top1_prob"] += float(top1_prob.double().sum())
            sums["top1_correct"] += float(stats.top1_correct.double().sum())
            count += int(keep.sum())
    mean_nll = sums["nll"] / count
    return NextTokenStats(
        perplexity=math.exp(mean_nll),
        mean_nll=mean_nll,
        mean_entropy=sums["entropy"] / count,
        mean_top1_prob=sums["top1_prob"] / count,
        top1_accuracy=sums["top1_correct"] / count,
        num_tokens=count,
        num_sequences=len(examples),
    )


def next_token_distribution(
    model: Any,
    tokenizer: Any,
    prompt: str,
    *,
    top_k: int = 10,
    chat_template: str | bool = "auto",
    device: str | None = None,
) -> dict[str, Any]:
    """The model's distribution over the first response token after `prompt` (GEM figure 6).

    Returns ``tokens`` (the `top_k` most likely, decoded), ``probs``, ``entropy`` (nats, full vocabulary),
    ``top1_prob`` and ``other`` (mass outside the top k). The chat template is applied when the tokenizer has one.
    """
    torch = require("torch", extra=_EVAL, feature="Next-token distributions")
    model, tokenizer = _load_model_and_tokenizer(model, tokenizer, device)
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt must be a non-empty string.")
    if _use_chat(tokenizer, chat_template):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = _ids(tokenizer, text, False)
    else:
        ids = _ids(tokenizer, prompt, True)
    dev = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=dev)).logits[0, -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    k = min(top_k, probs.numel())
    top = torch.topk(probs, k)
    return {
        "prompt": prompt,
        "tokens": [tokenizer.decode([int(i)]) for i in top.indices],
        "token_pieces": [str(t) for t in tokenizer.convert_ids_to_tokens([int(i) for i in top.indices])],
        "token_ids": [int(i) for i in top.indices],
        "probs": [float(p) for p in top.values],
        "entropy": float(-(probs * logp).sum()),
        "top1_prob": float(top.values[0]),
        "other": float(max(0.0, 1.0 - top.values.sum().item())),
    }
