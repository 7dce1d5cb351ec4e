"""EMO's cost embedding (`trl_ext/cost_embedding/`): where it comes from (frozen, live, another model's checkpoint),
its checks (the one vocabulary check, the source read from config.json and the safetensors header, non-finite rows),
how it is read (the frozen copy, the live head with a LoRA adapter through peft's public API, the shard holding
another model's output embedding) and what training does with it (gradients against the reference, resume).

Tiny random Llamas built in code (`models` / `data` fixtures: tests/trl/conftest.py; sharded checkpoints built here),
local JSONL, no mocks, offline. Runs in `.venv` (TRL 1.16) and in `.venv-axolotl` (TRL 1.9): the `trl_trainer` marker
(set on tests/trl/) selects it in both (see the Makefile).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from safetensors import safe_open  # noqa: E402

from distmatch.errors import DistMatchConfigError  # noqa: E402
from tests.helpers.sft import (  # noqa: E402
    SGD,
    collate,
    load_model,
    make_trainer,
    request_params,
    step_logs,
)
from tests.helpers.tiny_model import build_tiny_llama  # noqa: E402
from trl_ext.cost_embedding import (  # noqa: E402
    HUB_ID,
    check_configured,
    check_cost_embedding_source,
    check_vocabulary,
    frozen_head_copy,
    live_head_weight,
    read_output_embedding,
    training_vocab_size,
)
from trl_ext.losses import reference_token_loss  # noqa: E402

# trl_trainer is set on tests/trl/ by tests/placement.py.
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


# ---------------------------------------------------------------------------------------------------------
# EMO's cost embedding from another model: checked from config.json, read from the shard holding it


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> dict[str, Path]:
    """Tiny Llamas saved as sharded safetensors (index json + several shards), untied in bfloat16 and tied."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("sharded")
    out = {}
    for name, tie, dtype in (("untied", False, torch.bfloat16), ("tied", True, torch.float32)):
        source = build_tiny_llama(root / f"{name}_src", tie=tie, seed=3)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        model.save_pretrained(root / name, max_shard_size="20KB")
        out[name] = root / name
        out[f"{name}_weight"] = model.get_output_embeddings().weight.detach().clone()
    return out


def test_fixture_is_really_sharded(sharded):
    for name in ("untied", "tied"):
        index = json.loads((sharded[name] / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 2


def test_reads_only_the_shard_holding_the_output_embedding(sharded, tmp_path):

    folder = tmp_path / "only_head_shard"
    shutil.copytree(sharded["untied"], folder)
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    keep = weight_map["lm_head.weight"]
    removed = [shard for shard in set(weight_map.values()) if shard != keep]
    for shard in removed:  # every other shard gone: reading them would fail
        (folder / shard).unlink()
    assert removed
    tensor = read_output_embedding(str(folder), vocab_size=sharded["untied_weight"].shape[0])
    assert tensor.dtype == torch.bfloat16  # as stored, not float32
    assert torch.equal(tensor, sharded["untied_weight"])


def test_tied_checkpoint_reads_the_input_embedding(sharded):
    tensor = read_output_embedding(str(sharded["tied"]))
    assert tensor.dtype == torch.float32 and torch.equal(tensor, sharded["tied_weight"])


def test_cost_embedding_source_checked_from_config_json_only(tmp_path):
    """A folder with nothing but config.json: the vocabulary is checked first, then the missing weights refused
    (they would fail only after the trained model loads)."""
    folder = tmp_path / "config_only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 320, "tie_word_embeddings": False}))
    with pytest.raises(DistMatchConfigError, match="has no weight file") as info:
        check_cost_embedding_source(str(folder), 320)
    assert str(info.value).startswith(f"emo_cost_embedding={str(folder)!r}") and "\n" not in str(info.value)
    with pytest.raises(
        DistMatchConfigError, match="vocabulary of 320 tokens but the model being trained has 300"
    ):
        check_cost_embedding_source(str(folder), 300)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DistMatchConfigError, match="has no config.json"):
        check_cost_embedding_source(str(tmp_path / "empty"))


def test_a_head_of_another_vocabulary_than_its_config_is_refused_from_the_header(models, tmp_path):
    """config.json says 300 tokens but the head's tensor has 280 rows (a hand-edited or mixed-up checkpoint): found
    in the safetensors header at configuration time, no tensor data read, naming the tensor and its file."""
    folder = shutil.copytree(models["other_vocab"], tmp_path / "inconsistent")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, vocab_size=300)))
    with pytest.raises(DistMatchConfigError) as info:
        check_cost_embedding_source(str(folder), 300)
    message = str(info.value)
    assert message.startswith(
        f"emo_cost_embedding={str(folder)!r}: its output embedding `lm_head.weight` in "
    )
    assert "model.safetensors has shape (280, " in message and "expected [300, d]" in message


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("meta-llama/Llama-2-13b-hf", True),
        ("gpt2", True),
        ("org/model.v1_2", True),
        ("a/b/c", False),
        ("has space/x", False),
        ("org/-bad", False),
        ("org/bad--name", False),
        ("org/", False),
    ],
)
def test_hub_id_syntax(value, valid):
    assert bool(HUB_ID.match(value)) is valid


