"""`DistMatchSFTTrainer` / `DistMatchSFTConfig` through TRL's real `SFTTrainer` on CPU.

Tiny random Llamas built in code, local JSONL, no mocks, offline. Runs in `.venv` (TRL 1.16) and in
`.venv-axolotl` (TRL 1.9): the `trl_trainer` marker selects this module in both (see the Makefile).

Reference values come from TRL itself (`loss_type="nll"`, same seed, same data order) or from
`trl_ext.losses.reference_token_loss` on the model's own full logits.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from tests.helpers.tiny_model import build_tiny_llama, write_sft_jsonl  # noqa: E402
from trl_ext.config import LOSS_CHOICES, DistMatchSFTConfig  # noqa: E402
from trl_ext.losses import reference_token_loss  # noqa: E402
from trl_ext.model_forward import LossRequest, install_loss_forward  # noqa: E402
from trl_ext.trainer import DistMatchSFTTrainer  # noqa: E402

pytestmark = pytest.mark.slow  # trl_trainer: tests/conftest.py FOLDER_MARKERS

OUR_LOSSES = ("ce", "emo", "gem_linear", "gem_ls", "ce_entropy", "tailr", "mixce", "dft", "eaft")
TRL_VERSION = trl.__version__

# ---------------------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny matrices: threads only add synchronisation, which is very slow on a shared, loaded CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Tiny Llamas saved once per session: untied (vocab 300), tied, another seed, another vocabulary."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        "plain": build_tiny_llama(root / "plain"),
        "tied": build_tiny_llama(root / "tied", tie=True),
        "other_seed": build_tiny_llama(root / "other_seed", seed=1),
        "other_vocab": build_tiny_llama(root / "other_vocab", vocab_size=280),
    }


@pytest.fixture(scope="session")
def data(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("sft_data")
    path = write_sft_jsonl(root / "train.jsonl", n=48)
    train = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(root / "cache"))
    return {"train": train, "eval": train.select(range(8))}


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
        "gradient_checkpointing": False,  # TRL's default (True) is kept where a test says so
        "report_to": "none",
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
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

SGD = {
    "optim": "sgd",
    "learning_rate": 1.0,  # large, so the update is far above float32 rounding of the weights
    "lr_scheduler_type": "constant",
    "max_grad_norm": 1e9,  # clipping computed (grad_norm logged) but never applied
    "train_sampling_strategy": "sequential",
    "max_steps": 1,
}


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


@pytest.mark.parametrize("loss", ["gem_ls", "emo"])
def test_padding_free_batch_equals_sum_of_documents(models, data, tmp_path, loss):
    model = load_model(models["plain"])
    with torch.no_grad():  # stronger attention than the random init, so attending across documents shows
        for layer in model.model.layers:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(layer.self_attn, proj).weight.mul_(5.0)
    trainer = make_trainer(
        models["plain"], data, tmp_path, model=model, loss=loss, padding_free=True, max_length=None
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
    ],
    ids=["tailr-emo_code", "emo-ratio_clamp"],
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
    assert (
        math.isfinite(metrics["eval_loss"]) and math.isfinite(metrics["eval_ce"]) and metrics["eval_ce"] > 0
    )


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
# Options and bad input


def test_trl_config_fields_are_built_from_the_specs():
    import dataclasses

    from trl_ext.options import LOSS_OPTIONS

    fields = {f.name: f for f in dataclasses.fields(DistMatchSFTConfig)}
    for option in LOSS_OPTIONS:
        f = fields[option.name]
        assert f.metadata["help"].startswith(option.help)
        assert f.default == option.default or f.default is None
        if option.choices is not None:
            assert tuple(f.metadata["choices"]) == option.choices


def test_loss_choices_are_trl_types_plus_ours():
    assert all(isinstance(c, str) for c in LOSS_CHOICES), LOSS_CHOICES
    assert {"nll", "dft"} <= set(LOSS_CHOICES), (TRL_VERSION, LOSS_CHOICES)
    assert set(OUR_LOSSES) <= set(LOSS_CHOICES)


@pytest.mark.parametrize("trl_loss", ["nll"])
def test_trl_loss_names_are_forwarded_to_loss_type(tmp_path, trl_loss):
    config = make_config(tmp_path, loss=trl_loss)
    assert config.loss_type == trl_loss and config.distmatch_loss is None


def test_loss_dft_is_ours_and_loss_type_dft_stays_trls(tmp_path):
    """A name both define: `loss` selects ours (fused / chunked), `loss_type` keeps selecting TRL's."""
    ours = make_config(tmp_path, loss="dft")
    assert ours.distmatch_loss == "dft" and ours.loss_type == "nll"
    theirs = make_config(tmp_path, loss_type="dft")
    assert theirs.distmatch_loss is None and theirs.loss_type == "dft"


def test_unknown_loss_lists_the_choices(tmp_path):
    with pytest.raises(ValueError, match="gem_lsx") as err:
        make_config(tmp_path, loss="gem_lsx")
    assert all(name in str(err.value) for name in (*OUR_LOSSES, "nll"))


