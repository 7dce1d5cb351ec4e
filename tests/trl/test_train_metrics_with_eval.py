"""The logged training metrics of a run with an evaluation set: each step's `ce`, `entropy`, `mean_token_accuracy`
and `demd` are those of that step's training batch only (evaluation batches in between must not leak into them), and
the evaluation's are logged with the `eval_` prefix and are those of the evaluation batches.

Real `DistMatchSFTTrainer` runs (EMO, evaluation every step) with learning rate 0, so the weights never change and
every batch's expected statistics come from the initial model: its own full forward (`model(...).logits`) with plain
torch cross-entropy / softmax and the float64 EMO oracle's DEMD (tests/helpers/loss_oracles.py), on batches built by
the trainer's own collator in the order of its sequential sampler.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("trl")

from tests.helpers.loss_oracles import oracle  # noqa: E402
from tests.helpers.sft import load_model, make_trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

BATCH, STEPS = 4, 3
KEYS = ("ce", "entropy", "mean_token_accuracy", "demd")


def _stats(model: torch.nn.Module, trainer, dataset, indices: list[int]) -> dict[str, float]:
    """Token-mean statistics of one collated batch, from the model's own logits."""
    keep = ("input_ids", "labels", "completion_mask", "assistant_masks")
    batch = trainer.data_collator([{k: v for k, v in dataset[i].items() if k in keep} for i in indices])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, :-1].reshape(-1, logits.shape[-1]).double()
    targets = batch["labels"][:, 1:].reshape(-1)
    valid = targets != -100
    z, y = logits[valid], targets[valid]
    log_p = torch.log_softmax(z, dim=-1)
    cost = model.get_output_embeddings().weight.detach()
    return {
        "tokens": int(batch["attention_mask"].sum()),
        "ce": F.cross_entropy(z, y).item(),
        "entropy": (-(log_p.exp() * log_p).sum(-1)).mean().item(),
        "mean_token_accuracy": (z.argmax(-1) == y).double().mean().item(),
        "demd": oracle("emo", z, y, cost_embedding=cost).demd.mean().item(),
    }


def test_train_metrics_count_training_batches_only(models, data, tmp_path):
    evaluation = data["train"].select(range(40, 48))  # not among the training batches of the 3 steps
    trainer = make_trainer(
        models["plain"],
        {"train": data["train"], "eval": evaluation},
        tmp_path,
        loss="emo",
        with_eval=True,
        optim="sgd",
        learning_rate=0.0,
        lr_scheduler_type="constant",
        train_sampling_strategy="sequential",
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        eval_strategy="steps",
        eval_steps=1,
    )
    trainer.train()
    model = load_model(models["plain"])  # the weights trained with (learning rate 0)

    train_logs = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    eval_logs = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(train_logs) == len(eval_logs) == STEPS
    tokens = 0  # TRL's `num_tokens`: the training tokens seen so far, evaluation batches not included
    for step, log in enumerate(train_logs):
        want = _stats(model, trainer, trainer.train_dataset, list(range(step * BATCH, (step + 1) * BATCH)))
        tokens += want["tokens"]
        assert not [k for k in log if k.startswith("eval_")], log
        assert log["num_tokens"] == tokens
        assert eval_logs[step]["eval_num_tokens"] == tokens
        for key in KEYS:
            assert log[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (
                step + 1,
                key,
                log[key],
                want[key],
            )

    # Evaluation: the mean of its two batches' token means (TRL averages the per-batch values), eval_ prefix only.
    halves = [_stats(model, trainer, trainer.eval_dataset, list(range(i, i + BATCH))) for i in (0, BATCH)]
    for log in eval_logs:
        assert set(log) - {"epoch", "step"} == {
            "eval_loss",
            "eval_runtime",
            "eval_samples_per_second",
            "eval_steps_per_second",
            "eval_num_tokens",
            "eval_nonfinite_tokens",
            *(f"eval_{k}" for k in KEYS),
        }
        for key in KEYS:
            want = (halves[0][key] + halves[1][key]) / 2
            assert log[f"eval_{key}"] == pytest.approx(want, rel=1e-5, abs=1e-7), (
                key,
                log[f"eval_{key}"],
                want,
            )
