"""The anchored losses' reference model (`trl_ext.anchor`), in process: which tokenizer differences between the
trained model's folder and `anchor_reference`'s are refused (docs/refusals.md: "the reference model must share the
tokenizer": config.json `vocab_size` and tokenizer.json's token -> id map, added / special tokens included), and that
with LoRA and the LM head in `modules_to_save` the reference is the head as training started, not its trained copy
(the ASFT authors' reference: the model with its adapters off, `model.disable_adapter()`).

The expectations come from the folders written here (an identical copy is accepted; each single change is refused),
not from the code under test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from distmatch.errors import DistMatchConfigError
from trl_ext.anchor import check_reference_source, head_weight, make_reference, reference_hidden

pytest.importorskip("transformers")


def _copy(models: dict[str, Path], tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(models["plain"], folder)
    return folder


def _edit_json(file: Path, edit) -> None:
    data = json.loads(file.read_text(encoding="utf-8"))
    edit(data)
    file.write_text(json.dumps(data), encoding="utf-8")


def _refusal(value: Path, trained: Path) -> str:
    with pytest.raises(DistMatchConfigError) as caught:
        check_reference_source(str(value), str(trained))
    return str(caught.value)


def test_an_identical_copy_of_the_trained_folder_is_accepted(models, tmp_path):
    """The control for every refusal below: the same folder copied elsewhere is a valid reference."""
    check_reference_source(str(_copy(models, tmp_path, "ref")), str(models["plain"]))


@pytest.mark.parametrize("vocab_size", [299, 301])
def test_a_reference_vocabulary_of_another_size_is_refused_either_way(models, tmp_path, vocab_size):
    """config.json `vocab_size` one smaller and one larger than the trained model's 300: both refused."""
    ref = _copy(models, tmp_path, "ref")
    _edit_json(ref / "config.json", lambda c: c.update(vocab_size=vocab_size))
    message = _refusal(ref, models["plain"])
    assert f"vocabulary of {vocab_size} tokens" in message and "has 300" in message
    assert "anchor_reference=" in message and "must share the tokenizer" in message


def _added(data: dict, content: str) -> dict:
    return next(t for t in data["added_tokens"] if t["content"] == content)


def test_a_special_token_under_another_id_is_refused(models, tmp_path):
    """Only the added (special) tokens differ: `</s>` gets the id of `<s>`'s neighbour; the model vocabulary is
    the same, so only a comparison that includes added tokens sees it."""
    ref = _copy(models, tmp_path, "ref")
    data = json.loads((ref / "tokenizer.json").read_text(encoding="utf-8"))
    eos = _added(data, "</s>")
    original = eos["id"]
    _edit_json(ref / "tokenizer.json", lambda d: _added(d, "</s>").update(id=original + 1000))
    assert data["model"]["vocab"] == json.loads((ref / "tokenizer.json").read_text())["model"]["vocab"]
    message = _refusal(ref, models["plain"])
    assert "tokenizer.json maps tokens to ids differently" in message and "</s>" in message


def test_a_renamed_special_token_is_refused(models, tmp_path):
    """The chat template's `<|assistant|>` renamed (same id): a reference that would read another token."""
    ref = _copy(models, tmp_path, "ref")
    _edit_json(ref / "tokenizer.json", lambda d: _added(d, "<|assistant|>").update(content="<|bot|>"))
    assert "maps tokens to ids differently" in _refusal(ref, models["plain"])


def test_two_tokens_with_their_ids_swapped_are_refused(models, tmp_path):
    """The same set of tokens, two of them under each other's id: every id after tokenization differs."""
    ref = _copy(models, tmp_path, "ref")

    def swap(data: dict) -> None:
        vocab = data["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[100:102]
        vocab[a], vocab[b] = vocab[b], vocab[a]

    _edit_json(ref / "tokenizer.json", swap)
    assert "maps tokens to ids differently" in _refusal(ref, models["plain"])


def test_lora_with_the_head_in_modules_to_save_keeps_the_starting_head_as_reference(models):
    """LoRA (q_proj, v_proj) with `lm_head` in modules_to_save: after the trained copy of the head (and the
    adapters) change, the reference's logits are still the starting model's, and the trained model's adapters are
    on again after the reference forward."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from trl_ext.loss_mixin import unwrap_peft

    load = lambda: AutoModelForCausalLM.from_pretrained(models["plain"], dtype=torch.float32)  # noqa: E731
    start = load().eval()
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
        modules_to_save=["lm_head"],
        init_lora_weights=False,
    )
    wrapped = peft.get_peft_model(load(), config).eval()
    target = unwrap_peft(wrapped)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "modules_to_save" in name:
                param.add_(0.5)  # the head as training would have changed it
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    reference = make_reference(target, True)
    hidden, head = reference_hidden(target, reference, (), {"input_ids": ids})
    weight = head_weight(head)
    assert not weight.requires_grad
    with torch.no_grad():
        expected = start(input_ids=ids).logits
        trained = wrapped(input_ids=ids).logits
    torch.testing.assert_close(hidden @ weight.T, expected, rtol=1e-5, atol=1e-5)
    assert (trained - expected).abs().max() > 0.1  # the policy is another model: the adapters are back on
