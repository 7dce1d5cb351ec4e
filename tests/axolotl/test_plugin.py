"""The Axolotl plugin (`axolotl_distmatch/plugin.py`, `args.py`) through Axolotl itself (0.19 and 0.21), on CPU, offline:
the plugin and its entry point, the config schema and its validation, conflicts, the example configs.

Runs in `.venv-axolotl` (Axolotl 0.19) and `.venv-axolotl-latest` (Axolotl 0.21) (`make test`: `axolotl_env`, set on
tests/axolotl/ by tests/conftest.py); skipped where Axolotl is not installed. Shared parts: tests/helpers/axolotl_cases.py.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # axolotl_env: tests/placement.py

axolotl = pytest.importorskip("axolotl")

import yaml  # noqa: E402
from axolotl.integrations.base import BasePlugin, PluginManager  # noqa: E402
from axolotl.utils.dict import DictDefault  # noqa: E402
from pydantic import ValidationError  # noqa: E402

import axolotl_distmatch  # noqa: E402
from axolotl_distmatch.args import DistMatchArgs  # noqa: E402
from axolotl_distmatch.trainer import DistMatchTrainer, mask_document_starts  # noqa: E402
from tests.helpers.axolotl_cases import (  # noqa: E402
    EXAMPLES,
    PLUGIN,
    tiny_config,
    validate,
)
from tests.helpers.env import REPO_ROOT  # noqa: E402
from trl_ext.options import DISTMATCH_LOSSES, OPTION_DEFAULTS  # noqa: E402

# ---------------------------------------------------------------------------------------------------------
# Plugin, schema, validation


def test_plugin_is_an_axolotl_plugin_and_entry_point_resolves() -> None:
    import tomllib

    assert issubclass(axolotl_distmatch.DistMatchPlugin, BasePlugin)
    assert axolotl_distmatch.DistMatchArgs is DistMatchArgs
    entry_points = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    (name, value), *_ = entry_points["axolotl.plugins"].items()
    loaded = importlib.metadata.EntryPoint(name, value, "axolotl.plugins").load()
    assert loaded is axolotl_distmatch.DistMatchPlugin


def test_schema_has_the_shared_names_and_defaults() -> None:
    from trl_ext.config import DistMatchSFTConfig

    fields = DistMatchArgs.model_fields
    # Unset options stay None (a default is never "written"); the description names the default the plugin uses.
    assert all(fields[k].default is None for k in OPTION_DEFAULTS)
    for key, default in OPTION_DEFAULTS.items():
        assert f"Default: {default!r}" in fields[key].json_schema_extra["description"]
    assert fields["loss"].default is None
    schema = DistMatchArgs.model_json_schema()["properties"]["loss"]
    choices = next(s["enum"] for s in schema["anyOf"] if "enum" in s)
    assert tuple(choices) == DISTMATCH_LOSSES
    assert set(OPTION_DEFAULTS) <= set(DistMatchSFTConfig.__dataclass_fields__)  # one name in both frameworks


def test_loss_key_is_validated_and_kept(assets, tmp_path) -> None:
    cfg = validate(tiny_config(assets, tmp_path, loss="emo", emo_weighting="emo2"), gpu=False)
    assert (cfg.loss, cfg.emo_weighting, cfg.gem_beta, cfg.emo_cost_embedding) == ("emo", "emo2", None, None)


def test_unknown_loss_fails_validation_naming_the_choices(assets, tmp_path) -> None:
    with pytest.raises(ValidationError) as info:
        validate(tiny_config(assets, tmp_path, loss="gem_lsx"), gpu=False)
    message = str(info.value)
    assert "loss='gem_lsx' is not a distmatch loss" in message
    assert "Valid losses: " + ", ".join(DISTMATCH_LOSSES) in message
    assert "Did you mean 'gem_ls'?" in message


@pytest.mark.parametrize(
    ("loss", "key", "value", "expected"),
    [
        ("gem_ls", "gem_beta", 0.0, "Loss 'gem_ls': gem_beta=0.0 is invalid"),
        ("gem_linear", "gem_beta", -1, "Loss 'gem_linear': gem_beta=-1 is invalid"),
        ("tailr", "tailr_gamma", 1.5, "tailr_gamma=1.5 is invalid"),
        ("mixce", "mixce_gamma", -0.1, "mixce_gamma=-0.1 is invalid"),
        ("ce_entropy", "ce_entropy_coef", float("nan"), "ce_entropy_coef=nan is invalid"),
        ("emo", "emo_weighting", "emo3", "emo_weighting='emo3' is invalid; expected one of 'emo1', 'emo2'"),
        ("emo", "emo_cost_embedding", "", "emo_cost_embedding='' is invalid"),
        ("emo", "emo_cost_embedding", "/nonexistent/model", "no such folder"),
        ("emo", "emo_cost_embedding", "not a hub id!", "not a hub id"),
        # options that would have no effect
        ("emo", "gem_beta", 0.5, "gem_beta=0.5 has no effect with loss='emo'"),
        (None, "gem_beta", 0.5, "gem_beta=0.5 is set but `loss` is unset"),
        (None, "emo_weighting", "emo2", "add `loss: emo`"),
        ("eaft", "eaft_alpha", -1.0, "eaft_alpha=-1.0 is invalid"),
        ("eaft", "eaft_k", 0, "eaft_k=0 is invalid"),
        ("gem_ls", "eaft_k", 5, "eaft_k=5 has no effect with loss='gem_ls'"),
        ("tailr", "tailr_min_weight", 1.5, "tailr_min_weight=1.5 is invalid"),
        ("tailr", "tailr_variant", "tvd", "expected one of 'tailr', 'emo_code'"),
        ("emo", "emo_ratio_clamp", -1.0, "emo_ratio_clamp=-1.0 is invalid"),
        (
            "emo",
            "emo_target_mass",
            "kept",
            "emo_target_mass='kept' is invalid; expected one of 'excluded', 'included'",
        ),
        (
            "gem_ls",
            "emo_target_mass",
            "included",
            "emo_target_mass='included' has no effect with loss='gem_ls'",
        ),
        ("prob", "anchor_kl_weight", 0.1, "anchor_kl_weight=0.1 has no effect with loss='prob'"),
        (None, "anchor_kl_weight", 0.1, "add `loss: asft` or `loss: sft_kl`"),
        ("sft_kl", "anchor_kl_weight", -0.5, "anchor_kl_weight=-0.5 is invalid"),
        ("asft", "anchor_reference", "", "anchor_reference='' is invalid"),
        ("asft", "anchor_reference", "/nonexistent/model", "no such folder"),
        ("dft", "anchor_reference", "/nonexistent/model", "has no effect with loss='dft'"),
        ("gem_ls", "gem_betta", 0.5, "gem_betta: 0.5 is not a config key"),
        (None, "loss_type", "gem_ls", "loss_type: gem_ls does not select a distmatch loss"),
    ],
)
def test_bad_option_values_fail_validation(assets, tmp_path, loss, key, value, expected) -> None:
    cfg = tiny_config(assets, tmp_path, **{key: value})
    cfg.pop("loss")
    if loss is not None:
        cfg["loss"] = loss
    with pytest.raises(ValidationError, match=re.escape(expected)) as info:
        validate(cfg, gpu=False)
    if loss == "gem_ls":  # the user's loss is named, not another loss that uses the option
        assert "gem_linear" not in str(info.value)


@pytest.mark.parametrize(("loss", "key"), [("asft", "anchor_reference"), ("emo", "emo_cost_embedding")])
@pytest.mark.parametrize("damage", ["no_weights", "truncated"])
def test_reference_folder_without_complete_weights_fails_validation(
    assets, tmp_path, loss, key, damage
) -> None:
    folder = shutil.copytree(assets["model"], tmp_path / "ref")
    (weights,) = folder.glob("*.safetensors")
    if damage == "no_weights":
        weights.unlink()
    else:
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    cfg = tiny_config(assets, tmp_path / "out", loss=loss, **{key: str(folder)})
    expected = "has no weight file" if damage == "no_weights" else "model.safetensors is truncated"
    with pytest.raises(ValidationError, match=expected):
        validate(cfg, gpu=False)


def test_cost_embedding_with_another_vocabulary_fails_validation(assets, tmp_path) -> None:
    """Both vocabularies come from config.json files: no weights are read (the other folder has none)."""
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((assets["model"] / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(config, vocab_size=config["vocab_size"] + 20)))
    cfg = tiny_config(assets, tmp_path, loss="emo", emo_cost_embedding=str(other))
    with pytest.raises(ValidationError, match=f"vocabulary of {config['vocab_size'] + 20} tokens"):
        validate(cfg, gpu=False)


def test_reference_model_with_another_vocabulary_fails_validation(assets, tmp_path) -> None:
    """`anchor_reference`: both vocabularies come from config.json files, checked before the weights (the other
    folder has none); a folder with the same vocabulary and complete weights passes and reaches the validated
    config."""
    config = json.loads((assets["model"] / "config.json").read_text())
    for name, vocab in (("other", config["vocab_size"] + 20), ("same", config["vocab_size"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(dict(config, vocab_size=vocab)))
    for weights in assets["model"].glob("*.safetensors"):
        shutil.copy(weights, tmp_path / "same" / weights.name)
    cfg = tiny_config(assets, tmp_path, loss="sft_kl", anchor_reference=str(tmp_path / "other"))
    with pytest.raises(ValidationError, match=f"vocabulary of {config['vocab_size'] + 20} tokens"):
        validate(cfg, gpu=False)
    cfg = tiny_config(assets, tmp_path, loss="sft_kl", anchor_reference=str(tmp_path / "same"))
    assert validate(cfg, gpu=False).anchor_reference == str(tmp_path / "same")


def test_paper_variant_options(assets, tmp_path) -> None:
    """tailr_min_weight / tailr_variant, emo_ratio_clamp and emo_target_mass: validated keys that reach the loss
    parameters."""
    from trl_ext.options import loss_params

    cfg = validate(
        tiny_config(assets, tmp_path, loss="tailr", tailr_min_weight=0.3, tailr_variant="emo_code"), gpu=False
    )
    trainer_cls = PluginManager.get_instance().plugins[PLUGIN].get_trainer_cls(cfg)
    options = trainer_cls.distmatch_options
    assert (options["tailr_min_weight"], options["tailr_variant"]) == (0.3, "emo_code")
    assert loss_params("tailr", options) == {"gamma": 0.5, "min_weight": 0.3, "variant": "emo_code"}
    emo = validate(tiny_config(assets, tmp_path, loss="emo", emo_ratio_clamp=3.0), gpu=False)
    assert emo.emo_ratio_clamp == 3.0
    emo = validate(tiny_config(assets, tmp_path, loss="emo", emo_target_mass="included"), gpu=False)
    options = PluginManager.get_instance().plugins[PLUGIN].get_trainer_cls(emo).distmatch_options
    assert emo.emo_target_mass == "included" and loss_params("emo", options)["target_mass"] == "included"
    with pytest.raises(ValidationError, match="emo_ratio_clamp=3.0 bounds emo1's"):
        validate(
            tiny_config(assets, tmp_path, loss="emo", emo_weighting="emo2", emo_ratio_clamp=3.0), gpu=False
        )


def test_eaft_options_are_axolotls_own_eaft_keys(assets, tmp_path) -> None:
    """`eaft_alpha` / `eaft_k` mean the same for `loss: eaft` as for Axolotl's `use_eaft`, with the same defaults:
    switching from `use_eaft: true` to `loss: eaft` keeps them (the weight differs by the constant 3 ** alpha)."""
    from axolotl.utils.schemas.config import AxolotlInputConfig

    own = AxolotlInputConfig.model_fields
    assert (own["eaft_alpha"].default, own["eaft_k"].default) == (
        OPTION_DEFAULTS["eaft_alpha"],
        OPTION_DEFAULTS["eaft_k"],
    )
    cfg = validate(tiny_config(assets, tmp_path, loss="eaft", eaft_alpha=0.5, eaft_k=5), gpu=False)
    assert (cfg.loss, cfg.eaft_alpha, cfg.eaft_k) == ("eaft", 0.5, 5)
    trainer_cls = PluginManager.get_instance().plugins[PLUGIN].get_trainer_cls(cfg)
    assert trainer_cls.distmatch_loss == "eaft"
    assert (trainer_cls.distmatch_options["eaft_alpha"], trainer_cls.distmatch_options["eaft_k"]) == (0.5, 5)
    # Without a distmatch `loss` they are Axolotl's (for its `use_eaft`): not refused as options without a loss.
    PluginManager.get_instance().plugins.clear()
    own = tiny_config(assets, tmp_path, use_eaft=True, eaft_alpha=0.5, eaft_k=5)
    own.pop("loss")
    cfg = validate(own, gpu=False)
    assert (cfg.use_eaft, cfg.eaft_alpha, cfg.eaft_k, cfg.get("loss")) == (True, 0.5, 5, None)


def test_eaft_equals_axolotls_own_eaft_loss_divided_by_3_pow_alpha():
    """Against the installed Axolotl's `use_eaft` loss function itself (present from Axolotl 0.19)."""
    import torch
    from axolotl.monkeypatch.loss import eaft

    from trl_ext.losses import token_loss

    gen = torch.Generator().manual_seed(5)
    batch, length, vocab = 2, 9, 50
    logits = torch.randn(batch, length, vocab, generator=gen) * 3
    labels = torch.randint(0, vocab, (batch, length), generator=gen)
    labels[0, :3] = -100
    shifted = labels[:, 1:]
    items = int((shifted != -100).sum())
    for alpha, k in ((1.0, 20), (0.7, 5)):
        outputs = type("Outputs", (), {"logits": logits})()
        # Later Axolotl versions add `normalize` (dividing H_k by ln k); the definition compared here is without.
        extra = {"normalize": False} if "normalize" in inspect.signature(eaft.eaft_loss).parameters else {}
        theirs = eaft.eaft_loss(outputs, labels, num_items_in_batch=items, alpha=alpha, k=k, **extra)
        ours = token_loss("eaft", logits[:, :-1].reshape(-1, vocab), shifted.reshape(-1), alpha=alpha, k=k)
        assert float(ours.sum() / items) * 3.0**alpha == pytest.approx(float(theirs), rel=1e-5)


