"""Helpers for the tests that run TRL's real `SFTTrainer` with our loss (tests/trl/): configs and trainers on the tiny
models, the per-step logs, batches built by the trainer's own collator, a LoRA config. Import only after
`pytest.importorskip("trl")`; the tiny models and data are the `models` / `data` fixtures of tests/trl/conftest.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_ext.config import DistMatchSFTConfig
from trl_ext.losses import LOSS_NAMES
from trl_ext.model_forward import LossRequest
from trl_ext.trainer import DistMatchSFTTrainer

#: Every loss of the registry (a new loss is trained by the parametrized trainer tests without editing a list).
OUR_LOSSES = tuple(LOSS_NAMES)
TRL_VERSION = trl.__version__

# One plain SGD step, no clipping, fixed order: parameter deltas are the gradients (reduction and resume tests).
SGD = {
    "optim": "sgd",
    "learning_rate": 1.0,  # large, so the update is far above float32 rounding of the weights
    "lr_scheduler_type": "constant",
    "max_grad_norm": 1e9,  # clipping computed (grad_norm logged) but never applied
    "train_sampling_strategy": "sequential",
    "max_steps": 1,
}


def load_model(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def make_config(tmp_path: Path, config_cls: type = DistMatchSFTConfig, **overrides: Any) -> Any:
    kwargs: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "logging_steps": 1,
        "max_length": 64,
        "seed": 0,
        "use_cpu": True,
        "bf16": False,  # TRL >= 1.10 defaults to bf16 autocast (also on CPU); exact comparisons need fp32
        "report_to": "none",
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    # TRL's default (True) is kept where a test says so; transformers >= 5.2x renamed the field
    fields = {f.name for f in dataclasses.fields(config_cls)}
    if not {"activation_checkpointing", "gradient_checkpointing"} & set(overrides):
        kwargs[
            "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
        ] = False
    kwargs.update(overrides)
    return config_cls(**kwargs)


def make_trainer(
    model_dir: Path,
    data: dict[str, Any],
    tmp_path: Path,
    *,
    trainer_cls: type = DistMatchSFTTrainer,
    config_cls: type = DistMatchSFTConfig,
    model: torch.nn.Module | None = None,
    with_eval: bool = False,
    trainer_kwargs: dict[str, Any] | None = None,
    **overrides: Any,
) -> Any:
    args = make_config(tmp_path, config_cls, **overrides)
    return trainer_cls(
        model=load_model(model_dir) if model is None else model,
        args=args,
        train_dataset=data["train"],
        eval_dataset=data["eval"] if with_eval else None,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        **(trainer_kwargs or {}),
    )


def step_logs(trainer: Any) -> list[dict[str, float]]:
    """The per-step training logs (logging_steps=1), without the final summary."""
    return [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]


def rel_close(got: float, want: float, rtol: float) -> bool:
    return abs(got - want) <= rtol * max(abs(want), 1e-12)


def assert_logs_match(ours: list[dict], theirs: list[dict], first_rtol: float, later_rtol: float) -> None:
    assert len(ours) == len(theirs) >= 2
    for step, (a, b) in enumerate(zip(ours, theirs)):
        rtol = first_rtol if step == 0 else later_rtol
        for key in ("loss", "grad_norm"):
            assert rel_close(a[key], b[key], rtol), (
                f"step {step + 1} {key}: ours {a[key]!r} vs TRL {b[key]!r}"
            )


def collate(trainer: Any, indices: list[int]) -> dict[str, torch.Tensor]:
    """A batch built by the trainer's own collator from its prepared (tokenized) train dataset."""
    keep = ("input_ids", "labels", "completion_mask", "assistant_masks", "seq_lengths")
    examples = [{k: v for k, v in trainer.train_dataset[i].items() if k in keep} for i in indices]
    return dict(trainer.data_collator(examples))


def loss_of(trainer: Any, batch: dict[str, torch.Tensor], num_items_in_batch: Any = None) -> float:
    with torch.no_grad():
        return trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=num_items_in_batch).item()


def request_params(request: LossRequest) -> dict[str, Any]:
    params = dict(request.params)
    if request.name == "emo":
        params["cost_embedding"] = request.cost_embedding
    return params


def lora_config(target_modules: list[str], *, random_init: bool = False) -> Any:
    peft = pytest.importorskip("peft")
    return peft.LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=target_modules,
        task_type="CAUSAL_LM",
        init_lora_weights=not random_init,  # False: random A and B, so the adapter changes the outputs now
    )
