"""The training measurement (benchmarks/_training_probe.py) as the GPU check's train step reads it: tokens per second
after the untimed steps, the probe's record on disk after every step, a run cut by its time limit, the ratios to
TRL's default run, the train step's verdict (tools/gpu_check_verdicts.py) and its table (tools/gpu_check_summary.py).
The records are written as the probe writes them (values from a real CPU run's)."""

from __future__ import annotations

import importlib
import json
import os
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module


def _module(name: str) -> ModuleType:
    """A module of the GPU check (or the training measurement), imported as tools/gpu_check.py imports it."""
    load_module("distmatch_tool_gpu_check", REPO_ROOT / "tools" / "gpu_check.py")
    return importlib.import_module(name)


def test_tokens_per_second_count_only_the_steps_after_warmup() -> None:
    """The first `warmup` steps are not timed: tokens/s is the later steps' tokens over their wall time, from the end
    of the last untimed step (training's start when none is untimed) to the end of the last step."""
    probe = _module("_training_probe")
    # Steps of 1, 1, 1 and 2 s after training began at 9 s, training 100, 200, 200 and 400 tokens.
    record = {
        "train_begin_s": 9.0,
        "step_end_s": [10.0, 11.0, 12.0, 14.0],
        "step_tokens": [100, 300, 500, 900],
        "peak_mib": 5.0,
        "losses": [2.0, 1.5],
        "trainer_class": "DistMatchSFTTrainer",
    }
    got = probe.summarise(record, warmup=2)  # steps 3 and 4: 600 tokens in 3 s
    assert got["tokens_per_s"] == pytest.approx(600 / 3) and got["timed_steps"] == 2
    assert got["timed_tokens"] == 600 and got["s_per_step"] == pytest.approx(1.5)
    assert got["step_seconds"] == pytest.approx([1.0, 1.0, 1.0, 2.0])
    assert (got["loss_first"], got["loss_last"], got["steps_done"]) == (2.0, 1.5, 4)
    assert probe.summarise(record, warmup=0)["tokens_per_s"] == pytest.approx(900 / 5)
    assert probe.summarise(record, warmup=1)["tokens_per_s"] == pytest.approx(800 / 4)
    # Without training's start (a record cut short of it) the first step cannot be timed: at least it is left out.
    unstarted = {k: v for k, v in record.items() if k != "train_begin_s"}
    assert probe.summarise(unstarted, warmup=0)["timed_steps"] == 3
    assert probe.summarise(unstarted, warmup=1)["step_seconds"][0] is None
    # A run cut before its untimed steps were done is timed after its first step.
    cut = probe.summarise(record, warmup=4)
    assert cut["timed_steps"] == 3 and cut["tokens_per_s"] == pytest.approx(800 / 4)
    with pytest.raises(ValueError, match="too few"):
        probe.summarise({**record, "step_end_s": [1.0], "step_tokens": [5]}, warmup=1)


