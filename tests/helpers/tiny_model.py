"""A tiny random Llama and a byte-level BPE tokenizer, built in code (no downloads), plus toy SFT data.

The builders live in `trl_ext.testing` (the offline examples use them too); this module keeps the tests' imports.
"""

from __future__ import annotations

from typing import Any

from trl_ext.testing import CHAT_TEMPLATE, build_tiny_llama, build_tokenizer, corpus, write_sft_jsonl

__all__ = [
    "CHAT_TEMPLATE",
    "build_tiny_llama",
    "build_tokenizer",
    "corpus",
    "tiny_llama_in_memory",
    "write_sft_jsonl",
]


def tiny_llama_in_memory(**config: Any) -> Any:
    """A seeded one-layer Llama (vocabulary 32, width 8), not saved: for tests of the patched forward and its guards.
    `config`: LlamaConfig fields to add or override."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    sizes = dict(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(LlamaConfig(**{**sizes, **config}))