CCE = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
LIGER = "axolotl.integrations.liger.LigerPlugin"
CONFLICTS = {
    # The CCE plugin alone (no `cut_cross_entropy` key): its flag defaults to true once listed.
    "cut_cross_entropy": ({"plugins": [PLUGIN, CCE], "bf16": True}, "remove it from `plugins`"),
    "liger_flce": (
        {"plugins": [PLUGIN, LIGER], "liger_fused_linear_cross_entropy": True},
        "remove `liger_fused_linear_cross_entropy`",
    ),
    "chunked_cross_entropy": ({"chunked_cross_entropy": True}, "remove `chunked_cross_entropy`"),
    "use_dft": ({"use_dft": True}, "remove `use_dft`"),  # not an Axolotl 0.19 key: read from the raw YAML
    "use_eaft": ({"use_eaft": True}, "remove `use_eaft`"),
    "rl": ({"rl": "dpo", "sample_packing": False}, "remove `rl`"),
    "reward_model": ({"reward_model": True}, "remove `reward_model`"),
    "process_reward_model": ({"process_reward_model": True}, "remove `process_reward_model`"),
    "context_parallel": (
        {"context_parallel_size": 2, "attn_implementation": "flash_attention_2", "micro_batch_size": 1},
        "remove `context_parallel_size` or set it to 1",
    ),
    "sequence_parallel": (
        {"sequence_parallel_degree": 2, "attn_implementation": "flash_attention_2", "micro_batch_size": 1},
        "remove `sequence_parallel_degree` or set it to 1",
    ),
    "kd_trainer": ({"kd_trainer": True}, "remove `kd_trainer`"),
    # Axolotl hands it to transformers' label smoother, which the distmatch trainer's compute_loss never calls.
    "label_smoothing": ({"label_smoothing_factor": 0.1}, "remove `label_smoothing_factor` or set it to 0"),
    "trainer_cls": ({"trainer_cls": "transformers.Trainer"}, "remove `trainer_cls`"),
}


