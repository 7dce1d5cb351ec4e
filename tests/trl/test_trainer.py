"""`DistMatchSFTTrainer` (`trl_ext/trainer.py`) through TRL's real `SFTTrainer` on CPU: our "ce" / "dft" against
TRL's own losses, the reduction (gradient accumulation, `num_items_in_batch`), packing / padding-free, every loss
training with and without LoRA, and TRL's trainer unchanged without our loss.

Tiny random Llamas built in code (`models` / `data` fixtures: tests/trl/conftest.py), local JSONL, no mocks, offline.
Runs in `.venv` (TRL 1.16) and in `.venv-axolotl` (TRL 1.9): the `trl_trainer` marker (set on tests/trl/) selects it in
both (see the Makefile).

Reference values come from TRL itself (`loss_type="nll"`, same seed, same data order) or from
`trl_ext.losses.reference_token_loss` on the model's own full logits.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from trl import SFTConfig, SFTTrainer  # noqa: E402

from tests.helpers.sft import (  # noqa: E402
    OUR_LOSSES,
    SGD,
    assert_logs_match,
    collate,
    load_model,
    lora_config,
    loss_of,
    make_trainer,
    rel_close,
    step_logs,
)
from trl_ext.config import DistMatchSFTConfig  # noqa: E402
from trl_ext.trainer import DistMatchSFTTrainer  # noqa: E402

# trl_trainer is set on tests/trl/ by tests/placement.py.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


# ---------------------------------------------------------------------------------------------------------
# Our "ce" (fused path) against TRL's own "nll"


@pytest.mark.parametrize(
    "setting",
    [
        {"gradient_accumulation_steps": 1},
        {"gradient_accumulation_steps": 2, "per_device_train_batch_size": 2},
        {"packing": True, "packing_strategy": "bfd"},
    ],
    ids=["ga1", "ga2", "packing_bfd"],
)
def test_ce_matches_trl_nll(models, data, tmp_path, setting):
    common = {"max_steps": 3, "with_eval": True, "gradient_checkpointing": True, **setting}
    theirs = make_trainer(
        models["plain"],
        data,
        tmp_path / "trl",
        trainer_cls=SFTTrainer,
        config_cls=SFTConfig,
        loss_type="nll",
        **common,
    )
    theirs.train()
    ours = make_trainer(models["plain"], data, tmp_path / "ours", loss="ce", **common)
    if setting.get("packing"):
        assert ours.padding_free and "seq_lengths" in ours.train_dataset.column_names  # bfd is padding-free
    assert ours.distmatch_request is not None and ours.distmatch_request.name == "ce"
    ours.train()
    a, b = step_logs(ours), step_logs(theirs)
    assert_logs_match(a, b, first_rtol=1e-5, later_rtol=1e-4)
    # CE logged next to the objective. Like TRL's own `entropy`, metrics are averaged over micro-batches, while
    # `loss` is token-weighted over the accumulation window: equal at GA=1, close at GA=2.
    ce_rtol = 1e-5 if ours.args.gradient_accumulation_steps == 1 else 1e-3
    for step_a, step_b in zip(a, b):
        assert rel_close(step_a["ce"], step_b["loss"], ce_rtol)
        assert step_a["num_tokens"] == step_b["num_tokens"]
        assert rel_close(step_a["entropy"], step_b["entropy"], 1e-4)
        assert step_a["mean_token_accuracy"] == pytest.approx(step_b["mean_token_accuracy"], abs=1e-6)
    ours_eval, trl_eval = ours.evaluate(), theirs.evaluate()
    assert rel_close(ours_eval["eval_loss"], trl_eval["eval_loss"], 1e-5), (ours_eval, trl_eval)
    assert rel_close(ours_eval["eval_ce"], trl_eval["eval_loss"], 1e-5)


@pytest.mark.parametrize(
    "setting",
    [{"gradient_accumulation_steps": 1}, {"packing": True, "packing_strategy": "bfd"}],
    ids=["ga1", "packing_bfd"],
)
def test_dft_matches_trl_dft(models, data, tmp_path, setting):
    """`loss="dft"` (ours, fused and chunked) trains exactly like TRL's own `loss_type="dft"`."""
    common = {"max_steps": 3, "with_eval": True, **setting}
    theirs = make_trainer(
        models["plain"],
        data,
        tmp_path / "trl",
        trainer_cls=SFTTrainer,
        config_cls=SFTConfig,
        loss_type="dft",
        **common,
    )
    theirs.train()
    ours = make_trainer(models["plain"], data, tmp_path / "ours", loss="dft", **common)
    assert ours.distmatch_request is not None and ours.distmatch_request.name == "dft"
    assert ours.args.loss_type == "nll"  # TRL computes nothing of its own
    ours.train()
    a, b = step_logs(ours), step_logs(theirs)
    assert_logs_match(a, b, first_rtol=1e-5, later_rtol=1e-4)
    for step_a, step_b in zip(a, b):
        assert step_a["num_tokens"] == step_b["num_tokens"]
        assert rel_close(step_a["entropy"], step_b["entropy"], 1e-4)
    ours_eval, trl_eval = ours.evaluate(), theirs.evaluate()
    assert rel_close(ours_eval["eval_loss"], trl_eval["eval_loss"], 1e-5), (ours_eval, trl_eval)


