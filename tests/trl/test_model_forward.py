"""The patched forward (`trl_ext/model_forward.py`) inside the trainer: the fused path on a plain head, the logits path
when LoRA adapts the LM head, pre-shifted labels, evaluation, a model given as a path.

Tiny random Llamas built in code (`models` / `data` fixtures: tests/trl/conftest.py), local JSONL, no mocks, offline.
Runs in `.venv` (TRL 1.16) and in `.venv-axolotl` (TRL 1.9): the `trl_trainer` marker (set on tests/trl/) selects it in
both (see the Makefile).

Reference values come from `trl_ext.losses.reference_token_loss` on the model's own full logits.
"""

from __future__ import annotations

import math

import pytest
import torch

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from transformers import AutoTokenizer  # noqa: E402

from tests.helpers.sft import (  # noqa: E402
    collate,
    load_model,
    lora_config,
    loss_of,
    make_config,
    make_trainer,
    rel_close,
    request_params,
    step_logs,
)
from trl_ext.losses import reference_token_loss  # noqa: E402
from trl_ext.model_forward import LossRequest, install_loss_forward  # noqa: E402
from trl_ext.trainer import DistMatchSFTTrainer  # noqa: E402

# trl_trainer is set on tests/trl/ by tests/placement.py.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


# ---------------------------------------------------------------------------------------------------------
# Fused vs logits path


def _direct_per_token(base_model, batch, request):
    out = base_model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        labels=batch["labels"],
        distmatch_loss=request,
    )
    return out


def _reference_per_token(model, batch, request):
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:]
    flat = logits[:, :-1].reshape(-1, logits.shape[-1])
    ref = reference_token_loss(request.name, flat, targets.reshape(-1), **request_params(request))
    return ref.view(targets.shape)


@pytest.mark.parametrize("loss", ["gem_ls", "emo"])
@pytest.mark.parametrize("lora_targets", [None, ["q_proj", "v_proj"]], ids=["plain", "lora_qv"])
def test_plain_head_uses_fused_path_and_matches_reference(models, data, tmp_path, loss, lora_targets):
    kwargs = {"peft_config": lora_config(lora_targets, random_init=True)} if lora_targets else {}
    trainer = make_trainer(models["plain"], data, tmp_path, loss=loss, trainer_kwargs=kwargs)
    base = trainer.model.get_base_model() if lora_targets else trainer.model
    batch = collate(trainer, [0, 1, 2])
    with torch.no_grad():
        out = _direct_per_token(base, batch, trainer.distmatch_request)
    assert out.path == "fused"
    assert out.per_token_loss.shape == batch["labels"][:, 1:].shape
    assert torch.equal(out.label_mask, batch["labels"][:, 1:] != -100)
    ref = _reference_per_token(trainer.model, batch, trainer.distmatch_request)
    torch.testing.assert_close(out.per_token_loss, ref, rtol=1e-5, atol=1e-6)
    if lora_targets:  # the random adapter matters: the base model alone gives other values
        with trainer.model.disable_adapter():
            no_adapter = _reference_per_token(trainer.model, batch, trainer.distmatch_request)
        assert not torch.allclose(no_adapter, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("loss", ["gem_ls", "emo"])
def test_lora_on_lm_head_uses_logits_path(models, data, loss):
    """The patched forward on a PEFT model whose head carries an adapter: logits path, adapter included."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        load_model(models["plain"]), lora_config(["q_proj", "v_proj", "lm_head"], random_init=True)
    )
    base = model.get_base_model()
    install_loss_forward(base)
    params = {"beta": 0.7} if loss == "gem_ls" else {"weighting": "emo1"}
    cost = base.get_output_embeddings().weight.detach().clone() if loss == "emo" else None
    request = LossRequest(name=loss, params=params, cost_embedding=cost)
    tokenizer = AutoTokenizer.from_pretrained(models["plain"])
    enc = tokenizer(["the river under the old bridge", "write a poem"], padding=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}
    with torch.no_grad():
        out = _direct_per_token(base, batch, request)
    assert out.path == "logits"
    ref = _reference_per_token(model, batch, request)
    torch.testing.assert_close(out.per_token_loss, ref, rtol=1e-5, atol=1e-6)
    with model.disable_adapter():
        assert not torch.allclose(_reference_per_token(model, batch, request), ref, rtol=1e-4, atol=1e-5)


def test_live_cost_embedding_with_lora_on_lm_head_is_the_adapted_head(models, data):
    """`emo_cost_embedding: live` with a LoRA adapter on the head: the cost embedding is W + BA (the head the
    model applies), not the frozen base W that the LoRA layer's `.weight` shows."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        load_model(models["plain"]), lora_config(["q_proj", "v_proj", "lm_head"], random_init=True)
    )
    base = model.get_base_model()
    install_loss_forward(base)
    head = base.get_output_embeddings()
    adapted = (head.base_layer.weight + head.get_delta_weight("default")).detach()
    assert not torch.allclose(adapted, head.weight.detach(), atol=1e-4)  # the adapter moves the head
    tokenizer = AutoTokenizer.from_pretrained(models["plain"])
    enc = tokenizer(["the river under the old bridge", "write a poem"], padding=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}
    live = LossRequest(name="emo", params={"weighting": "emo2"}, live_cost=True)
    with torch.no_grad():
        out = _direct_per_token(base, batch, live)
    assert out.path == "logits"
    want = _reference_per_token(
        model, batch, LossRequest(name="emo", params={"weighting": "emo2"}, cost_embedding=adapted)
    )
    stale = _reference_per_token(
        model,
        batch,
        LossRequest(name="emo", params={"weighting": "emo2"}, cost_embedding=head.weight.detach()),
    )
    torch.testing.assert_close(out.per_token_loss, want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(out.per_token_loss, stale, rtol=1e-4, atol=1e-5)


def test_trainer_with_lora_on_lm_head_trains_through_logits_path(models, data, tmp_path):
    """PEFT on `lm_head` is a documented logits-path case (docs/distributed.md), so the trainer must accept and train it."""
    config = lora_config(["q_proj", "v_proj", "lm_head"])
    trainer = make_trainer(
        models["plain"], data, tmp_path, loss="gem_ls", trainer_kwargs={"peft_config": config}
    )
    head_b = {
        n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lm_head" in n and "lora_B" in n
    }
    assert head_b
    batch = collate(trainer, [0, 1])
    with torch.no_grad():
        out = _direct_per_token(trainer.model.get_base_model(), batch, trainer.distmatch_request)
    assert out.path == "logits"
    trainer.train()
    assert all(math.isfinite(log["loss"]) for log in step_logs(trainer))
    params = dict(trainer.model.named_parameters())
    assert all(not torch.equal(params[n].detach(), before) for n, before in head_b.items())


def test_pre_shifted_labels_are_used_as_given(models, data, tmp_path):
    """`shift_labels` (context / sequence parallelism) are targets already aligned with the positions."""
    trainer = make_trainer(models["plain"], data, tmp_path, loss="gem_linear")
    batch = collate(trainer, [0, 1, 2])
    shifted = torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=-100)
    common = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        from_labels = trainer.model(
            **common, labels=batch["labels"], distmatch_loss=trainer.distmatch_request
        )
        from_shift = trainer.model(**common, shift_labels=shifted, distmatch_loss=trainer.distmatch_request)
    assert from_shift.per_token_loss.shape == shifted.shape
    torch.testing.assert_close(
        from_shift.per_token_loss[:, :-1], from_labels.per_token_loss, rtol=1e-6, atol=1e-7
    )
    assert (from_shift.per_token_loss[:, -1] == 0).all()
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, {**common, "labels": batch["labels"], "shift_labels": shifted})
    assert rel_close(loss.item(), loss_of(trainer, batch), 1e-6)