def test_probe_record_is_on_disk_after_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run cut by its limit keeps what it measured: the record is rewritten at each step's end, and 'first step
    after s' is the first step's (later steps leave it alone). The options the run trained with, and its trainable
    parameters, are recorded."""
    import torch

    probe = _module("_training_probe")
    target = tmp_path / "run.probe.json"
    monkeypatch.setenv(probe.LAUNCHED_ENV, repr(time.time() - 100.0))

    class Host:  # what the probe uses of a transformers Trainer: its arguments, callbacks and training step
        def __init__(self) -> None:
            self.callbacks: list = []
            self.args = SimpleNamespace(
                device=torch.device("cpu"), loss="gem_ls", gem_beta=None, loss_chunk_memory_mb=64.0
            )
            self.model = torch.nn.Linear(2, 3)  # its bias frozen, as an adapter run freezes the base model
            self.model.bias.requires_grad_(False)

        def add_callback(self, callback) -> None:
            self.callbacks.append(callback)

        def training_step(self, model, inputs):
            return 0.0

    probe.measure_every_trainer(Host, target)
    host = Host()
    (callback,) = host.callbacks
    callback.on_train_begin(None, None, None)
    host.training_step(None, {"input_ids": torch.ones(1, 8, dtype=torch.long)})
    callback.on_step_end(None, None, None)
    first = json.loads(target.read_text())
    assert first["step_tokens"] == [8] and not first["finished"] and first["trainer_class"] == "Host"
    assert 100 <= first["first_step_after_s"] < 200 and first["peak_mib"] > 0
    assert first["settings"] == {"loss_chunk_memory_mb": 64.0}
    assert first["trainable_params"] == 6  # the weight's 2 x 3, not the frozen bias
    time.sleep(0.05)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    host.training_step(None, {"input_ids": torch.ones(1, 8), "attention_mask": mask})
    callback.on_step_end(None, None, None)
    second = json.loads(target.read_text())
    assert second["step_tokens"] == [8, 13] and not second["finished"]
    assert second["first_step_after_s"] == first["first_step_after_s"]
    callback.on_train_end(None, None, None)
    assert json.loads(target.read_text())["finished"]


def test_a_run_stopped_by_its_time_limit_keeps_its_measured_steps(tmp_path: Path) -> None:
    verdicts, table = _module("gpu_check_verdicts"), _module("gpu_check_table")
    gem_ls, trl = table.RUNS["gem_ls"], table.RUNS["trl"]
    probe = tmp_path / "run.probe.json"
    record = {
        "step_end_s": [10.0, 11.0, 12.0, 14.0],
        "step_tokens": [100, 300, 500, 900],
        "peak_mib": 5.0,
        "losses": [2.0, 1.5],
        "trainer_class": "DistMatchSFTTrainer",
        "finished": False,
    }
    probe.write_text(json.dumps(record))
    got = verdicts.run_result(gem_ls, "timeout", probe, warmup=1, steps=20)
    assert got["partial"] == "timeout after 4 of 20 steps" and got["tokens_per_s"] == pytest.approx(200)
    assert verdicts.run_result(gem_ls, "ok", probe.with_name("x"), 1, 20) == {"error": "no probe record"}
    assert verdicts.run_result(gem_ls, "failed", probe, 1, 20) == {"error": "failed"}
    assert verdicts.run_result(trl, "ok", probe, 1, 20) == {
        "error": "trained by DistMatchSFTTrainer, not SFTTrainer"
    }
    probe.write_text(json.dumps({**record, "finished": True}))
    assert "partial" not in verdicts.run_result(gem_ls, "ok", probe, 1, 20)
    # Either sign of a cut run is enough: killed after training ended, or exited 0 before the probe saw the end.
    assert verdicts.run_result(gem_ls, "timeout", probe, 1, 20)["partial"] == "timeout after 4 of 20 steps"
    probe.write_text(json.dumps(record))
    assert verdicts.run_result(gem_ls, "ok", probe, 1, 20)["partial"] == "ok after 4 of 20 steps"
    probe.write_text(json.dumps({**record, "step_end_s": [1.0], "step_tokens": [5]}))
    too_few = verdicts.run_result(gem_ls, "timeout", probe, 1, 20)
    assert too_few == {"error": "timeout: 1 steps recorded: too few to time"}


def test_train_verdict_puts_failed_runs_before_cut_ones() -> None:
    verdicts = _module("gpu_check_verdicts")
    ok, cut, failed = (
        {"tokens_per_s": 1.0},
        {"tokens_per_s": 1.0, "partial": "timeout after 9 of 20 steps"},
        {"error": "x"},
    )
    assert verdicts.train_verdict({"a": ok, "b": ok}) == "ok"
    assert verdicts.train_verdict({"a": ok, "b": cut}) == "partial"
    assert verdicts.train_verdict({"a": failed, "b": cut}) == "errors"
    assert verdicts.train_verdict({"a": cut, "b": failed}) == "errors"
    assert verdicts.train_verdict({}) == "errors"


def _probe(path: Path, trainer: str, tokens: list[int], ends: list[float], peak: float, **extra: Any) -> Path:
    """A probe record as benchmarks/_training_probe.py writes it after each step (values from a real CPU run's)."""
    record = {
        "tokens": tokens[-1],
        "step_tokens": tokens,
        "train_begin_s": ends[0] - 1.0,
        "step_end_s": ends,
        "losses": [8.33, 8.32, 8.31],
        "finished": True,
        "device": "cpu",
        "settings": {},
        "trainer_ready_after_s": 7.8,
        "trainer_class": trainer,
        "first_step_after_s": 8.1,
        "peak_mib": peak,
        "memory_method": "ru_maxrss (whole process)",
        **extra,
    }
    path.write_text(json.dumps(record))
    return path


def _train_result(runs: dict[str, Any], baseline: str) -> dict[str, Any]:
    env = {"date": "2026-11-29 04:25 UTC", "device_name": "cpu", "torch": "2.13.0+cpu", "python": "3.11.7"}
    model = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 4096, "params": 1.2e6}
    train = {
        "runs": runs,
        "baseline": baseline,
        "steps": 3,
        "warmup_steps": 1,
        "batch_size": 1,
        "seq_len": 128,
        "model": model,
        "verdict": "ok",
    }
    return {"mode": "dry run, tiny shapes on cpu", "environment": env, "records": [], "train": train}