def test_hub_id_offline_and_not_cached_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    with pytest.raises(DistMatchConfigError) as err:
        check_cost_embedding_source("distmatch-test/not-cached-model", 300)
    assert "emo_cost_embedding='distmatch-test/not-cached-model'" in str(err.value)
    assert "huggingface-cli download distmatch-test/not-cached-model" in str(err.value)


def test_nonfinite_cost_embedding_is_refused_before_training(models, data, tmp_path):
    other = load_model(models["plain"])
    with torch.no_grad():
        other.get_output_embeddings().weight[[3, 9]] = float("nan")
    other.save_pretrained(tmp_path / "nan_head")
    with pytest.raises(DistMatchConfigError, match=r"non-finite values in 2 row\(s\) \(first: \[3, 9\]\)"):
        make_trainer(
            models["plain"], data, tmp_path, loss="emo", emo_cost_embedding=str(tmp_path / "nan_head")
        ).train()


# ---------------------------------------------------------------------------------------------------------
# The one vocabulary check; the frozen copy; the training model's vocabulary


@pytest.mark.parametrize(
    ("theirs", "ours", "found", "refused"),
    [
        (300, 300, None, None),
        (None, 300, None, None),  # unknown on either side: checked again when the tensor is read
        (300, None, None, None),
        (301, 300, None, "has a vocabulary of 301 tokens but the model being trained has 300"),
        (299, 300, None, "has a vocabulary of 299 tokens"),
        (301, 300, "its output embedding `lm_head.weight` in f has shape (301, 8)", "expected [300, d]"),
    ],
)
def test_one_vocabulary_check(theirs, ours, found, refused):
    if refused is None:
        check_vocabulary("other/model", theirs, ours, found)
        return
    with pytest.raises(DistMatchConfigError) as err:
        check_vocabulary("other/model", theirs, ours, found)
    assert str(err.value).startswith("emo_cost_embedding='other/model'") and refused in str(err.value)


def test_training_vocab_size_of_a_model_a_folder_and_unknowns(models):
    model = load_model(models["other_vocab"])
    assert training_vocab_size(model) == 280 == training_vocab_size(str(models["other_vocab"]))
    assert training_vocab_size(models["plain"]) == 300  # a Path too
    assert training_vocab_size(None) is None and training_vocab_size("owner/hub-model") is None


