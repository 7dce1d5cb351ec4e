"""Fixtures of the TRL trainer tests: the tiny models and SFT data (once per session), one torch thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.tiny_model import build_tiny_llama, write_sft_jsonl


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matrices: threads only add synchronisation, which is very slow on a shared, loaded CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny Llamas saved once per session: untied (vocab 300), tied, another seed, another vocabulary."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        "plain": build_tiny_llama(root / "plain"),
        "tied": build_tiny_llama(root / "tied", tie=True),
        "other_seed": build_tiny_llama(root / "other_seed", seed=1),
        "other_vocab": build_tiny_llama(root / "other_vocab", vocab_size=280),
    }


@pytest.fixture(scope="session")
def data(tmp_path_factory) -> dict[str, Any]:
    datasets = pytest.importorskip("datasets")
    root = tmp_path_factory.mktemp("sft_data")
    path = write_sft_jsonl(root / "train.jsonl", n=48)
    train = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(root / "cache"))
    return {"train": train, "eval": train.select(range(8))}