def test_training_ratios_are_each_run_over_trls_default(tmp_path: Path) -> None:
    """x TRL default: a run's tokens/s over the `trl` run's, its peak MiB over the `trl` run's (both timed after the
    untimed first step), in summary.json and in the summary's training table."""
    probe, verdicts = _module("_training_probe"), _module("gpu_check_verdicts")
    summary, table = _module("gpu_check_summary"), _module("gpu_check_table")
    gem_ls, trl_run = table.RUNS["gem_ls"], table.RUNS["trl"]
    # After the untimed first step, trl trains 256 tokens in 0.4 s (640 tokens/s) and gem_ls 512 tokens in 0.5 s
    # (1024 tokens/s); peaks 661 and 631 MiB.
    trl = _probe(tmp_path / "trl.json", "SFTTrainer", [100, 228, 356], [10.0, 10.2, 10.4], 661.0)
    ours = _probe(tmp_path / "ours.json", "DistMatchSFTTrainer", [100, 356, 612], [20.0, 20.25, 20.5], 631.0)
    runs = {
        "trl": verdicts.run_result(trl_run, "ok", trl, 1, 3),
        "gem_ls": verdicts.run_result(gem_ls, "ok", ours, 1, 3),
    }
    assert probe.add_ratios(runs, "trl") == "ok"
    speed, memory = 1024 / 640, 631 / 661  # 1.6 and 0.9546: faster and smaller than TRL's, not the inverse
    assert runs["gem_ls"]["speed_ratio"] == pytest.approx(speed, rel=1e-6)
    assert runs["gem_ls"]["memory_ratio"] == pytest.approx(memory, rel=1e-6)
    assert runs["trl"]["speed_ratio"] == runs["trl"]["memory_ratio"] == 1.0
    assert "ratio_note" not in runs["gem_ls"]
    text = summary.summary_markdown(_train_result(runs, "ok"), table.STEPS)
    assert "| gem_ls | DistMatchSFTTrainer | 1024 | 1.60 | 631 | 0.95 | 0.250 |" in text
    assert "| trl | SFTTrainer | 640 | 1.00 | 661 | 1.00 | 0.200 |" in text
    assert "x TRL default (ratio" not in text  # no note under a table of full measurements

    # A baseline cut by its time limit: the ratios are taken but each is marked, with the reason under the table.
    _probe(trl, "SFTTrainer", [100, 228, 356], [10.0, 10.2, 10.4], 661.0, finished=False)
    runs["trl"] = verdicts.run_result(trl_run, "timeout", trl, 1, 20)
    runs["gem_ls"] = verdicts.run_result(gem_ls, "ok", ours, 1, 3)
    baseline = probe.add_ratios(runs, "trl")
    assert baseline == "partial: timeout after 3 of 20 steps"
    assert runs["gem_ls"]["ratio_note"] == "against a partial trl run (timeout after 3 of 20 steps)"
    assert runs["gem_ls"]["speed_ratio"] == pytest.approx(speed, rel=1e-6)
    text = summary.summary_markdown(_train_result(runs, baseline), table.STEPS)
    assert "| gem_ls | DistMatchSFTTrainer | 1024 | 1.60* | 631 | 0.95* |" in text
    note = "\\* x TRL default (ratio to the `trl` run): against a partial run (timeout after 3 of 20 steps)"
    assert note in text

    # A failed baseline: no ratios at all, and the table says why.
    runs = {
        "trl": verdicts.run_result(trl_run, "failed", trl, 1, 3),
        "gem_ls": verdicts.run_result(gem_ls, "ok", ours, 1, 3),
    }
    baseline = probe.add_ratios(runs, "trl")
    assert baseline == "trl failed: failed" and "speed_ratio" not in runs["gem_ls"]
    text = summary.summary_markdown(_train_result(runs, baseline), table.STEPS)
    assert "| gem_ls | DistMatchSFTTrainer | 1024 | n/a | 631 | n/a |" in text
    assert "x TRL default (ratio to the `trl` run): none (trl failed: failed)" in text
    assert probe.add_ratios({"gem_ls": verdicts.run_result(gem_ls, "ok", ours, 1, 3)}, "trl") == "no trl run"