@pytest.mark.parametrize("name", list(CONFLICTS))
def test_conflicting_settings_fail_validation(assets, tmp_path, name) -> None:
    overrides, remedy = CONFLICTS[name]
    cfg = tiny_config(assets, tmp_path, **overrides)
    with pytest.raises(ValidationError) as info:
        validate(cfg)
    message = str(info.value)
    assert "loss: gem_ls (distmatch plugin) cannot be combined with" in message
    assert remedy in message
    # Without `loss` the plugin is inert: whatever Axolotl (or the CCE / Liger plugins) say about these settings,
    # the plugin says nothing.
    PluginManager.get_instance().plugins.clear()
    cfg.pop("loss")
    try:
        assert validate(cfg).get("loss") is None
    except (
        ValidationError,
        ImportError,
        ValueError,
    ) as err:  # e.g. context parallelism needs ring-flash-attn
        assert "distmatch" not in str(err)


def test_all_conflicts_are_reported_together(assets, tmp_path) -> None:
    with pytest.raises(ValidationError) as info:
        validate(tiny_config(assets, tmp_path, use_eaft=True, chunked_cross_entropy=True, orpo_alpha=0.1))
    message = str(info.value)
    for remedy in ("remove `use_eaft`", "remove `chunked_cross_entropy`", "remove `orpo_alpha`"):
        assert remedy in message


