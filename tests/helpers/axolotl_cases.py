"""Shared parts of the Axolotl plugin tests (tests/axolotl/): the tiny CPU config in the packed GPU row layout,
validation as `axolotl train` does it, and the recount of the tokens the loss saw. Import only after
`pytest.importorskip("axolotl")`."""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml
from axolotl.utils.config import prepare_plugins, validate_config
from axolotl.utils.dict import DictDefault

from tests.helpers.env import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples" / "axolotl"
PLUGIN = "axolotl_distmatch.DistMatchPlugin"
IGNORE = -100
# What the GPU examples are validated against (Axolotl's `gpu_capabilities()` on an 8 x H100 node).
GPU_CAPABILITIES = {"bf16": True, "fp8": False, "tf32": True, "n_gpu": 8, "compute_capability": "sm_90"}
ENV_CAPABILITIES = {"torch_version": "2.13.0"}
SEQUENCE_LEN, MICRO_BATCH = 256, 2


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