def test_a_run_whose_package_is_missing_is_not_run_and_never_ok(tmp_path: Path) -> None:
    """`trl_liger` without Liger-Kernel: not started (no process), `not run (needs liger-kernel)`; the train step is
    `partial` beside measured runs, `not run` alone, and `errors` still wins."""
    check, plan, runner = (
        _module("distmatch_tool_gpu_check"),
        _module("gpu_check_plan"),
        _module("gpu_check_runner"),
    )
    steps, verdicts = _module("gpu_check_steps"), _module("gpu_check_verdicts")
    summary, table = _module("gpu_check_summary"), _module("gpu_check_table")
    out, scratch = str(tmp_path / "out"), str(tmp_path / "scratch")
    args = check.parse_args(["--device", "cpu", "--runs", "trl_liger", "--out", out, "--scratch", scratch])
    ctx = plan.Context(args, runner.Runner(args.out, dict(os.environ), 60), table.RUNS, tmp_path / "kit")
    ctx.environment = {"torch": "2.13.0+cpu", "trl": "1.16.0", "liger_kernel": None}
    train = steps.run_train(ctx, 120)
    assert train["runs"] == {"trl_liger": {"not_run": "needs liger-kernel"}} and ctx.runner.records == []
    assert train["baseline"] == "no trl run"
    assert verdicts.train_part_verdict(train["runs"]) == "not run: trl_liger not run (needs liger-kernel)"
    measured = {
        "tokens_per_s": 320.0,
        "peak_mib": 661.0,
        "s_per_step": 0.4,
        "loss_first": 8.3,
        "loss_last": 8.2,
        "trainer_class": "SFTTrainer",
        "speed_ratio": 1.0,
        "memory_ratio": 1.0,
    }
    runs = {"trl": measured, **train["runs"]}
    assert verdicts.train_part_verdict(runs) == "partial: trl_liger not run (needs liger-kernel)"
    assert verdicts.train_part_verdict({**runs, "ce": {"error": "failed"}}) == "errors"
    text = summary.summary_markdown(_train_result(runs, "ok"), table.STEPS)
    assert "| trl_liger | not run (needs liger-kernel) |" in text
    assert (
        summary.train_note({"runs": runs}) == "1 of 2 runs measured; not run: trl_liger (needs liger-kernel)"
    )


