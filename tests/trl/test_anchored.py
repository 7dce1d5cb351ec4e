"""The anchored losses (`asft`, `sft_kl`) through TRL's real `SFTTrainer` on the tiny Llama: the frozen reference
model (`trl_ext/anchor.py`), the logged KL, and the loss against the ASFT authors' formula (`train_v2.py`: w * CE +
kl_weight * F.kl_div(log_softmax(z), softmax(z_ref)).sum(-1), mean over target tokens, the reference under no_grad;
with LoRA the reference is the model with its adapter disabled).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tests.helpers.sft import collate, load_model, lora_config, make_trainer, step_logs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _official(policy_logits, ref_logits, labels, mode: str, kl_weight: float) -> torch.Tensor:
    """The authors' compute_loss, rewritten from train_v2.py (float64 here)."""
    z = policy_logits[:, :-1].reshape(-1, policy_logits.shape[-1]).double()
    z_ref = ref_logits[:, :-1].reshape(-1, ref_logits.shape[-1]).double()
    y = labels[:, 1:].reshape(-1)
    valid = y != -100
    ce = F.cross_entropy(z, y, reduction="none")
    p_y = torch.softmax(z, -1).gather(1, y.clamp(min=0)[:, None]).squeeze(1).detach()
    kl = F.kl_div(F.log_softmax(z, -1), F.softmax(z_ref, -1), reduction="none").sum(-1)
    per_token = (p_y * ce if mode == "asft" else ce) + kl_weight * kl
    return per_token[valid].sum() / valid.sum()


def _parameter_bytes(module: torch.nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() * p.element_size() for p in module.parameters())


@pytest.mark.parametrize("loss", ["asft", "sft_kl"])
def test_full_fine_tuning_reference_is_the_frozen_start_and_the_loss_is_the_authors(
    models, data, tmp_path, loss
):
    trainer = make_trainer(models["plain"], data, tmp_path, loss=loss, anchor_kl_weight=0.3)
    reference = trainer.distmatch_request.reference
    frozen = reference.model
    assert frozen is not None and frozen is not trainer.model and not reference.adapters_off
    assert not any(p.requires_grad for p in frozen.parameters()) and not frozen.training
    assert {p.dtype for p in frozen.parameters()} == {torch.float32}  # the training dtype
    start = {n: p.detach().clone() for n, p in frozen.named_parameters()}
    # One full copy of the weights, outside the trained module: not optimised, not saved.
    assert _parameter_bytes(frozen) == _parameter_bytes(trainer.model)
    assert not set(map(id, frozen.parameters())) & set(map(id, trainer.model.parameters()))

    # Move the policy away from the reference, then compare one batch with the authors' formula.
    with torch.no_grad():
        for i, p in enumerate(trainer.model.parameters()):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.02)
    batch = collate(trainer, [0, 1, 2, 3])
    with torch.no_grad():
        got = trainer.compute_loss(trainer.model, dict(batch)).item()
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch.get("attention_mask")}
        policy = trainer.model(**inputs).logits
        ref = load_model(models["plain"])(**inputs).logits  # the starting checkpoint, loaded again
    want = _official(policy, ref, batch["labels"], loss, 0.3).item()
    assert math.isclose(got, want, rel_tol=2e-5), (got, want)
    kl_only = (
        _official(policy, ref, batch["labels"], loss, 1.0).item()
        - _official(policy, ref, batch["labels"], loss, 0.0).item()
    )
    assert kl_only > 1e-3  # the anchor is in the comparison

    trainer.train()
    logs = step_logs(trainer)
    assert len(logs) == 2 and all("kl" in log and math.isfinite(log["kl"]) and log["kl"] > 0 for log in logs)
    for name, p in frozen.named_parameters():  # never trained
        assert torch.equal(p, start[name]), name
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert not optimised & set(map(id, frozen.parameters()))


def test_the_kl_starts_at_zero_and_grows(models, data, tmp_path):
    """The reference is the starting model: the first step's KL is 0 (up to float32 rounding), the second's not."""
    trainer = make_trainer(models["plain"], data, tmp_path, loss="asft", learning_rate=1e-2)
    trainer.train()
    first, second = (log["kl"] for log in step_logs(trainer))
    assert abs(first) < 1e-6 and second > 1e-5, (first, second)


