"""The Axolotl plugin through Axolotl itself (0.19 and 0.21), on CPU, offline.

Real runs, no mocks: a tiny random Llama built in code (`trl_ext.testing`), local JSONL data, `sample_packing: true`
with `multipack_real_batches: false` (the flash-attention row layout: one `[1, micro_batch_size * sequence_len]`
row), gradient accumulation 2 and LoRA. One `axolotl train` subprocess (GEM-LS, Alpaca data with
`train_on_inputs: true`, so packed rows have cross-document targets to mask, plus evaluation), and the other losses
in-process (Axolotl's own `tests/e2e` pattern: prepare_plugins -> validate_config -> normalize_config ->
load_datasets -> train). The trainer writes what the loss saw to `DISTMATCH_DEBUG_TOKEN_COUNTS`; the tests
recount the trainable shifted labels from the raw collated batches.

Runs in `.venv-axolotl` (Axolotl 0.19) and `.venv-axolotl-latest` (Axolotl 0.21) (`make test`); skipped where Axolotl
is not installed.
"""

from __future__ import annotations

import ast
import copy
import importlib.metadata
import inspect
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # axolotl_env: tests/conftest.py FOLDER_MARKERS

axolotl = pytest.importorskip("axolotl")

import yaml  # noqa: E402
from axolotl.common.datasets import load_datasets  # noqa: E402
from axolotl.integrations.base import BasePlugin, PluginManager  # noqa: E402
from axolotl.train import train  # noqa: E402
from axolotl.utils.config import normalize_config, prepare_plugins, validate_config  # noqa: E402
from axolotl.utils.dict import DictDefault  # noqa: E402
from pydantic import ValidationError  # noqa: E402

import axolotl_distmatch  # noqa: E402
from axolotl_distmatch.args import DistMatchArgs  # noqa: E402
from axolotl_distmatch.trainer import DEBUG_ENV, DistMatchTrainer, mask_document_starts  # noqa: E402
from tests.helpers.env import REPO_ROOT  # noqa: E402
from trl_ext.options import DISTMATCH_LOSSES, OPTION_DEFAULTS  # noqa: E402
from trl_ext.testing import build_tiny_llama, write_alpaca_jsonl, write_sft_jsonl  # noqa: E402

EXAMPLES = REPO_ROOT / "examples" / "axolotl"
PLUGIN = "axolotl_distmatch.DistMatchPlugin"
IGNORE = -100
# What the GPU examples are validated against (Axolotl's `gpu_capabilities()` on an 8 x H100 node).
GPU_CAPABILITIES = {"bf16": True, "fp8": False, "tf32": True, "n_gpu": 8, "compute_capability": "sm_90"}
ENV_CAPABILITIES = {"torch_version": "2.13.0"}
SEQUENCE_LEN, MICRO_BATCH = 256, 2


# ---------------------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(autouse=True)
def fresh_plugin_manager():
    """Axolotl's PluginManager is a process-wide singleton: start and end every test without plugins."""
    PluginManager.get_instance().plugins.clear()
    yield
    PluginManager.get_instance().plugins.clear()


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("axolotl_assets")
    return {
        "model": build_tiny_llama(root / "model"),
        "chat": write_sft_jsonl(root / "chat.jsonl", n=64),
        "alpaca": write_alpaca_jsonl(root / "alpaca.jsonl", n=64),
        "prepared": root / "prepared",
    }


def tiny_config(assets: dict[str, Path], out: Path, **overrides: Any) -> dict[str, Any]:
    """`examples/axolotl/tiny-cpu.yaml` pointed at the test's assets, in the packed GPU row layout, 2 steps."""
    cfg = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    cfg.pop("gem_beta")  # a GEM option: refused with the other losses the overrides may choose
    dataset = dict(cfg["datasets"][0], path=str(assets["chat"]))
    cfg.update(
        base_model=str(assets["model"]),
        datasets=[dataset],
        dataset_prepared_path=str(assets["prepared"]),
        output_dir=str(out),
        multipack_real_batches=False,
        max_steps=2,
        seed=0,
    )
    cfg.update(overrides)
    return {k: v for k, v in cfg.items() if v is not None}


def alpaca_dataset(assets: dict[str, Path]) -> list[dict[str, Any]]:
    return [{"path": str(assets["alpaca"]), "ds_type": "json", "type": "alpaca"}]