def test_goals_are_each_runs_ratios_to_trl_with_liger(tmp_path: Path) -> None:
    """GPU goal 2, read from the table's `Goal`s: `ce` at least 1.05x TRL+Liger's tokens/s at no more peak
    memory, `gem_ls` at least 1.0x, `emo` at least 0.85x, the LoRA runs against TRL+Liger with the same adapter,
    `asft` reported; a run or baseline missing reads `not measured`, never met."""
    verdicts, summary, table = (
        _module("gpu_check_verdicts"),
        _module("gpu_check_summary"),
        _module("gpu_check_table"),
    )
    # TRL+Liger: 1000 tokens/s (256 tokens in 0.256 s), 600 MiB.
    liger = _probe(tmp_path / "liger.json", "SFTTrainer", [100, 228, 356], [1.0, 1.128, 1.256], 600.0)

    def ours(name: str, seconds: float, peak: float) -> dict[str, Any]:
        path = _probe(
            tmp_path / f"{name}.json", "DistMatchSFTTrainer", [100, 228, 356], [1.0, 1.0, 1.0 + seconds], peak
        )
        return verdicts.run_result(table.RUNS[name], "ok", path, 1, 3)

    runs = {
        "trl_liger": verdicts.run_result(table.RUNS["trl_liger"], "ok", liger, 1, 3),
        "ce": ours("ce", 0.256 / 1.10, 600.0),  # 1.10x at the same memory: met
        "gem_ls": ours("gem_ls", 0.256 / 0.99, 500.0),  # 0.99x: not met
        "emo": ours("emo", 0.256 / 0.90, 700.0),  # 0.90x, more memory (not asked): met
        "asft": ours("asft", 0.256, 650.0),
        "gem_ls_lora": ours("gem_ls_lora", 0.256, 300.0),  # no trl_liger_lora run
        "ce_lora": {"not_run": "needs liger-kernel"},
    }
    runs["ce_big"] = ours("ce", 0.256 / 1.2, 601.0)  # a run not in the table: no goal
    goals = {g["run"]: g for g in verdicts.goal_rows(runs, table.RUNS)}
    assert {name: g["verdict"] for name, g in goals.items()} == {
        "ce": "met",
        "gem_ls": "not met (tokens/s 0.99x < 1x)",
        "emo": "met",
        "asft": "reported",
        "gem_ls_lora": "not measured (no trl_liger_lora run)",
        "ce_lora": "not measured (ce_lora needs liger-kernel; no trl_liger_lora run)",
    }
    assert goals["ce"]["speed_ratio"] == pytest.approx(1.10) and goals["ce"]["memory_ratio"] == 1.0
    assert goals["ce"]["goal"] == ">= 1.05x tokens/s, <= 1x peak memory" and goals["emo"]["vs"] == "trl_liger"
    # Slower at the same speed goal, or more memory: each shortfall named.
    runs["ce"] = ours("ce", 0.256, 660.0)
    (ce,) = [g for g in verdicts.goal_rows(runs, table.RUNS) if g["run"] == "ce"]
    assert ce["verdict"] == "not met (tokens/s 1.00x < 1.05x, peak memory 1.10x > 1x)"
    result = _train_result(runs, "no trl run")
    result["train"]["goals"] = verdicts.goal_rows(runs, table.RUNS)
    text = summary.summary_markdown(result, table.STEPS)
    assert "| emo | trl_liger | 0.90 | 1.17 | >= 0.85x tokens/s | met |" in text
    assert "| asft | trl_liger | 1.00 | 1.08 | reported | reported |" in text
    assert "goals met: 1 of 3 measured (6 runs with a goal)" in text