def test_bf16_autocast_trains_and_stays_close_to_trl(models, data, tmp_path):
    """TRL >= 1.10 defaults to bf16 autocast, on CPU too; our head math stays fp32, TRL's runs in bf16."""
    theirs = make_trainer(
        models["plain"], data, tmp_path / "trl", trainer_cls=SFTTrainer, config_cls=SFTConfig, bf16=True
    )
    theirs.train()
    ours = make_trainer(models["plain"], data, tmp_path / "ours", loss="ce", bf16=True)
    ours.train()
    for a, b in zip(step_logs(ours), step_logs(theirs), strict=True):  # bf16 gradients: loose
        assert rel_close(a["loss"], b["loss"], 1e-3) and rel_close(a["grad_norm"], b["grad_norm"], 2e-2), (
            a,
            b,
        )
    emo = make_trainer(models["plain"], data, tmp_path / "emo", loss="emo", bf16=True)
    emo.train()
    assert all(math.isfinite(log["loss"]) and math.isfinite(log["demd"]) for log in step_logs(emo))


# ---------------------------------------------------------------------------------------------------------
# Reduction: gradient accumulation, accepts_loss_kwargs=False, average_tokens_across_devices


def _one_sgd_step(models, data, tmp_path, **overrides) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    trainer = make_trainer(models["plain"], data, tmp_path, **{**SGD, **overrides})
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    delta = {n: p.detach() - before[n] for n, p in trainer.model.named_parameters()}
    return step_logs(trainer)[0], delta


def _relative_delta_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = math.sqrt(sum(float((a[n] - b[n]).pow(2).sum()) for n in a))
    den = math.sqrt(sum(float(a[n].pow(2).sum()) for n in a))
    assert den > 0
    return num / den


@pytest.mark.parametrize("average_tokens_across_devices", [True, False])
def test_gradient_accumulation_equals_doubled_batch(models, data, tmp_path, average_tokens_across_devices):
    """gem_ls: batch 4 x GA 1 and batch 2 x GA 2 on the same 4 examples give the same loss and update."""
    common = {"loss": "gem_ls", "average_tokens_across_devices": average_tokens_across_devices}
    log1, delta1 = _one_sgd_step(
        models, data, tmp_path / "ga1", per_device_train_batch_size=4, gradient_accumulation_steps=1, **common
    )
    log2, delta2 = _one_sgd_step(
        models, data, tmp_path / "ga2", per_device_train_batch_size=2, gradient_accumulation_steps=2, **common
    )
    assert rel_close(log2["loss"], log1["loss"], 1e-5), (log1, log2)
    assert rel_close(log2["grad_norm"], log1["grad_norm"], 1e-5), (log1, log2)
    assert log2["num_tokens"] == log1["num_tokens"]
    assert _relative_delta_error(delta2, delta1) < 1e-4
    assert max(float(d.abs().max()) for d in delta1.values()) > 1e-4  # the step did move the weights


def test_average_tokens_across_devices_is_neutral_on_one_process(models, data, tmp_path):
    common = {"loss": "emo", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}
    on, delta_on = _one_sgd_step(models, data, tmp_path / "on", average_tokens_across_devices=True, **common)
    off, delta_off = _one_sgd_step(
        models, data, tmp_path / "off", average_tokens_across_devices=False, **common
    )
    assert rel_close(on["loss"], off["loss"], 1e-6) and rel_close(on["grad_norm"], off["grad_norm"], 1e-6)
    assert _relative_delta_error(delta_on, delta_off) < 1e-6


