"""`DistMatchTrainer` (`axolotl_distmatch/trainer.py`) training through Axolotl itself (0.19 and 0.21), on CPU, offline.

Real runs, no mocks: a tiny random Llama built in code (`trl_ext.testing`), local JSONL data, `sample_packing: true`
with `multipack_real_batches: false` (the flash-attention row layout: one `[1, micro_batch_size * sequence_len]`
row), gradient accumulation 2 and LoRA. One `axolotl train` subprocess (GEM-LS, Alpaca data with
`train_on_inputs: true`, so packed rows have cross-document targets to mask, plus evaluation), and the other losses
in-process (Axolotl's own `tests/e2e` pattern: prepare_plugins -> validate_config -> normalize_config ->
load_datasets -> train). The trainer writes what the loss saw to `DISTMATCH_DEBUG_TOKEN_COUNTS`; the tests
recount the trainable shifted labels from the raw collated batches.

Runs in `.venv-axolotl` (Axolotl 0.19) and `.venv-axolotl-latest` (Axolotl 0.21) (`make test`: `axolotl_env`, set on
tests/axolotl/ by tests/conftest.py); skipped where Axolotl is not installed. Shared parts: tests/helpers/axolotl_cases.py.
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # axolotl_env: tests/placement.py

axolotl = pytest.importorskip("axolotl")

import yaml  # noqa: E402
from axolotl.common.datasets import load_datasets  # noqa: E402
from axolotl.train import train  # noqa: E402
from axolotl.utils.config import normalize_config, prepare_plugins, validate_config  # noqa: E402
from axolotl.utils.dict import DictDefault  # noqa: E402

from axolotl_distmatch.trainer import DEBUG_ENV, DistMatchTrainer  # noqa: E402
from tests.helpers.axolotl_cases import (  # noqa: E402
    PLUGIN,
    alpaca_dataset,
    check_token_counts,
    cross_document_targets,
    printed_logs,
    tiny_config,
)
from trl_ext.options import DISTMATCH_LOSSES  # noqa: E402

# ---------------------------------------------------------------------------------------------------------
# Training


def test_axolotl_train_cli_gem_ls_packed_lora_ga2(assets, tmp_path) -> None:
    """`axolotl train cfg.yml --launcher python` with the plugin: Alpaca data trained on inputs too, so packed rows
    hold cross-document targets; they are masked before the tokens are counted. Evaluation runs once."""
    out = tmp_path / "out"
    cfg = tiny_config(
        assets,
        out,
        datasets=alpaca_dataset(assets),
        train_on_inputs=True,
        val_set_size=0.1,
        eval_strategy="steps",
        eval_steps=2,
    )
    config_path = tmp_path / "cfg.yml"
    config_path.write_text(yaml.safe_dump(cfg))
    counts = tmp_path / "counts.jsonl"
    env = dict(os.environ, **{DEBUG_ENV: str(counts)})
    axolotl_cli = Path(sys.executable).parent / "axolotl"
    result = subprocess.run(
        [str(axolotl_cli), "train", str(config_path), "--launcher", "python"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f"Plugin loaded successfully: {PLUGIN}" in output

    seen = check_token_counts(counts, steps=2)
    assert sum(cross_document_targets(b) for b in seen["batches"]) > 0  # there was something to mask
    evals = [r for r in seen["records"] if r["event"] == "loss" and r["mode"] == "eval"]
    assert evals and all(r["num_items_in_batch"] == r["local_items"] > 0 for r in evals)

    logs = printed_logs(output)
    train_logs = [entry for entry in logs if "loss" in entry]
    assert len(train_logs) == 2
    for entry in train_logs:
        assert math.isfinite(entry["loss"])
        assert {"ce", "entropy", "mean_token_accuracy"} <= set(entry) and "ppl" not in entry
        assert 0 < entry["ce"] < 10 and 0 <= entry["mean_token_accuracy"] <= 1
    evaluations = [entry for entry in logs if "eval_loss" in entry]
    assert evaluations
    for evaluation in evaluations:
        assert {"eval_ce", "eval_entropy", "eval_mean_token_accuracy"} <= set(evaluation)
        assert "eval_ppl" not in evaluation and math.isfinite(evaluation["eval_loss"])
    assert (out / "adapter_model.safetensors").exists()


def train_in_process(cfg: dict[str, Any]) -> tuple[Any, Any]:
    """Axolotl's own e2e pattern: prepare_plugins -> validate_config -> normalize_config -> load_datasets -> train."""
    config = DictDefault(copy.deepcopy(cfg))
    prepare_plugins(config)
    config = validate_config(config)
    normalize_config(config)
    model, _, trainer = train(cfg=config, dataset_meta=load_datasets(cfg=config))
    return model, trainer


