"""Outside audit "gpu goals round": the GPU goals' contract from docs/benchmarks.md ("The GPU check", "The GPU goals:
status") and the modules' docstrings, with ratios computed by hand: each goal's threshold and baseline run, the LoRA
adapter shared by ours and TRL+Liger's runs, TRL+Liger started when Liger-Kernel is installed, lm-eval's verdict,
and make gpu-kit's size arithmetic for the optional sets."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module


def _module(name: str) -> ModuleType:
    """A module of the GPU check, imported as tools/gpu_check.py imports it (tools/ on sys.path)."""
    load_module("distmatch_tool_gpu_check", REPO_ROOT / "tools" / "gpu_check.py")
    return importlib.import_module(name)


def _measured(tokens_per_s: float, peak_mib: float, **extra: Any) -> dict[str, Any]:
    return {"tokens_per_s": tokens_per_s, "peak_mib": peak_mib, "trainer_class": "SFTTrainer", **extra}


def _goals(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    verdicts, table = _module("gpu_check_verdicts"), _module("gpu_check_table")
    return {row["run"]: row for row in verdicts.goal_rows(runs, table.RUNS)}


def test_each_goal_is_met_at_exactly_its_documented_ratio() -> None:
    """docs/benchmarks.md: `gem_ls` at least 1.0x TRL+Liger's tokens/s, `ce` at least 1.05x at no more peak
    memory; at exactly those ratios the goals are met (1000 tokens/s and 2000 MiB for TRL+Liger, by hand)."""
    runs = {
        "trl_liger": _measured(1000.0, 2000.0),
        "gem_ls": _measured(1000.0, 2400.0),
        "ce": _measured(1050.0, 2000.0),
    }
    rows = _goals(runs)
    assert rows["gem_ls"]["verdict"] == "met" and rows["gem_ls"]["speed_ratio"] == pytest.approx(1.0)
    assert rows["ce"]["verdict"] == "met" and rows["ce"]["memory_ratio"] == pytest.approx(1.0)
    assert _goals({**runs, "gem_ls": _measured(990.0, 2000.0)})["gem_ls"]["verdict"].startswith("not met")


def test_the_lora_goals_ask_the_same_ratios_against_trl_liger_with_the_adapter() -> None:
    """ "the LoRA runs against TRL+Liger with the same adapter, the same ratios": `ce_lora` at 1.02x TRL+Liger
    LoRA's tokens/s is short of 1.05x, at 1.05x it is met."""
    runs = {"trl_liger_lora": _measured(500.0, 1000.0), "ce_lora": _measured(510.0, 1000.0)}
    row = _goals(runs)["ce_lora"]
    assert row["vs"] == "trl_liger_lora" and row["speed_ratio"] == pytest.approx(1.02)
    assert row["verdict"] == "not met (tokens/s 1.02x < 1.05x)"
    assert _goals({**runs, "ce_lora": _measured(525.0, 1000.0)})["ce_lora"]["verdict"] == "met"


def test_a_goal_against_a_partial_baseline_is_marked() -> None:
    """A ratio against a run cut by its time limit is marked `partial` (goal_rows' docstring), the baseline's too."""
    runs = {
        "trl_liger": _measured(1000.0, 2000.0, partial="timeout after 3 of 8 steps"),
        "gem_ls": _measured(1200.0, 1900.0),
    }
    assert _goals(runs)["gem_ls"]["verdict"] == "met (partial runs)"


def test_trl_liger_runs_with_liger_and_the_lora_runs_share_one_adapter() -> None:
    """TRL with `--use_liger_kernel` is goal 2's bar; LoRA r 16, alpha 32, no dropout, on every linear layer of the
    decoder, the same for ours and TRL+Liger's runs (docs/benchmarks.md, gpu_check_table's comment)."""
    runs = _module("gpu_check_table").RUNS
    argv = " ".join(runs["trl_liger"].argv())
    assert "--use_liger_kernel true" in argv
    adapter = (
        "--use_peft true --lora_r 16 --lora_alpha 32 --lora_dropout 0.0 --lora_target_modules q_proj k_proj "
        "v_proj o_proj gate_proj up_proj down_proj"
    )
    for name in ("trl_liger_lora", "ce_lora", "gem_ls_lora"):
        assert adapter in " ".join(runs[name].argv()), name