def test_model_without_loss_kwargs_follows_trl_reduction(models, data, tmp_path):
    """accepts_loss_kwargs=False: no num_items_in_batch, per-micro-batch token means averaged over GA (as TRL)."""

    def run(name, trainer_cls, config_cls, loss_kwargs, **overrides):
        model = load_model(models["plain"])
        model.accepts_loss_kwargs = False
        trainer = make_trainer(
            models["plain"],
            data,
            tmp_path / name,
            trainer_cls=trainer_cls,
            config_cls=config_cls,
            model=model,
            **{**SGD, **loss_kwargs, **overrides},
        )
        assert trainer.model_accepts_loss_kwargs is False
        trainer.train()
        return trainer, step_logs(trainer)[0]

    ga2 = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}
    ours, ours_ga2 = run("ours_ga2", DistMatchSFTTrainer, DistMatchSFTConfig, {"loss": "ce"}, **ga2)
    _, trl_ga2 = run("trl_ga2", SFTTrainer, SFTConfig, {"loss_type": "nll"}, **ga2)
    assert rel_close(ours_ga2["loss"], trl_ga2["loss"], 1e-5), (ours_ga2, trl_ga2)
    assert rel_close(ours_ga2["grad_norm"], trl_ga2["grad_norm"], 1e-5), (ours_ga2, trl_ga2)

    # GA=1: a plain token mean over the whole batch of 4, the same as with accepts_loss_kwargs=True.
    _, ours_ga1 = run("ours_ga1", DistMatchSFTTrainer, DistMatchSFTConfig, {"loss": "ce"})
    normal, _ = _one_sgd_step(models, data, tmp_path / "normal_ga1", loss="ce")
    assert rel_close(ours_ga1["loss"], normal["loss"], 1e-5)
    assert rel_close(ours_ga1["grad_norm"], normal["grad_norm"], 1e-5)

    # And GA=2 is the mean of the two micro-batch token means (not the GA=1 token mean: the counts differ).
    fresh = make_trainer(models["plain"], data, tmp_path / "fresh", loss="ce", **SGD, **ga2)
    first, second = collate(fresh, [0, 1]), collate(fresh, [2, 3])
    means = [loss_of(fresh, b) for b in (first, second)]
    counts = [int((b["labels"][:, 1:] != -100).sum()) for b in (first, second)]
    assert counts[0] != counts[1]
    assert rel_close(ours_ga2["loss"], sum(means) / 2, 1e-5)
    token_mean = (means[0] * counts[0] + means[1] * counts[1]) / sum(counts)
    assert rel_close(normal["loss"], token_mean, 1e-5)
    assert ours.distmatch_request is not None


def test_compute_loss_honours_num_items_in_batch(models, data, tmp_path):
    trainer = make_trainer(models["plain"], data, tmp_path, loss="gem_linear")
    batch = collate(trainer, [0, 1, 2])
    n = int((batch["labels"][:, 1:] != -100).sum())
    mean = loss_of(trainer, batch)
    total = loss_of(trainer, batch, num_items_in_batch=torch.tensor(1))
    assert rel_close(total, mean * n, 1e-5)
    assert rel_close(loss_of(trainer, batch, num_items_in_batch=torch.tensor(2 * n)), mean / 2, 1e-5)


# ---------------------------------------------------------------------------------------------------------
# Packing / padding-free