#: Full fine-tuning (no adapter) with plain SGD: the update is the gradient, and the LM head moves.
FULL_SGD = {
    "adapter": None,
    "lora_r": None,
    "lora_alpha": None,
    "lora_dropout": None,
    "lora_target_linear": None,
    "lora_mlp_kernel": None,
    "lora_qkv_kernel": None,
    "lora_o_kernel": None,
    "optimizer": "sgd",
    "learning_rate": 1.0,
    "lr_scheduler": "constant",
    "warmup_steps": 0,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0e9,
}


@pytest.mark.parametrize("loss", [name for name in DISTMATCH_LOSSES if name != "gem_ls"])
def test_every_loss_trains_in_process(assets, tmp_path, monkeypatch, loss) -> None:
    """The other losses, in-process (gem_ls runs through the CLI above): 2 steps each, packed, GA 2, LoRA, on
    Alpaca data trained on inputs too, so the packed rows hold cross-document targets that must not be counted."""
    counts = tmp_path / "counts.jsonl"
    monkeypatch.setenv(DEBUG_ENV, str(counts))
    cfg = tiny_config(
        assets, tmp_path / "out", loss=loss, datasets=alpaca_dataset(assets), train_on_inputs=True
    )
    model, trainer = train_in_process(cfg)

    assert isinstance(trainer, DistMatchTrainer) and type(trainer).distmatch_loss == loss
    assert trainer.model_accepts_loss_kwargs is True  # Axolotl 0.19 sets it to False for every causal LM
    assert trainer.distmatch_request is not None and trainer.distmatch_request.name == loss
    assert hasattr(model, "peft_config")  # LoRA
    assert trainer.state.global_step == 2
    seen = check_token_counts(counts, steps=2)
    assert sum(cross_document_targets(b) for b in seen["batches"]) > 0  # there was something to mask
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2
    expected_keys = {"ce", "entropy", "mean_token_accuracy"} | ({"demd"} if loss == "emo" else set())
    expected_keys |= {"kl"} if loss in ("asft", "sft_kl") else set()  # the KL to the reference, per step
    for entry in logged:
        assert math.isfinite(entry["loss"]) and expected_keys <= set(entry) and "ppl" not in entry
    if loss == "ce":  # the objective is then the cross-entropy of the same tokens
        assert logged[0]["loss"] == pytest.approx(logged[0]["ce"], rel=5e-3)


def _head_and_update(model: Any, initial: dict[str, Any]) -> dict[str, Any]:
    return {n: p.detach() - initial[n] for n, p in model.named_parameters()}


def test_gradient_accumulation_equals_one_larger_batch(assets, tmp_path) -> None:
    """gem_ls, unpacked, the same 4 Alpaca rows in order: micro-batch 4 x GA 1 and 2 x GA 2 give the same loss and
    the same SGD update (the loss is divided by the window's token count, not averaged per micro-batch)."""
    import torch
    from transformers import AutoModelForCausalLM

    initial = {
        n: p.detach().clone()
        for n, p in AutoModelForCausalLM.from_pretrained(
            assets["model"], dtype=torch.float32
        ).named_parameters()
    }
    common = dict(
        FULL_SGD,
        loss="gem_ls",
        datasets=alpaca_dataset(assets),
        sample_packing=False,
        curriculum_sampling=True,  # sequential order
        max_steps=1,
    )
    runs = {}
    for name, (micro, accumulation) in {"ga1": (4, 1), "ga2": (2, 2)}.items():
        cfg = tiny_config(
            assets,
            tmp_path / name,
            micro_batch_size=micro,
            gradient_accumulation_steps=accumulation,
            **common,
        )
        model, trainer = train_in_process(cfg)
        assert trainer.state.global_step == 1
        (log,) = [entry for entry in trainer.state.log_history if "loss" in entry]
        runs[name] = (log, _head_and_update(model, initial))
    (log1, delta1), (log2, delta2) = runs["ga1"], runs["ga2"]
    assert log2["loss"] == pytest.approx(log1["loss"], rel=1e-5), (log1, log2)
    assert log2["grad_norm"] == pytest.approx(log1["grad_norm"], rel=1e-5), (log1, log2)
    num = math.sqrt(sum(float((delta2[n] - delta1[n]).pow(2).sum()) for n in delta1))
    den = math.sqrt(sum(float(delta1[n].pow(2).sum()) for n in delta1))
    assert den > 1e-3 and num / den < 1e-4, (num, den)


