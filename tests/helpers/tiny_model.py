"""A tiny random Llama and a byte-level BPE tokenizer, built in code (no downloads), plus toy SFT data.

The builders live in `trl_ext.testing` (the offline examples use them too); this module keeps the tests' imports.
"""

from __future__ import annotations

from trl_ext.testing import CHAT_TEMPLATE, build_tiny_llama, build_tokenizer, corpus, write_sft_jsonl

__all__ = ["CHAT_TEMPLATE", "build_tiny_llama", "build_tokenizer", "corpus", "write_sft_jsonl"]
