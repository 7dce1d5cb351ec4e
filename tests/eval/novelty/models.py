"""Tiny NoveltyBench models built in code: a random 2-label DeBERTa-v2 pair classifier and a random Llama reward
model, both over the tiny BPE tokenizer of trl_ext.testing ([CLS] = <s>, [SEP] = </s>), and the tiny Llama."""

from __future__ import annotations

from pathlib import Path


def build_tiny_classifier(out: Path, *, seed: int = 5) -> Path:
    import torch
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    from trl_ext.testing import build_tokenizer

    tokenizer = build_tokenizer(300)
    tokenizer.cls_token, tokenizer.sep_token = "<s>", "</s>"
    torch.manual_seed(seed)
    config = DebertaV2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        type_vocab_size=2,
        num_labels=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = DebertaV2ForSequenceClassification(config)
    with torch.no_grad():  # spread the logits so that pairs land on both sides of the 0.102 threshold
        model.classifier.weight.mul_(40.0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_models(root: Path) -> dict[str, Path]:
    from transformers import AutoTokenizer

    from trl_ext.testing import build_tiny_llama, build_tiny_reward_model

    paths = {"model": root / "model", "classifier": root / "classifier", "reward": root / "reward"}
    if not paths["model"].exists():
        build_tiny_llama(paths["model"])
        build_tiny_classifier(paths["classifier"])
        build_tiny_reward_model(paths["reward"], AutoTokenizer.from_pretrained(paths["model"]), seed=3)
    return paths