def test_trl_liger_is_started_when_liger_kernel_is_installed(tmp_path: Path) -> None:
    """With Liger-Kernel in the environment, `trl_liger` is started (a process named `train_trl_liger`), never
    `not run (needs liger-kernel)`."""
    check, plan, runner = (
        _module("distmatch_tool_gpu_check"),
        _module("gpu_check_plan"),
        _module("gpu_check_runner"),
    )
    steps, table = _module("gpu_check_steps"), _module("gpu_check_table")
    folders = ["--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "scratch")]
    args = check.parse_args(["--device", "cpu", "--runs", "trl_liger", *folders])
    ctx = plan.Context(args, runner.Runner(args.out, dict(os.environ), 60), table.RUNS, tmp_path / "kit")
    ctx.environment = {"torch": "2.13.0+cpu", "trl": "1.16.0", "liger_kernel": "0.6.4"}
    ctx.prepared["build"] = {"model": "/m", "data": "/d"}
    started: list[str] = []

    def run(name: str, cmd: list[str], limit: float, env: Any = None) -> dict[str, Any]:
        started.append(name)
        return {"status": "failed"}

    ctx.runner.run = run
    train = steps.run_train(ctx, 120)
    assert started == ["train_trl_liger"]
    assert "not_run" not in train["runs"]["trl_liger"]


def test_lm_eval_is_ok_only_when_every_task_has_items_and_metrics() -> None:
    """lm_eval_verdict: `ok` when every task is scored on at least one item; a task with items but no metric is
    `missing`."""
    verdict = _module("gpu_check_lm_eval").lm_eval_verdict
    scored = {"items": 4, "metrics": {"acc": 0.5}}
    part = {
        "status": "ok",
        "tasks": {"distmatch_sst2": scored, "distmatch_humaneval": {"items": 4, "metrics": {}}},
    }
    assert verdict(part) == "missing: distmatch_humaneval"
    assert verdict({**part, "tasks": {"distmatch_sst2": scored}}) == "ok"


def _fake_kit(
    monkeypatch: pytest.MonkeyPatch, traced: dict[str, dict[str, str]], sizes: dict[str, int]
) -> ModuleType:
    """gpu_kit_extras with the dry run's trace given and `pip download` writing a wheel of `sizes[name]` MiB (no
    wheel for a name not in `sizes`)."""
    extras = _module("gpu_kit_extras")
    monkeypatch.setattr(extras, "trace", lambda work, write_wheel: traced)

    def download(cmd: list[str], capture_output: bool = False) -> Any:
        name, version = cmd[-1].split("==")
        if name not in sizes:
            return SimpleNamespace(returncode=1)
        folder = Path(cmd[cmd.index("-d") + 1])
        (folder / f"{name}-{version}-py3-none-any.whl").write_bytes(b"\0" * (sizes[name] * 2**20))
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(extras.subprocess, "run", download)
    return extras


def test_the_sets_fit_under_the_limit_less_the_tree_and_the_sets_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Limit 10 MiB, working tree 3 MiB, no kit wheels: 7 MiB left; Axolotl's 4 MiB set fits (3 left), lm-eval's 4
    MiB does not (the sets are carried in order while kit, tree and sets stay under the limit)."""
    extras = _fake_kit(monkeypatch, {"axolotl": {"aaa": "1"}, "lm_eval": {"bbb": "1"}}, {"aaa": 4, "bbb": 4})
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    found = extras.add_extras(tmp_path / "kit", wheels, {"image": [], "kit": []}, 10.0, 3.0)
    assert found["axolotl"]["carried"] and not found["lm_eval"]["carried"]
    assert "3.0 MiB left under the 10 MiB limit" in found["lm_eval"]["line"]
    assert sorted(w.name for w in wheels.iterdir()) == ["aaa-1-py3-none-any.whl"]
    # The tree counts: at 7 MiB of tree neither set fits
    monkeypatch.setattr(extras, "trace", lambda work, write_wheel: {"axolotl": {"aaa": "1"}, "lm_eval": {}})
    found = extras.add_extras(tmp_path / "kit2", tmp_path / "kit2", {"image": [], "kit": []}, 10.0, 7.0)
    assert not found["axolotl"]["carried"]


def test_a_set_with_a_distribution_without_a_wheel_is_not_carried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A set whose distribution has no wheel for the image's platform stays out, its line says which."""
    extras = _fake_kit(monkeypatch, {"axolotl": {"aaa": "1", "nowheel": "2"}, "lm_eval": {}}, {"aaa": 1})
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    found = extras.add_extras(tmp_path / "kit", wheels, {"image": [], "kit": []}, 100.0, 1.0)
    assert not found["axolotl"]["carried"] and found["axolotl"]["missing"] == ["nowheel==2"]
    assert "no wheel for the image's platform: nowheel==2" in found["axolotl"]["line"]
    assert list(wheels.iterdir()) == []