@pytest.mark.parametrize(
    ("overrides", "option"),
    [
        ({"loss": "gem_ls", "gem_beta": 0.0}, "gem_beta"),
        ({"loss": "gem_linear", "gem_beta": -1.0}, "gem_beta"),
        ({"loss": "emo", "emo_weighting": "x"}, "emo_weighting"),
        ({"loss": "tailr", "tailr_gamma": 2.0}, "tailr_gamma"),
        ({"loss": "mixce", "mixce_gamma": -0.5}, "mixce_gamma"),
        ({"loss": "emo", "emo_cost_embedding": ""}, "emo_cost_embedding"),
        ({"loss": "eaft", "eaft_alpha": -1.0}, "eaft_alpha"),
        ({"loss": "eaft", "eaft_k": 0}, "eaft_k"),
        ({"loss": "tailr", "tailr_min_weight": 1.5}, "tailr_min_weight"),
        ({"loss": "tailr", "tailr_variant": "tvd"}, "tailr_variant"),
        ({"loss": "emo", "emo_ratio_clamp": 0.0}, "emo_ratio_clamp"),
        (
            {"loss": "emo", "emo_weighting": "emo2", "emo_ratio_clamp": 3.0},
            "emo_ratio_clamp=3.0 bounds emo1's",
        ),
    ],
)
def test_bad_option_values_are_rejected_by_the_config(tmp_path, overrides, option):
    with pytest.raises(ValueError, match=option):
        make_config(tmp_path, **overrides)


def test_paper_variant_options_reach_the_loss_parameters(tmp_path):
    """TaiLr's min_weight / the EMO code's tvd variant and EMO's ratio clamp: flags -> functional parameters."""
    from trl_ext.options import loss_params

    parser = trl.TrlParser((DistMatchSFTConfig,))
    (config,) = parser.parse_args_and_config(
        ["--output_dir", str(tmp_path), "--loss", "tailr", "--tailr_min_weight", "0.3", "--tailr_variant",
         "emo_code", "--tailr_gamma", "0.9", "--use_cpu", "true"]
    )  # fmt: skip
    options = {k: getattr(config, k) for k in ("tailr_gamma", "tailr_min_weight", "tailr_variant")}
    assert loss_params("tailr", options) == {"gamma": 0.9, "min_weight": 0.3, "variant": "emo_code"}
    (config,) = parser.parse_args_and_config(
        ["--output_dir", str(tmp_path), "--loss", "emo", "--emo_ratio_clamp", "3.0", "--use_cpu", "true"]
    )
    assert config.emo_ratio_clamp == 3.0
    defaults = make_config(tmp_path, loss="tailr")
    # Unset options stay None in the config (so a default is never taken for the user's choice); the loss gets the
    # spec's defaults: TaiLr's own criterion with min_weight 0.2.
    assert (defaults.tailr_min_weight, defaults.tailr_variant) == (None, None)
    assert loss_params("tailr", defaults.loss_options()) == {
        "gamma": 0.5,
        "min_weight": 0.2,
        "variant": "tailr",
    }
    assert defaults.emo_ratio_clamp is None
    assert loss_params("emo", {"emo_ratio_clamp": 3.0})["ratio_clamp"] == 3.0
    assert loss_params("emo", {})["ratio_clamp"] is None


def test_parser_rejects_unknown_loss_with_the_choices(tmp_path, capsys):
    parser = trl.TrlParser((DistMatchSFTConfig,))
    with pytest.raises(SystemExit) as exc:
        parser.parse_args_and_config(["--output_dir", str(tmp_path), "--loss", "bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "invalid choice" in err
    assert all(name in err for name in OUR_LOSSES), err


def test_parser_and_yaml_config_accept_our_options(tmp_path):
    parser = trl.TrlParser((DistMatchSFTConfig,))
    (config,) = parser.parse_args_and_config(
        ["--output_dir", str(tmp_path), "--loss", "gem_ls", "--gem_beta", "0.5", "--use_cpu", "true"]
    )
    assert config.loss == "gem_ls" and config.gem_beta == 0.5 and config.distmatch_loss == "gem_ls"
    yaml_file = tmp_path / "config.yaml"
    yaml_file.write_text(f"output_dir: {tmp_path}\nloss: emo\nemo_weighting: emo2\nuse_cpu: true\n")
    (config,) = parser.parse_args_and_config(["--config", str(yaml_file)])
    assert config.loss == "emo" and config.emo_weighting == "emo2" and config.gem_beta is None
    assert config.loss_options()["gem_beta"] == 0.7  # unset: the default
    parser = trl.TrlParser((DistMatchSFTConfig,))  # `--config` set the YAML values as this parser's defaults
    (config,) = parser.parse_args_and_config(
        ["--output_dir", str(tmp_path), "--loss", "nll", "--use_cpu", "true"]
    )
    assert config.loss_type == "nll" and config.distmatch_loss is None


def test_yaml_config_with_unknown_loss_is_rejected(tmp_path, capsys):
    yaml_file = tmp_path / "config.yaml"
    yaml_file.write_text(f"output_dir: {tmp_path}\nloss: gem_lsx\nuse_cpu: true\n")
    with pytest.raises((ValueError, SystemExit)) as exc:
        trl.TrlParser((DistMatchSFTConfig,)).parse_args_and_config(["--config", str(yaml_file)])
    message = str(exc.value) + capsys.readouterr().err
    assert "gem_lsx" in message and "gem_ls" in message.replace("gem_lsx", "")


def test_label_smoothing_with_our_loss_is_rejected(models, data, tmp_path):
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        make_trainer(models["plain"], data, tmp_path, loss="emo", label_smoothing_factor=0.1)


def test_compute_loss_func_with_our_loss_is_rejected(models, data, tmp_path):
    def custom(outputs, labels, num_items_in_batch=None):
        return outputs.logits.sum() * 0

    with pytest.raises(ValueError, match="compute_loss_func"):
        make_trainer(
            models["plain"], data, tmp_path, loss="gem_ls", trainer_kwargs={"compute_loss_func": custom}
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
