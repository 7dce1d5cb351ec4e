"""EMO's cost embedding in training (`trl_ext/emo_cost.py`, `trl_ext/trainer.py`): frozen, live, from another model,
rejected when unusable; gradients against the reference.

Tiny random Llamas built in code (`models` / `data` fixtures: tests/trl/conftest.py), local JSONL, no mocks, offline.
Runs in `.venv` (TRL 1.16) and in `.venv-axolotl` (TRL 1.9): the `trl_trainer` marker (set on tests/trl/) selects it in
both (see the Makefile).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from safetensors import safe_open  # noqa: E402

from tests.helpers.sft import (  # noqa: E402
    SGD,
    collate,
    load_model,
    make_trainer,
    request_params,
    step_logs,
)
from trl_ext.losses import reference_token_loss  # noqa: E402

# trl_trainer is set on tests/trl/ by tests/conftest.py (FOLDER_MARKERS).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


# ---------------------------------------------------------------------------------------------------------
# EMO's cost embedding


def test_emo_frozen_cost_embedding_is_fixed_unoptimised_and_not_saved(models, data, tmp_path):
    trainer = make_trainer(
        models["plain"], data, tmp_path, loss="emo", max_steps=2, save_strategy="steps", save_steps=2
    )
    head = trainer.model.get_output_embeddings().weight
    initial = head.detach().clone()
    request = trainer.distmatch_request
    cost = request.cost_embedding
    assert request.name == "emo" and not request.live_cost and cost is not None
    assert torch.equal(cost, initial) and cost.data_ptr() != head.data_ptr() and not cost.requires_grad
    trainer.train()

    assert torch.equal(trainer.distmatch_request.cost_embedding, initial)  # unchanged by training
    assert not torch.equal(head.detach(), initial)  # while the head moved
    optimised = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert all(p is not cost and p.data_ptr() != cost.data_ptr() for p in optimised)
    state = trainer.model.state_dict()
    assert all(t.data_ptr() != cost.data_ptr() for t in state.values())

    checkpoint = Path(trainer.args.output_dir) / "checkpoint-2" / "model.safetensors"
    assert checkpoint.is_file(), sorted(p.name for p in checkpoint.parent.parent.iterdir())
    with safe_open(str(checkpoint), "pt") as f:
        keys = set(f.keys())
        saved_head = f.get_tensor("lm_head.weight")
        saved_numel = sum(math.prod(f.get_slice(k).get_shape()) for k in keys)
    assert keys == set(state), keys ^ set(state)
    assert saved_numel == sum(t.numel() for t in state.values())
    torch.testing.assert_close(saved_head, head.detach())
    assert not torch.equal(saved_head, initial)


def _parameter_grads(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_trainer_gradients_match_reference(models, data, tmp_path, weighting):
    """Gradients, not only values (emo1's value equals CE whatever its DEMD term): what the trainer's
    `compute_loss` sends into every parameter equals the reference EMO on the model's full logits, reduced by the
    token count, and differs from CE's."""
    trainer = make_trainer(models["plain"], data, tmp_path, loss="emo", emo_weighting=weighting)
    model, request = trainer.model, trainer.distmatch_request
    batch = collate(trainer, [0, 1, 2])
    ours = _parameter_grads(model, trainer.compute_loss(model, dict(batch)))
    assert len(ours) == len(list(model.parameters()))

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:].reshape(-1)
    flat = logits[:, :-1].reshape(-1, logits.shape[-1])
    count = (targets != -100).sum()
    ref = reference_token_loss("emo", flat, targets, **request_params(request)).sum() / count
    expected = _parameter_grads(model, ref)
    for name, grad in expected.items():
        torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    ce = reference_token_loss("ce", logits[:, :-1].reshape(-1, logits.shape[-1]), targets).sum() / count
    ce_grads = _parameter_grads(model, ce)
    head = "lm_head.weight"
    assert not torch.allclose(ce_grads[head], expected[head], rtol=1e-2, atol=1e-6)  # the DEMD term matters


def test_emo_resume_keeps_the_pretrained_cost_embedding(models, data, tmp_path):
    """Resuming from a checkpoint whose head has moved: EMO's frozen cost embedding is still the pre-trained head
    (taken when the trainer is built, before the checkpoint is loaded) and the run continues from the checkpoint."""
    pretrained = load_model(models["plain"]).get_output_embeddings().weight.detach().clone()
    common = {**SGD, "loss": "emo", "save_strategy": "steps", "save_steps": 2, "save_only_model": False}
    first = make_trainer(models["plain"], data, tmp_path, **{**common, "max_steps": 2})
    first.train()
    checkpoint = Path(first.args.output_dir) / "checkpoint-2"
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        saved_head = f.get_tensor("lm_head.weight")
    assert not torch.allclose(saved_head, pretrained, atol=1e-4)  # the head moved: the two can be told apart

    resumed = make_trainer(models["plain"], data, tmp_path, **{**common, "max_steps": 3})
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 3
    assert step_logs(resumed)[:2] == step_logs(first) and len(step_logs(resumed)) == 3  # steps 1-2 restored
    assert torch.equal(resumed.distmatch_request.cost_embedding, pretrained)
    assert not torch.equal(resumed.model.get_output_embeddings().weight.detach(), pretrained)


def test_emo_live_cost_embedding_trains(models, data, tmp_path):
    trainer = make_trainer(models["plain"], data, tmp_path, loss="emo", emo_cost_embedding="live")
    assert trainer.distmatch_request.live_cost and trainer.distmatch_request.cost_embedding is None
    trainer.train()
    logs = step_logs(trainer)
    assert len(logs) == 2 and all(math.isfinite(log["loss"]) and "demd" in log for log in logs)


def test_emo_cost_embedding_from_another_model(models, data, tmp_path):
    trainer = make_trainer(
        models["plain"], data, tmp_path, loss="emo", emo_cost_embedding=str(models["other_seed"])
    )
    other = load_model(models["other_seed"]).get_output_embeddings().weight.detach()
    own = trainer.model.get_output_embeddings().weight.detach()
    assert torch.equal(trainer.distmatch_request.cost_embedding, other) and not torch.equal(other, own)
    trainer.train()
    assert all(math.isfinite(log["loss"]) for log in step_logs(trainer))


def test_emo_cost_embedding_with_another_vocabulary_is_rejected(models, data, tmp_path):
    with pytest.raises(ValueError, match=r"(?s)280.*300|300.*280") as err:
        make_trainer(
            models["plain"], data, tmp_path, loss="emo", emo_cost_embedding=str(models["other_vocab"])
        )
    assert "vocabulary" in str(err.value)


def test_emo_cost_embedding_unloadable_path_is_rejected(models, data, tmp_path):
    with pytest.raises(ValueError, match="emo_cost_embedding"):
        make_trainer(
            models["plain"], data, tmp_path, loss="emo", emo_cost_embedding=str(tmp_path / "missing")
        )


def test_emo_frozen_with_tied_embeddings(models, data, tmp_path):
    trainer = make_trainer(models["tied"], data, tmp_path, loss="emo")
    model = trainer.model
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    initial = model.get_input_embeddings().weight.detach().clone()
    cost = trainer.distmatch_request.cost_embedding
    assert torch.equal(cost, initial) and cost.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    trainer.train()
    assert all(math.isfinite(log["loss"]) for log in step_logs(trainer))
    assert not torch.equal(model.get_input_embeddings().weight.detach(), initial)
    assert torch.equal(trainer.distmatch_request.cost_embedding, initial)