def test_emo_resume_keeps_the_pretrained_cost_embedding(assets, tmp_path) -> None:
    """EMO's frozen cost embedding is the *pre-trained* head also when training resumes from a checkpoint whose
    head has moved (full fine-tuning); it is not saved in the checkpoint."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    pretrained = (
        AutoModelForCausalLM.from_pretrained(assets["model"], dtype=torch.float32)
        .get_output_embeddings()
        .weight.detach()
    )
    out = tmp_path / "out"
    common = dict(
        FULL_SGD, loss="emo", learning_rate=0.5, datasets=alpaca_dataset(assets), train_on_inputs=True
    )
    _, first = train_in_process(
        tiny_config(assets, out, max_steps=2, save_strategy="steps", save_steps=2, **common)
    )
    assert torch.equal(first.distmatch_request.cost_embedding, pretrained)
    checkpoint = out / "checkpoint-2"
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        saved_head = f.get_tensor("lm_head.weight")
        assert all("cost" not in key for key in f.keys())
    # the head moved: the test can tell them apart
    assert not torch.allclose(saved_head, pretrained, atol=1e-4)

    model, resumed = train_in_process(
        tiny_config(assets, out, max_steps=3, resume_from_checkpoint=str(checkpoint), **common)
    )
    assert resumed.state.global_step == 3
    assert torch.equal(resumed.distmatch_request.cost_embedding, pretrained)
    assert not torch.equal(model.get_output_embeddings().weight.detach(), pretrained)


def test_train_metrics_with_evaluation_are_the_training_batches(assets, tmp_path) -> None:
    """Evaluation (before the first step and after it) does not change the logged training metrics: with learning
    rate 0 (the weights never change) the step's `ce` / `entropy` / `mean_token_accuracy` / `demd` equal those of the
    same run without evaluation, so no evaluation batch is averaged into them; the evaluation's carry `eval_`."""
    from axolotl.integrations.base import PluginManager

    keys = ("ce", "entropy", "mean_token_accuracy", "demd")
    common = dict(FULL_SGD, learning_rate=0.0, loss="emo", val_set_size=0.1, max_steps=1)
    logs = {}
    for name, evaluation in (
        (
            "plain",
            {},
        ),  # no eval_strategy: Axolotl 0.19 evaluates at the start of any other strategy, even "no"
        ("eval", {"eval_strategy": "steps", "eval_steps": 1}),
    ):
        PluginManager.get_instance().plugins.clear()
        _, trainer = train_in_process(tiny_config(assets, tmp_path / name, **common, **evaluation))
        logs[name] = trainer.state.log_history
    train = {
        name: [h for h in history if "loss" in h and "train_runtime" not in h]
        for name, history in logs.items()
    }
    evaluations = [h for h in logs["eval"] if "eval_loss" in h]
    assert len(train["plain"]) == len(train["eval"]) == 1 and len(evaluations) >= 2
    # Axolotl evaluates before the first step too: an evaluation lies between the start and the training log; the
    # run without evaluation has none before it.
    assert "eval_loss" in logs["eval"][0] and "loss" not in logs["eval"][0]
    assert "loss" in logs["plain"][0]
    for plain, with_eval in zip(train["plain"], train["eval"]):
        assert not [k for k in with_eval if k.startswith("eval_")], with_eval
        for key in keys:
            assert with_eval[key] == pytest.approx(plain[key], rel=1e-6), (key, with_eval[key], plain[key])
    for evaluation in evaluations:
        assert {f"eval_{k}" for k in keys} <= set(evaluation) and not set(keys) & set(evaluation), evaluation