def test_plugin_is_inert_without_loss(assets, tmp_path) -> None:
    cfg = tiny_config(assets, tmp_path)
    cfg.pop("loss")
    validated = validate(cfg, gpu=False)
    plugin = PluginManager.get_instance().plugins[PLUGIN]
    assert plugin.get_trainer_cls(validated) is None
    trainer_cls = plugin.get_trainer_cls(DictDefault(dict(validated, loss="tailr", tailr_gamma=0.25)))
    assert issubclass(trainer_cls, DistMatchTrainer)
    assert trainer_cls.distmatch_loss == "tailr" and trainer_cls.distmatch_options["tailr_gamma"] == 0.25


def test_register_fails_loudly_when_the_trainer_cannot_import(monkeypatch) -> None:
    """Axolotl 0.19 only logs a plugin's import errors: with `loss` set, `register` raises instead."""
    plugin = axolotl_distmatch.DistMatchPlugin()
    plugin.register({"base_model": "x"})  # no `loss`: nothing to check
    monkeypatch.delattr(axolotl_distmatch, "trainer")
    monkeypatch.setitem(sys.modules, "axolotl_distmatch.trainer", None)
    with pytest.raises(
        ValueError, match="loss: emo is set but the distmatch Axolotl trainer failed to import"
    ):
        plugin.register({"loss": "emo"})