def validate(cfg: dict[str, Any], gpu: bool = True) -> DictDefault:
    """What `axolotl train` does before training: register the plugins (raw config), then validate."""
    config = DictDefault(copy.deepcopy(cfg))
    prepare_plugins(config)
    if gpu:
        return validate_config(config, capabilities=GPU_CAPABILITIES, env_capabilities=ENV_CAPABILITIES)
    return validate_config(config)


def expected_items(batch: dict[str, Any]) -> int:
    """Trainable shifted labels of a raw collated batch: label t+1 is a target of token t unless it is -100 or
    starts a document (position id 0)."""
    count = 0
    for labels, positions in zip(batch["labels"], batch["position_ids"]):
        count += sum(1 for t in range(1, len(labels)) if labels[t] != IGNORE and positions[t] != 0)
    return count


def cross_document_targets(batch: dict[str, Any]) -> int:
    return sum(
        1
        for labels, positions in zip(batch["labels"], batch["position_ids"])
        for t in range(1, len(labels))
        if labels[t] != IGNORE and positions[t] == 0
    )


def check_token_counts(path: Path, steps: int, accumulation: int = 2) -> dict[str, Any]:
    """Every training window's `num_items_in_batch` (what the loss divides by) is the number of trainable shifted
    labels of its micro-batches, recounted here from the raw batches; each loss call saw its batch's count."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    batches = [r for r in records if r["event"] == "batch"]
    windows = [r for r in records if r["event"] == "window"]
    train_calls = [r for r in records if r["event"] == "loss" and r["mode"] == "train"]
    assert len(windows) == steps and all(w["batches"] == accumulation for w in windows), windows
    assert len(train_calls) == len(batches) == steps * accumulation
    for i, window in enumerate(windows):
        own = batches[i * accumulation : (i + 1) * accumulation]
        assert window["num_items_in_batch"] == sum(expected_items(b) for b in own) > 0
        for batch, call in zip(own, train_calls[i * accumulation : (i + 1) * accumulation]):
            assert call["num_items_in_batch"] == window["num_items_in_batch"]
            assert call["local_items"] == expected_items(batch)
    for batch in batches:  # the flash-attention layout, and no attention mask in packed rows
        assert "attention_mask" not in batch["keys"]
        assert [len(row) for row in batch["labels"]] == [MICRO_BATCH * SEQUENCE_LEN]
        assert sum(1 for p in batch["position_ids"][0] if p == 0) > 1  # several documents per row
    for call in records:
        if call["event"] == "loss":
            assert "attention_mask" not in call["keys"]
    return {"batches": batches, "records": records}


def printed_logs(stdout: str) -> list[dict[str, Any]]:
    """The metric dicts the Trainer prints (`{'loss': ...}`, `{'eval_loss': ...}`)."""
    logs = []
    for match in re.finditer(r"\{'(?:loss|eval_loss)':[^{}]*\}", stdout):
        entry = ast.literal_eval(match.group(0))
        logs.append({k: float(v) if isinstance(v, str) else v for k, v in entry.items()})
    return logs


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


def test_cost_embedding_with_another_vocabulary_fails_validation(assets, tmp_path) -> None:
    """Both vocabularies come from config.json files: no weights are read (the other folder has none)."""
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((assets["model"] / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(config, vocab_size=config["vocab_size"] + 20)))
    cfg = tiny_config(assets, tmp_path, loss="emo", emo_cost_embedding=str(other))
    with pytest.raises(ValidationError, match=f"vocabulary of {config['vocab_size'] + 20} tokens"):
        validate(cfg, gpu=False)


def test_paper_variant_options(assets, tmp_path) -> None:
    """tailr_min_weight / tailr_variant and emo_ratio_clamp: validated keys that reach the loss parameters."""
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
    }[name]
    assert {k: cfg[k] for k in expected} == expected
    if name.startswith("llama3"):
        assert cfg.micro_batch_size * cfg.gradient_accumulation_steps * 8 == 128  # 8 GPUs
        assert "zero2" in cfg.deepspeed
    if name.startswith("llama-7b-alpaca"):
        assert cfg.micro_batch_size * cfg.gradient_accumulation_steps * 4 == 128  # 4 GPUs
        assert "zero3" in cfg.deepspeed


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
    assert not torch.allclose(
        saved_head, pretrained, atol=1e-4
    )  # the head moved: the test can tell them apart

    model, resumed = train_in_process(
        tiny_config(assets, out, max_steps=3, resume_from_checkpoint=str(checkpoint), **common)
    )
    assert resumed.state.global_step == 3
    assert torch.equal(resumed.distmatch_request.cost_embedding, pretrained)
    assert not torch.equal(model.get_output_embeddings().weight.detach(), pretrained)


# ---------------------------------------------------------------------------------------------------------
# `loss:` without `plugins:`: the activation hook adds the plugin (a venv set up like the project's, real CLI)


def test_hook_adds_the_plugin_only_for_distmatch_keys() -> None:
    import distmatch_axolotl_hook as hook
    from trl_ext.options import LOSS_OPTIONS

    assert set(hook.OPTION_NAMES) == {
        o.name for o in LOSS_OPTIONS
    }  # kept in sync (the hook imports no torch)
    plain = {"base_model": "m", "plugins": ["x.Y"]}
    assert hook.add_plugin(plain) == [] and plain["plugins"] == ["x.Y"]
    assert hook.add_plugin({"loss": None}) == []
    cfg = {"base_model": "m", "loss": "gem_ls", "gem_beta": 0.5}
    assert hook.add_plugin(cfg) == ["loss", "gem_beta"] and cfg["plugins"] == [PLUGIN]
    listed = {"gem_beta": 0.5, "plugins": ["axolotl_distmatch:DistMatchPlugin"]}
    hook.add_plugin(listed)
    assert listed["plugins"] == ["axolotl_distmatch:DistMatchPlugin"]  # already there, other spelling


@pytest.fixture(scope="module")
def project_venv(tmp_path_factory):
    from tests.helpers.project_venv import make_project_like_venv

    return make_project_like_venv(tmp_path_factory.mktemp("project_venv"), REPO_ROOT)


def _axolotl_train(venv, cfg: dict[str, Any], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    config_path = tmp_path / "cfg.yml"
    config_path.write_text(yaml.safe_dump(cfg))
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DISTMATCH_", "PYTHON"))}
    environment.update(env, PATH=f"{venv.bin}:{os.environ.get('PATH', '')}")
    return subprocess.run(
        [str(venv.bin / "axolotl"), "train", str(config_path), "--launcher", "python"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        timeout=600,
    )


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    return line


def test_axolotl_train_loss_without_plugins_line_trains_distmatch(assets, project_venv, tmp_path) -> None:
    cfg = tiny_config(assets, tmp_path / "out", max_steps=1)
    cfg.pop("plugins")
    result = _axolotl_train(project_venv, cfg, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f"Plugin loaded successfully: {PLUGIN}" in output
    (entry,) = [entry for entry in printed_logs(output) if "loss" in entry]
    assert {"ce", "entropy", "mean_token_accuracy"} <= set(entry)  # the distmatch trainer's metrics
    assert abs(entry["loss"] - entry["ce"]) > 1.0  # GEM's objective, not cross-entropy


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"loss": "gem_ls", "gem_beta": 0}, "error: Loss 'gem_ls': gem_beta=0 is invalid"),
        ({"loss": None, "gem_beta": 0.5}, "error: gem_beta=0.5 is set but `loss` is unset"),
        ({"loss": "gem_lsx"}, "error: loss='gem_lsx' is not a distmatch loss"),
    ],
)
def test_axolotl_train_refuses_in_one_line(assets, project_venv, tmp_path, overrides, expected) -> None:
    cfg = tiny_config(assets, tmp_path / "out", **overrides)
    cfg.pop("plugins")
    line = _one_line_error(_axolotl_train(project_venv, cfg, tmp_path))
    assert line.startswith(expected), line
    if overrides.get("loss") == "gem_ls":
        assert "gem_linear" not in line  # the user's loss is named, not another loss using the option
    assert not (tmp_path / "out").exists()


def test_axolotl_train_stops_when_the_plugin_fails_to_import(assets, project_venv, tmp_path) -> None:
    """A plugin that cannot be imported is an error, never a skipped plugin (the fault: a broken plugin module
    earlier on the path)."""
    broken = tmp_path / "broken" / "axolotl_distmatch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "plugin.py").write_text("raise ImportError('simulated broken install')\n")
    cfg = tiny_config(assets, tmp_path / "out")
    cfg.pop("plugins")
    line = _one_line_error(_axolotl_train(project_venv, cfg, tmp_path, PYTHONPATH=str(broken.parent)))
    assert "failed to import" in line and "simulated broken install" in line and "loss" in line, line
    assert not (tmp_path / "out").exists()