def test_configured_source_is_checked_against_the_training_models_vocabulary(models):
    """What the TRL config / trainer / CLI and the Axolotl args call: the trained model given as a folder or a model."""
    other = {"emo_cost_embedding": str(models["other_vocab"])}
    for model in (str(models["plain"]), load_model(models["plain"])):
        with pytest.raises(
            DistMatchConfigError, match="vocabulary of 280 tokens but the model being trained has 300"
        ):
            check_configured("emo", other, model)
    check_configured("emo", other, models["other_vocab"])  # the same vocabulary
    check_configured("emo", other)  # the trained model unknown: config.json only
    check_configured("emo", {}, models["plain"])  # not given: the default, 'frozen'
    check_configured("gem_ls", {"emo_cost_embedding": "/no/such/model"}, models["plain"])  # no cost embedding


def test_frozen_head_copy_is_a_detached_copy(models):
    model = load_model(models["plain"])
    head = model.get_output_embeddings().weight
    copy = frozen_head_copy(model)
    assert torch.equal(copy, head.detach()) and not copy.requires_grad and copy.grad_fn is None
    assert copy.data_ptr() != head.data_ptr()
    with torch.no_grad():
        head.add_(1.0)  # the head moves; the copy does not
    assert not torch.equal(copy, head.detach())


# ---------------------------------------------------------------------------------------------------------
# EMO's live cost embedding with a PEFT adapter on the head: the weight the head applies, each adapter state alone


def _adapted_head(models, use_dora: bool = False) -> torch.nn.Module:
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["lm_head"], init_lora_weights=False, use_dora=use_dora
    )
    return peft.get_peft_model(load_model(models["plain"]), config).get_base_model().lm_head


def test_live_head_weight_follows_the_adapter_state(models):
    head = _adapted_head(models)
    base = head.base_layer.weight.detach().clone()
    delta = head.lora_B["default"].weight @ head.lora_A["default"].weight * head.scaling["default"]
    assert delta.abs().max() > 0
    torch.testing.assert_close(live_head_weight(head), base + delta)  # active LoRA: W + BA * scaling
    head.enable_adapters(False)  # disabled alone: the base weight the head now applies
    assert head.disable_adapters
    torch.testing.assert_close(live_head_weight(head), base)
    head.enable_adapters(True)
    head.merge()  # merged alone: the base layer already holds W + BA
    assert head.merged
    torch.testing.assert_close(live_head_weight(head), base + delta)


def test_live_cost_embedding_with_dora_on_the_head_is_refused(models):
    with pytest.raises(DistMatchConfigError, match="DoRA's effective head weight is not W \\+ BA"):
        live_head_weight(_adapted_head(models, use_dora=True))


def test_live_cost_embedding_with_dora_on_the_head_is_refused_when_the_trainer_is_built(
    models, data, tmp_path
):
    """Before any training step: the check runs when the loss is set up, not only at the first forward."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "lm_head"], use_dora=True)
    with pytest.raises(DistMatchConfigError, match="DoRA's effective head weight is not W \\+ BA"):
        make_trainer(
            models["plain"],
            data,
            tmp_path,
            loss="emo",
            emo_cost_embedding="live",
            trainer_kwargs={"peft_config": config},
        )


def test_live_cost_embedding_with_another_adapter_kind_on_the_head_is_refused(models):
    """An active IA3 adapter scales the head's output: its effective weight is not W, so it is not read as W."""
    peft = pytest.importorskip("peft")
    config = peft.IA3Config(target_modules=["lm_head"], feedforward_modules=[], init_ia3_weights=False)
    head = peft.get_peft_model(load_model(models["plain"]), config).get_base_model().lm_head
    with pytest.raises(DistMatchConfigError, match="peft 'ia3' adapter on the LM head: only a LoRA adapter"):
        live_head_weight(head)
    head.enable_adapters(False)  # disabled: the head applies its base weight, which is read
    torch.testing.assert_close(live_head_weight(head), head.get_base_layer().weight)


def test_live_head_weight_of_a_plain_head_is_its_weight(models):
    head = load_model(models["plain"]).get_output_embeddings()
    assert live_head_weight(head) is head.weight
