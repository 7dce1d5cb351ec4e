"""Tiny random Llamas and toy SFT data, built in code (no downloads): for tests and offline examples.

`build_tiny_llama(dir)` saves a ~100k-parameter random Llama with a byte-level BPE tokenizer (and a chat template)
trained on a toy corpus; `write_sft_jsonl(path)` writes conversational examples (`messages`). The command line
builds both for the offline examples (`examples/axolotl/tiny-cpu.yaml`; `trl sft` on CPU, which it prints)::

    python -m trl_ext.testing examples/axolotl/tiny      # -> tiny/model/ and tiny/data/train.jsonl

The data file is alone in its folder: `trl sft --dataset_name` takes a folder of data files (or a Hub id), not a
file, and would read the model's JSON files as data from a folder that also holds the model.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|>{{ message['content'] }}</s>"
    "{% elif message['role'] == 'assistant' %}<|assistant|>"
    "{% generation %}{{ message['content'] }}</s>{% endgeneration %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_WORDS = (
    "the a river mountain poem story night light quiet storm winter summer city road dream song old new "
    "blue red green silver under over through across slowly softly bright dark cold warm morning evening "
    "write tell about short long with no more than words title sea forest bird wind stone fire rain"
).split()


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) for _ in range(n)]


def build_tokenizer(vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _tiny_llama_config(tokenizer: Any, *, num_hidden_layers: int, **extra: Any) -> Any:
    """The tiny models' Llama shape (width 32, 4 heads, 2 KV heads) over `tokenizer`'s vocabulary and pad id."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def build_tiny_llama(out_dir: Path, *, vocab_size: int = 300, tie: bool = False, seed: int = 0) -> Path:
    """Save a ~100k-parameter random Llama + tokenizer to `out_dir` and return it."""
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = build_tokenizer(vocab_size)
    torch.manual_seed(seed)
    config = _tiny_llama_config(
        tokenizer,
        num_hidden_layers=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=tie,
    )
    model = LlamaForCausalLM(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def build_tiny_reward_model(out_dir: Path, tokenizer: Any, *, seed: int = 0) -> Path:
    """Save a random one-layer Llama sequence-classification model (one score: a reward model) with `tokenizer`."""
    import torch
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed)
    config = _tiny_llama_config(tokenizer, num_hidden_layers=1, num_labels=1)
    LlamaForSequenceClassification(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def write_sft_jsonl(path: Path, n: int = 48, seed: int = 1) -> Path:
    """Conversational SFT examples (`messages`), one JSON object a line."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            topic = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
            answer = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 20)))
            messages = [
                {"role": "user", "content": f"write a poem about {topic}"},
                {"role": "assistant", "content": answer},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


def write_alpaca_jsonl(path: Path, n: int = 48, seed: int = 2) -> Path:
    """Instruction-tuning examples in the Alpaca format (`instruction`, `input`, `output`), one a line."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            topic = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
            answer = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 20)))
            context = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 6))) if i % 2 else ""
            record = {"instruction": f"write a poem about {topic}", "input": context, "output": answer}
            f.write(json.dumps(record) + "\n")
    return path


def build_example(out_dir: Path, *, n_examples: int = 256) -> tuple[Path, Path]:
    """The tiny model (`out_dir/model`) and conversational data (`out_dir/data/train.jsonl`) of the offline
    examples."""
    (out_dir / "data").mkdir(parents=True, exist_ok=True)
    model_dir = build_tiny_llama(out_dir / "model")
    data = write_sft_jsonl(out_dir / "data" / "train.jsonl", n=n_examples)
    return model_dir, data


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m trl_ext.testing",
        description="Build a tiny random Llama and toy SFT data for offline runs (no downloads).",
    )
    parser.add_argument("out_dir", type=Path, help="folder to write model/ and data/train.jsonl into")
    parser.add_argument("--examples", type=int, default=256, help="number of SFT examples (default 256)")
    args = parser.parse_args(argv)
    model_dir, data = build_example(args.out_dir, n_examples=args.examples)
    print(
        f"model: {model_dir}\ndata:  {data}\n"
        f"trl sft --loss gem_ls --model_name_or_path {model_dir} --dataset_name {data.parent} "
        f"--output_dir {args.out_dir / 'out'} --use_cpu --max_steps 20   # TRL on CPU: a data folder, --use_cpu"
    )


if __name__ == "__main__":
    main()
