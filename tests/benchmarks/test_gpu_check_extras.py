"""The GPU check's `axolotl` and `lm_eval` steps (tools/gpu_check_axolotl.py, tools/gpu_check_lm_eval.py) and the
kit's optional sets for them (tools/gpu_kit_extras.py), piece by piece; the CPU dry run in test_gpu_check.py runs
both steps end to end."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

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
# make gpu-kit: the optional sets


def test_a_set_is_what_its_processes_imported_less_the_image_the_kit_and_the_sets_carried_before() -> None:
    extras = _module("gpu_kit_extras")
    imported = {
        "axolotl": "0.19.0",
        "transformers": "5.16.1",  # the image's (another version: never carried, the image's is used)
        "trl": "1.9.0",  # the kit's
        "torch": "2.13.0",
        "nvidia-cublas-cu12": "12.8",
        "distmatch": "0.1.0",
        "gpu-kit-trace": "1.0",
        "scipy": "1.17.1",
        "wandb": "0.31.0",
    }
    have = {"transformers", "trl", "wandb"}  # wandb: carried by a set before this one
    assert extras.extras_plan(imported, have, ("torch", "triton")) == {"axolotl": "0.19.0", "scipy": "1.17.1"}


def test_a_set_that_does_not_fit_is_named_with_its_largest_wheels() -> None:
    extras = _module("gpu_kit_extras")
    sizes = {"scipy.whl": 33.6, "lm_eval.whl": 8.73, "tiny.whl": 0.1}
    assert extras.fit_line(sizes, 50.0, 48) == (True, "carried: 3 wheels, 42.4 MiB")
    fits, line = extras.fit_line(sizes, 26.3, 48)
    assert not fits
    assert line == (
        "does not fit: 3 wheels, 42.4 MiB (largest, MiB: scipy.whl 33.6, lm_eval.whl 8.7, tiny.whl 0.1), "
        "26.3 MiB left under the 48 MiB limit"
    )


@pytest.mark.launches  # a Python process with the tracer
def test_the_tracer_records_each_process_imported_distributions_and_command(tmp_path: Path) -> None:
    """The one-wheel kit's module: at exit, the distribution and version of every module the process imported."""
    extras = _module("gpu_kit_extras")
    (tmp_path / "gpu_kit_trace.py").write_text(extras.TRACER)
    traces = tmp_path / "traces"
    traces.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "GPU_KIT_TRACE": str(traces)}
    subprocess.run([sys.executable, "-c", "import gpu_kit_trace, yaml", "lm_eval"], env=env, check=True)
    (record,) = [json.loads(p.read_text()) for p in traces.glob("*.json")]
    assert record["argv"][-1] == "lm_eval" and record["argv"][0] == sys.executable
    assert {extras.canonical(d) for d in record["dists"]} >= {"pyyaml"}
    import yaml

    assert record["dists"]["PyYAML"] == yaml.__version__


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


# ---------------------------------------------------------------------------------------------------------------
# The lm_eval step


def _results(out: Path, tasks: dict[str, int], seconds: float) -> None:
    folder = out / "model"
    folder.mkdir(parents=True)
    results = {
        "results": {t: {"alias": t, "acc,none": 0.5, "acc_stderr,none": 0.1} for t in tasks},
        "n-samples": {t: {"original": 10, "effective": n} for t, n in tasks.items()},
        "total_evaluation_time_seconds": str(seconds),
    }
    (folder / "results_2026-11-29.json").write_text(json.dumps(results))


def test_lm_eval_reports_its_time_per_item_and_every_task_scored(tmp_path: Path) -> None:
    lm_eval = _module("gpu_check_lm_eval")
    _results(tmp_path / "out", dict.fromkeys(lm_eval.TASKS, 4), 6.0)
    found = lm_eval.read_results(tmp_path / "out", 24.0)
    assert found["items"] == 12 and found["s_per_item"] == 2.0 and found["evaluation_s_per_item"] == 0.5
    assert found["tasks"]["distmatch_sst2"] == {"items": 4, "metrics": {"acc": 0.5}}
    part = {"status": "ok", "model": "/s/gem_ls", **found}
    assert lm_eval.lm_eval_verdict(part) == "ok"
    assert lm_eval.lm_eval_note(part) == (
        "12 items, 24.0 s, 2.00 s an item (0.50 s in lm-eval's evaluation), checkpoint gem_ls"
    )
    part["tasks"]["distmatch_humaneval"] = {"items": 0, "metrics": {}}
    assert lm_eval.lm_eval_verdict(part) == "missing: distmatch_humaneval"
    assert lm_eval.lm_eval_verdict({"status": "timeout", "model": "/m"}) == "timeout"
    assert lm_eval.lm_eval_verdict({"status": "ok", "model": "/m"}) == "no results"
    assert lm_eval.read_results(tmp_path / "empty", 1.0) == {}


def test_lm_eval_is_not_run_without_lm_eval_or_a_checkpoint(tmp_path: Path) -> None:
    lm_eval = _module("gpu_check_lm_eval")
    ctx = _ctx(tmp_path, "cuda", {"lm_eval": None})
    part = lm_eval.run_lm_eval(ctx, 60)
    assert lm_eval.lm_eval_verdict(part).startswith("not run: needs lm_eval: ")
    ctx.environment = {"lm_eval": "0.4.13"}
    assert lm_eval.run_lm_eval(ctx, 60) == {
        "not_run": "no checkpoint of gem_ls, ce, emo, asft, trl_liger, trl from the train step"
    }
    # A LoRA run's adapter is no checkpoint; a full run's saved model is, in the documented order.
    for run in ("gem_ls_lora", "ce", "gem_ls"):
        (ctx.args.scratch / run).mkdir(parents=True)
        (ctx.args.scratch / run / ("adapter_config.json" if "lora" in run else "config.json")).write_text(
            "{}"
        )
        (ctx.args.scratch / run / "model.safetensors").write_text("")
    assert lm_eval.checkpoint(ctx) == ctx.args.scratch / "gem_ls"
    argv = lm_eval.lm_eval_args(ctx, ctx.args.scratch / "gem_ls", {"encoder": "/e"}, tmp_path / "o")
    options = dict(zip(argv[4::2], argv[5::2]))
    assert argv[1:4] == ["-m", "lm_eval", "run"] and argv[-1] == "--confirm_run_unsafe_code"
    assert options["--tasks"] == "distmatch_sst2,distmatch_poem_diversity,distmatch_humaneval"
    assert "dtype=bfloat16" in options["--model_args"] and options["--batch_size"] == "16"
    metadata = json.loads(options["--metadata"])
    assert metadata["retriever_model"] == metadata["sbert_model"] == "/e"
    assert not ctx.runner.records