def test_evaluation_uses_the_fused_path_only(models, data, tmp_path):
    """Loss-only evaluation: one backbone forward per batch and no full-logits LM head call."""
    trainer = make_trainer(models["plain"], data, tmp_path, loss="gem_ls", with_eval=True)
    calls = {"backbone": 0, "lm_head": 0}

    def count(name):
        def hook(module, args, output):
            calls[name] += 1

        return hook

    handles = [
        trainer.model.model.register_forward_hook(count("backbone")),
        trainer.model.lm_head.register_forward_hook(count("lm_head")),
    ]
    try:
        metrics = trainer.evaluate()
    finally:
        for handle in handles:
            handle.remove()
    batches = math.ceil(len(data["eval"]) / trainer.args.per_device_eval_batch_size)
    assert "eval_loss" in metrics and "eval_ce" in metrics
    assert calls == {"backbone": batches, "lm_head": 0}, calls


def test_evaluation_with_compute_metrics_gets_the_models_logits(models, data, tmp_path):
    seen = {}

    def compute_metrics(prediction):
        seen["shape"] = tuple(prediction.predictions.shape)
        return {"vocab": float(prediction.predictions.shape[-1])}

    trainer = make_trainer(
        models["plain"],
        data,
        tmp_path,
        loss="emo",
        with_eval=True,
        trainer_kwargs={"compute_metrics": compute_metrics},
    )
    with_logits = trainer.evaluate()
    trainer.compute_metrics = None
    loss_only = trainer.evaluate()
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    assert with_logits["eval_vocab"] == vocab and seen["shape"][0] == len(data["eval"])
    assert rel_close(with_logits["eval_loss"], loss_only["eval_loss"], 1e-6)
    assert rel_close(with_logits["eval_ce"], loss_only["eval_ce"], 1e-6)


def test_model_given_as_a_path(models, data, tmp_path):
    args = make_config(tmp_path, loss="gem_ls")
    trainer = DistMatchSFTTrainer(model=str(models["plain"]), args=args, train_dataset=data["train"])
    assert trainer.distmatch_request is not None
    trainer.train()
    assert len(step_logs(trainer)) == 2 and all("ce" in log for log in step_logs(trainer))