@pytest.mark.parametrize("loss", ["gem_ls", "emo", "asft"])
def test_padding_free_batch_equals_sum_of_documents(models, data, tmp_path, loss):
    """asft: its reference model (another checkpoint, so the KL is far from 0) runs on the packed batch too and must
    keep to the documents as the policy does."""
    model = load_model(models["plain"])
    extra = {"anchor_reference": str(models["other_seed"])} if loss == "asft" else {}
    with torch.no_grad():  # stronger attention than the random init, so attending across documents shows
        for layer in model.model.layers:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(layer.self_attn, proj).weight.mul_(5.0)
    trainer = make_trainer(
        models["plain"], data, tmp_path, model=model, loss=loss, padding_free=True, max_length=None, **extra
    )
    trainer.model.eval()
    docs = [0, 1, 2, 3]
    packed = collate(trainer, docs)
    assert "attention_mask" not in packed and packed["input_ids"].shape[0] == 1
    positions = packed["position_ids"][0]
    assert int((positions == 0).sum()) == len(docs)
    assert (packed["labels"][0][positions == 0] == -100).all()  # no target crosses a document boundary

    separate = [collate(trainer, [i]) for i in docs]
    want = sum(loss_of(trainer, b, num_items_in_batch=1) for b in separate)
    got = loss_of(trainer, packed, num_items_in_batch=1)
    assert rel_close(got, want, 1e-6), (got, want)
    tokens = sum(int((b["labels"][:, 1:] != -100).sum()) for b in separate)
    assert rel_close(loss_of(trainer, packed), want / tokens, 1e-6)  # local token mean

    # Control: attention across documents (an all-ones mask) changes the value, so the check above can fail.
    crossed = dict(packed, attention_mask=torch.ones_like(packed["input_ids"]))
    assert not rel_close(loss_of(trainer, crossed, num_items_in_batch=1), want, 1e-4)


def test_padding_free_training_equals_padded_training(models, data, tmp_path):
    common = {"loss": "gem_ls", "max_length": None, "max_steps": 2}
    padded = make_trainer(models["plain"], data, tmp_path / "padded", **common)
    padded.train()
    free = make_trainer(models["plain"], data, tmp_path / "free", padding_free=True, **common)
    free.train()
    assert_logs_match(step_logs(free), step_logs(padded), first_rtol=1e-5, later_rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------
# Every loss trains, with and without LoRA; logs and evaluation


@pytest.mark.parametrize(
    ("loss", "options", "params"),
    [
        (
            "tailr",
            {"tailr_variant": "emo_code", "tailr_gamma": 0.9, "tailr_min_weight": 0.3},
            {"variant": "emo_code", "gamma": 0.9, "min_weight": 0.3},
        ),
        ("emo", {"emo_ratio_clamp": 3.0}, {"ratio_clamp": 3.0, "weighting": "emo1"}),
        # the EMO code's language modeling (gpt2.py, mode emo): D with the target's own mass
        ("emo", {"emo_target_mass": "included"}, {"target_mass": "included", "weighting": "emo1"}),
        # Beyond Log Likelihood's OnlyTopLogP-0.001: CE on the tokens with p >= 0.001 (most, not all, at V = 300)
        ("prob", {"prob_q": 0.0, "prob_min_p": 0.001}, {"q": 0.0, "min_p": 0.001, "max_p": 1.0}),
    ],
    ids=["tailr-emo_code", "emo-ratio_clamp", "emo-target_mass_included", "prob-only_top_logp"],
)
def test_paper_variants_train(models, data, tmp_path, loss, options, params):
    """The EMO repository's tvd baseline and its clamped emo mode, trained through TRL from the options."""
    trainer = make_trainer(models["plain"], data, tmp_path, loss=loss, **options)
    assert {k: trainer.distmatch_request.params[k] for k in params} == params
    trainer.train()
    logs = step_logs(trainer)
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) and h["loss"] > 0 for h in logs)


