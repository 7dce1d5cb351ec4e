"""The GPU check's `axolotl` step (tools/gpu_check_axolotl.py), piece by piece; the CPU dry run in
test_gpu_check.py runs it end to end."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module


def _module(name: str) -> ModuleType:
    """A module of the GPU check, imported as tools/gpu_check.py imports it (tools/ on sys.path)."""
    load_module("distmatch_tool_gpu_check", REPO_ROOT / "tools" / "gpu_check.py")
    return importlib.import_module(name)


def _ctx(tmp_path: Path, device: str, environment: dict[str, Any]) -> Any:
    check, plan, runner, table = (
        _module("distmatch_tool_gpu_check"),
        _module("gpu_check_plan"),
        _module("gpu_check_runner"),
        _module("gpu_check_table"),
    )
    folders = ["--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "scratch")]
    args = check.parse_args(["--device", device, *folders])
    ctx = plan.Context(
        args, runner.Runner(args.out, dict(os.environ), 60), table.RUNS, tmp_path / "kit" / "wheels"
    )
    ctx.environment = environment
    ctx.prepared["build"] = {"model": "/m", "data": "/d"}
    return ctx


# ---------------------------------------------------------------------------------------------------------------
# The axolotl step


def test_axolotl_runs_packed_bf16_with_our_plugin_against_axolotls_liger(tmp_path: Path) -> None:
    axolotl = _module("gpu_check_axolotl")
    ctx = _ctx(tmp_path, "cuda", {})
    gpu = [run.name for run in axolotl.AXOLOTL_RUNS.values() if run.gpu_default]
    assert gpu == ["axolotl_liger", "axolotl_gem_ls"]  # the baseline first: the ratios are to it
    config = axolotl.axolotl_config(ctx, axolotl.AXOLOTL_RUNS["axolotl_gem_ls"], tmp_path / "o")
    assert config["sample_packing"] is True and config["bf16"] is True and config["gradient_checkpointing"]
    assert config["plugins"] == [axolotl.PLUGIN] and config["loss"] == "gem_ls"
    assert (config["sequence_len"], config["micro_batch_size"], config["max_steps"]) == (2048, 4, 20)
    assert config["base_model"] == "/m" and config["datasets"][0]["path"] == "/d/train.jsonl"
    liger = axolotl.axolotl_config(ctx, axolotl.AXOLOTL_RUNS["axolotl_liger"], tmp_path / "o")
    assert liger["liger_fused_linear_cross_entropy"] is True and "loss" not in liger
    assert axolotl.AXOLOTL_RUNS["axolotl_liger"].needs == ("liger_kernel", "liger-kernel")


def test_without_axolotl_on_the_gpu_each_run_reads_not_run_with_the_kits_sizes(tmp_path: Path) -> None:
    axolotl, verdicts = _module("gpu_check_axolotl"), _module("gpu_check_verdicts")
    ctx = _ctx(tmp_path, "cuda", {"axolotl": None})
    part = axolotl.run_axolotl(ctx, 60)
    why = "needs axolotl: not in the image, and no kit line for it (`make gpu-kit`)"
    assert part["runs"] == {"axolotl_liger": {"not_run": why}, "axolotl_gem_ls": {"not_run": why}}
    assert verdicts.train_part_verdict(part["runs"]).startswith(
        "not run: axolotl_liger not run (needs axolotl"
    )
    line = "does not fit: 71 wheels, 165.6 MiB (largest, MiB: llvmlite 56.9), 26.3 MiB left under the 48 MiB limit"
    (tmp_path / "kit" / "kit.json").parent.mkdir(parents=True)
    (tmp_path / "kit" / "kit.json").write_text(json.dumps({"extras": {"axolotl": {"line": line}}}))
    part = axolotl.run_axolotl(ctx, 60)
    assert part["runs"]["axolotl_gem_ls"] == {"not_run": f"needs axolotl: {line}"}
    assert not ctx.runner.records  # nothing started