def test_lora_reference_is_the_adapter_disabled_model_without_a_copy(models, data, tmp_path):
    peft = pytest.importorskip("peft")
    trainer = make_trainer(
        models["plain"],
        data,
        tmp_path,
        loss="asft",
        trainer_kwargs={"peft_config": lora_config(["q_proj", "v_proj"], random_init=True)},
    )
    assert isinstance(trainer.model, peft.PeftModel)
    reference = trainer.distmatch_request.reference
    assert reference.model is None and reference.adapters_off  # no second copy of the weights
    assert _parameter_bytes(reference.model) == 0

    batch = collate(trainer, [0, 1, 2, 3])
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch.get("attention_mask")}
    with torch.no_grad():
        got = trainer.compute_loss(trainer.model, dict(batch)).item()
        policy = trainer.model(**inputs).logits
        with trainer.model.disable_adapter():  # the authors' reference under LoRA
            ref = trainer.model(**inputs).logits
        after = trainer.model(**inputs).logits
    assert (policy - ref).abs().max() > 1e-3  # the random adapter matters, so a missing switch would show
    assert torch.equal(after, policy)  # the adapters are on again after the reference forward
    want = _official(policy, ref, batch["labels"], "asft", 0.1).item()
    assert math.isclose(got, want, rel_tol=2e-5), (got, want)

    trainer.train()
    logs = step_logs(trainer)
    assert len(logs) == 2 and all(log["kl"] > 0 for log in logs)


# ---------------------------------------------------------------------------------------------------------------
# `anchor_reference`: another checkpoint as the reference


def test_another_checkpoint_as_the_reference_is_loaded_frozen_and_anchors_the_loss(models, data, tmp_path):
    trainer = make_trainer(
        models["plain"], data, tmp_path, loss="sft_kl", anchor_reference=str(models["other_seed"])
    )
    reference = trainer.distmatch_request.reference
    frozen = reference.model
    assert frozen is not None and not reference.adapters_off and not frozen.training
    assert not any(p.requires_grad for p in frozen.parameters())
    saved = load_model(models["other_seed"])
    for (name, p), (_, q) in zip(frozen.named_parameters(), saved.named_parameters()):
        assert p.dtype == torch.float32 and torch.equal(p, q), name  # that checkpoint, in the training dtype
    start = load_model(models["plain"])
    assert any(not torch.equal(p, q) for p, q in zip(frozen.parameters(), start.parameters()))

    batch = collate(trainer, [0, 1, 2, 3])
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch.get("attention_mask")}
    with torch.no_grad():
        got = trainer.compute_loss(trainer.model, dict(batch)).item()
        policy = trainer.model(**inputs).logits
        ref = saved(**inputs).logits
        starting = start(**inputs).logits
    want = _official(policy, ref, batch["labels"], "sft_kl", 0.1).item()
    assert math.isclose(got, want, rel_tol=2e-5), (got, want)
    # Not the starting model's anchor (which is 0 at the first step): the other checkpoint's.
    assert not math.isclose(
        got, _official(policy, starting, batch["labels"], "sft_kl", 0.1).item(), rel_tol=1e-4
    )

    trainer.train()
    logs = step_logs(trainer)
    assert len(logs) == 2 and all(log["kl"] > 1e-4 for log in logs)  # the starting model's would start at 0
    for p, q in zip(frozen.parameters(), saved.parameters()):
        assert torch.equal(p, q)  # never trained


def test_another_checkpoint_with_lora_is_a_loaded_model_in_the_training_dtype(models, data, tmp_path):
    pytest.importorskip("peft")
    model = load_model(models["plain"]).to(torch.bfloat16)
    trainer = make_trainer(
        models["plain"],
        data,
        tmp_path,
        model=model,
        loss="asft",
        anchor_reference=str(models["other_seed"]),
        trainer_kwargs={"peft_config": lora_config(["q_proj", "v_proj"], random_init=True)},
    )
    reference = trainer.distmatch_request.reference
    assert (
        reference.model is not None and not reference.adapters_off
    )  # that checkpoint, not the adapters-off model
    assert {p.dtype for p in reference.model.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in reference.model.parameters())


def test_reference_folders_without_a_config_or_with_another_tokenizer_are_refused(models, tmp_path):
    """Read from the folders' config.json / tokenizer.json only: no model is loaded."""
    import json
    import shutil

    from distmatch.errors import DistMatchConfigError
    from trl_ext.anchor import check_reference_source

    check_reference_source("initial", str(models["plain"]))
    check_reference_source(str(models["other_seed"]), str(models["plain"]))
    empty = tmp_path / "empty"
    empty.mkdir()
    swapped = shutil.copytree(models["other_seed"], tmp_path / "swapped")
    tokenizer = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    a, b = list(vocab)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two tokens with each other's ids
    (swapped / "tokenizer.json").write_text(json.dumps(tokenizer))
    cases = {
        str(tmp_path / "missing"): "no such folder",
        str(empty): "has no config.json",
        str(models["other_vocab"]): "has a vocabulary of 280 tokens but the model being trained has 300",
        str(swapped): "tokenizer.json maps tokens to ids differently",
    }
    for value, expected in cases.items():
        with pytest.raises(DistMatchConfigError, match=expected) as info:
            check_reference_source(value, str(models["plain"]))
        assert str(info.value).startswith(f"anchor_reference={value!r}") and "\n" not in str(info.value)