def test_duplicate_registration_adds_the_args_once() -> None:
    """Listed in `plugins` and auto-loaded through the entry point (Axolotl >= 0.21) under another name."""
    manager = PluginManager.get_instance()  # Axolotl >= 0.21 adds its own plugins (context / expert parallel)
    manager.register(PLUGIN)
    manager.plugins["axolotl_distmatch:DistMatchPlugin"] = axolotl_distmatch.DistMatchPlugin()
    ours = [p for p in manager.plugins.values() if isinstance(p, axolotl_distmatch.DistMatchPlugin)]
    assert len(ours) == 2
    args = [a for a in manager.get_input_args() if a.startswith("axolotl_distmatch")]
    assert args == ["axolotl_distmatch.args.DistMatchArgs"]
    trainers = [p.get_trainer_cls(DictDefault({"loss": "ce"})) for p in ours]
    assert trainers[0] is not None and trainers[1] is None


def test_mask_document_starts() -> None:
    import torch

    batch = {
        "labels": torch.tensor([[5, 6, 7, 8, 9, 10, -100]]),
        "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 1]]),
    }
    original = batch["labels"].clone()
    assert mask_document_starts(batch)["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, -100]]
    assert torch.equal(original, torch.tensor([[5, 6, 7, 8, 9, 10, -100]]))
    assert mask_document_starts({"labels": original})["labels"] is original  # unpacked: nothing to do
    # A flattened row described by flash-attention boundaries only (Axolotl >= 0.21 may emit them).
    varlen = {"labels": original, "cu_seq_lens_q": torch.tensor([0, 3, 5, 7], dtype=torch.int32)}
    assert mask_document_starts(varlen)["labels"].tolist() == [[5, 6, 7, -100, 9, -100, -100]]


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_example_config_passes_axolotl_validation_offline(monkeypatch, name) -> None:
    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"validation tried to reach the network: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.chdir(REPO_ROOT)  # the examples' relative paths are from the repository root
    raw = yaml.safe_load((EXAMPLES / name).read_text())
    hub_cost = raw.get("emo_cost_embedding") not in (None, "frozen", "live")
    if hub_cost:  # another model's head by hub id: its config.json cannot be fetched offline
        raw = dict(raw, emo_cost_embedding="frozen")
    cfg = validate(raw)
    if hub_cost:
        cfg["emo_cost_embedding"] = yaml.safe_load((EXAMPLES / name).read_text())["emo_cost_embedding"]
    assert PLUGIN in cfg.plugins and cfg.loss in DISTMATCH_LOSSES
    if cfg.get("deepspeed"):
        stage = json.loads(Path(cfg.deepspeed).read_text())["zero_optimization"]["stage"]
        assert f"zero{stage}" in Path(cfg.deepspeed).name
    expected = {
        "llama3-8b-ultrafeedback-gem_ls.yaml": {
            "loss": "gem_ls",
            "gem_beta": 0.7,
            "learning_rate": 2e-5,
            "lr_scheduler": "cosine",
            "warmup_ratio": 0.03,
            "num_epochs": 3,
            "sequence_len": 2048,
            "sample_packing": True,
        },
        # EMO Tables 3 / 6: the released finetune_lora.sh / run_clm_trainer_emo.py settings
        **{
            name: {
                "base_model": base,
                "loss": "emo",
                "emo_weighting": "emo2",
                "emo_cost_embedding": "TheBloke/Llama-2-13B-fp16",
                "emo_ratio_clamp": None,  # the script's mode emo2 has no clamp
                "learning_rate": 2e-5,
                "num_epochs": 1,
                "sequence_len": 256,
                "micro_batch_size": 16,
                "gradient_accumulation_steps": 1,
                "warmup_ratio": 0.03,
                "lr_scheduler": "linear",
                "seed": 100,
                "fp16": True,
                "adapter": "lora",
                "lora_r": 32,
                "lora_alpha": 16,
                "lora_dropout": 0.05,
                "lora_target_modules": ["q_proj", "v_proj"],
            }
            for name, base in (
                ("llama2-7b-wikitext103-emo.yaml", "meta-llama/Llama-2-7b-hf"),
                ("llama-7b-wikitext103-emo.yaml", "huggyllama/llama-7b"),
            )
        },
        "llama-7b-alpaca-gpt4-emo.yaml": {
            "loss": "emo",
            "emo_weighting": "emo1",
            "learning_rate": 2e-5,
            "lr_scheduler": "cosine",
            "num_epochs": 3,
            "sequence_len": 512,
        },
        "tiny-cpu.yaml": {"loss": "gem_ls"},
        # EMO Table 1 (Section 4.1): 3 epochs, AdamW at 5e-5, batch 32, 256 tokens, the lowest validation loss
        "gpt2-lm-emo.yaml": {
            "base_model": "gpt2",
            "loss": "emo",
            "emo_weighting": "emo1",
            "emo_cost_embedding": "frozen",
            "emo_target_mass": "included",  # the authors' gpt2.py, mode emo: D with the target's own mass
            "num_epochs": 3,
            "learning_rate": 5e-5,
            "micro_batch_size": 32,
            "gradient_accumulation_steps": 1,
            "sequence_len": 256,
            "lr_scheduler": "linear",
            "weight_decay": 0.0,
            "load_best_model_at_end": True,
            "metric_for_best_model": "eval_loss",
            "greater_is_better": False,
        },
        # GEM Appendix D.2 / D.3: the UltraFeedback settings with 1,024 tokens and 8 rows x 2 accumulation steps
        **{
            f"llama3-8b-{data}-gem_ls.yaml": {
                "loss": "gem_ls",
                "gem_beta": 0.7,
                "learning_rate": 2e-5,
                "lr_scheduler": "cosine",
                "warmup_ratio": 0.03,
                "num_epochs": 3,
                "sequence_len": 1024,
                "sample_packing": False,
                "micro_batch_size": 8,
                "gradient_accumulation_steps": 2,
            }
            for data in ("metamathqa", "magicoder")
        },
    }[name]
    assert {k: cfg[k] for k in expected} == expected
    if name.startswith("llama3"):
        assert cfg.micro_batch_size * cfg.gradient_accumulation_steps * 8 == 128  # 8 GPUs
        assert "zero2" in cfg.deepspeed
    for data in (
        "metamathqa",
        "magicoder",
    ):  # the chat JSONL that examples/reproduce/gem_domain_data.py writes
        if data in name:
            dataset = cfg.datasets[0]
            assert (dataset["path"], dataset["type"], dataset["field_messages"]) == (
                f"data/gem/{data}/train.jsonl",
                "chat_template",
                "messages",
            )
    if name == "gpt2-lm-emo.yaml":  # the JSONL that examples/reproduce/emo_lm_data.py writes
        splits = [(d["path"], d["type"], d["field"]) for d in (*cfg.datasets, *cfg.test_datasets)]
        assert splits == [
            (f"data/emo_lm/wikitext2/{s}.jsonl", "completion", "text") for s in ("train", "validation")
        ]
        assert cfg.eval_strategy == "epoch" and cfg.save_strategy == "epoch"
    if name.startswith("llama-7b-alpaca"):
        assert cfg.micro_batch_size * cfg.gradient_accumulation_steps * 4 == 128  # 4 GPUs
        assert "zero3" in cfg.deepspeed