@pytest.mark.parametrize("use_lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("loss", OUR_LOSSES)
def test_every_loss_trains_logs_and_evaluates(models, data, tmp_path, loss, use_lora):
    kwargs = {"peft_config": lora_config(["q_proj", "v_proj"])} if use_lora else {}
    trainer = make_trainer(
        models["plain"],
        data,
        tmp_path,
        loss=loss,
        with_eval=True,
        trainer_kwargs=kwargs,
        gradient_checkpointing=use_lora,  # LoRA with TRL's default activation checkpointing
    )
    watched = {
        n: p.detach().clone()
        for n, p in trainer.model.named_parameters()
        if p.requires_grad and ("lora_B" in n or n.endswith("lm_head.weight"))
    }
    assert watched
    trainer.train()

    logs = step_logs(trainer)
    assert len(logs) == 2
    expected = {"loss", "ce", "entropy", "mean_token_accuracy", "num_tokens"} | (
        {"demd"} if loss == "emo" else set()
    )
    expected |= {"kl"} if loss in ("asft", "sft_kl") else set()  # the KL to the reference model, per step
    for log in logs:
        assert expected <= log.keys(), sorted(log)
        assert all(math.isfinite(log[k]) for k in expected | {"grad_norm"}), log
        assert log["ce"] > 0 and log["entropy"] > 0 and 0 <= log["mean_token_accuracy"] <= 1
    assert logs[1]["num_tokens"] > logs[0]["num_tokens"] > 0
    if loss == "emo":
        assert 0 <= logs[0]["demd"] <= 2
    if loss == "ce":
        assert rel_close(logs[0]["loss"], logs[0]["ce"], 1e-5)

    params = dict(trainer.model.named_parameters())
    for name, before in watched.items():  # gradients reached the trained weights through the patched forward
        assert not torch.equal(params[name].detach(), before), name
    if use_lora:
        base_head = [p for n, p in params.items() if n.endswith("lm_head.weight")]
        assert base_head and not base_head[0].requires_grad

    metrics = trainer.evaluate()
    assert {"eval_loss", "eval_ce", "eval_entropy", "eval_mean_token_accuracy"} <= metrics.keys(), sorted(
        metrics
    )
    if loss == "emo":
        assert "eval_demd" in metrics
    if loss in ("asft", "sft_kl"):
        # ~0 with LoRA after two small steps (the adapter starts at 0), > 0 in full fine-tuning
        assert math.isfinite(metrics["eval_kl"])
    assert (
        math.isfinite(metrics["eval_loss"]) and math.isfinite(metrics["eval_ce"]) and metrics["eval_ce"] > 0
    )


# ---------------------------------------------------------------------------------------------------------
# Without a distmatch loss the trainer is TRL's


@pytest.mark.parametrize("config_cls", [SFTConfig, DistMatchSFTConfig], ids=["SFTConfig", "loss_None"])
def test_without_our_loss_the_trainer_is_trls(models, data, tmp_path, config_cls):
    theirs = make_trainer(
        models["plain"], data, tmp_path / "trl", trainer_cls=SFTTrainer, config_cls=SFTConfig
    )
    theirs.train()
    ours = make_trainer(models["plain"], data, tmp_path / "ours", config_cls=config_cls)
    assert ours.distmatch_request is None
    ours.train()
    a, b = step_logs(ours), step_logs(theirs)
    assert_logs_match(a, b, first_rtol=1e-6, later_rtol=1e-6)
    assert all("ce" not in log and "demd" not in log for log in a)
    assert [sorted(log) for log in a] == [sorted(log) for log in b]


def test_eaft_k_above_the_vocabulary_is_said_once(models, data, tmp_path, caplog):
    """min(eaft_k, V) is legitimate (the entropy over every logit) but not silent: one warning at set-up."""
    import logging

    with caplog.at_level(logging.WARNING, logger="trl_ext.loss_mixin"):
        trainer = make_trainer(models["plain"], data, tmp_path, loss="eaft", eaft_k=5000, max_steps=1)
        trainer.train()
    notes = [r.getMessage() for r in caplog.records if "larger than the vocabulary" in r.getMessage()]
    assert notes == [
        "distmatch: eaft_k=5000 is larger than the vocabulary (300 tokens); loss='eaft' uses all 300 logits (min(eaft_k, V))."
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_ext.loss_mixin"):
        make_trainer(models["plain"], data, tmp_path / "k20", loss="eaft", eaft_k=20, max_steps=1)
    assert not [r for r in caplog.records if "larger than the vocabulary" in r.getMessage()]


def test_nothing_we_use_is_on_a_deprecation_path(models, data, tmp_path):
    """TRL 1.16 deprecates `compute_loss_func`, `use_liger_kernel` and label smoothing (towards subclassing and Hub
    kernels): the trainer subclasses `compute_loss` and uses none of them, so building and training one step with a
    distmatch loss (fused EMO, the path with the most framework hooks) raises no deprecation warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = make_trainer(models["plain"], data, tmp_path, loss="emo", max_steps=1)
        trainer.train()
    assert trainer.distmatch_request.name == "emo" and "demd" in step_logs(trainer)[-1]
    deprecations = [
        f"{w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, (FutureWarning, DeprecationWarning)) or "deprecat" in str(w.message).lower()
    ]
    assert not deprecations, deprecations
