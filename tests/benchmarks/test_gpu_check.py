"""The GPU kit and check (tools/gpu_kit.py, tools/gpu_check.sh; docs/benchmarks.md "The GPU check") on the CPU.

`make gpu-kit` needs PyPI, so here: its plan (what is carried beside the image), its wheels and its size check.
The check itself runs as a CPU dry run (`--device cpu`, tiny shapes) with a one-wheel kit whose `.pth` file proves
that the install plan's target folder is what every child process of every step imports from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.doc_commands import DocCommand, commands_of, ids
from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module

COMMANDS = commands_of("gpu-check")


def _tool(name: str) -> ModuleType:
    return load_module(f"distmatch_tool_{name}", REPO_ROOT / "tools" / f"{name}.py")


# ---------------------------------------------------------------------------------------------------------------
# make gpu-kit


def test_kit_carries_what_the_image_lacks_or_holds_at_another_version() -> None:
    kit = _tool("gpu_kit")
    image = {"torch": "2.11.0+image", "transformers": "5.17.0", "numpy": "2.5.5", "fsspec": "2026.9.0",
             "huggingface-hub": "1.33.0"}  # fmt: skip
    full = {
        **image,
        "triton": "3.6.0+image",
        "nvidia-cublas-cu13": "13.0",
        "cuda-bindings": "13.0",
        "trl": "1.16.0",
        "fsspec": "2026.8.0",  # datasets asks for another version than the image's: carried, it shadows the image's
    }
    want = {
        "fsspec": "2026.8.0",
        "huggingface-hub": "1.33.0",
        "trl": "1.16.0",
    }  # the hub client: always carried
    assert kit.kit_plan(image, full) == want


def test_stub_wheel_is_a_wheel_pip_reads(tmp_path: Path) -> None:
    kit = _tool("gpu_kit")
    wheel = kit.write_wheel(tmp_path, "torch", "2.11.0+image", {"a.py": "x = 1\n"}, requires=("jinja2",))
    assert wheel.name == "torch-2.11.0+image-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("torch-2.11.0+image.dist-info/METADATA").decode()
        record = zf.read("torch-2.11.0+image.dist-info/RECORD").decode()
    assert "Version: 2.11.0+image" in meta and "Requires-Dist: jinja2" in meta
    assert record.startswith("a.py,sha256=")


def test_size_check_fails_with_one_clear_line(tmp_path: Path) -> None:
    kit = _tool("gpu_kit")
    (tmp_path / "big-1.0-py3-none-any.whl").write_bytes(b"\0" * 2**20)
    ok, line = kit.size_check(tmp_path, REPO_ROOT, limit_mib=48)
    assert ok and line.startswith("gpu-kit size: wheels 1.0 MiB + working tree ") and line.endswith(": fits")
    ok, line = kit.size_check(tmp_path, REPO_ROOT, limit_mib=1)
    assert not ok and "limit 1 MiB (carry limit 64 MiB): TOO BIG" in line


# ---------------------------------------------------------------------------------------------------------------
# tools/gpu_check.py pieces


def test_tokens_per_second_count_only_the_steps_after_warmup() -> None:
    worker = _tool("gpu_check_worker")
    record = {"step_end_s": [10.0, 11.0, 12.0, 14.0], "step_tokens": [100, 300, 500, 900], "peak_mib": 5.0,
              "losses": [2.0, 1.5], "trainer_class": "DistMatchSFTTrainer"}  # fmt: skip
    got = worker.train_summary(record, warmup=1)
    assert got["tokens_per_s"] == pytest.approx(600 / 3) and got["timed_steps"] == 2
    assert got["s_per_step"] == pytest.approx(1.5) and (got["loss_first"], got["loss_last"]) == (2.0, 1.5)
    with pytest.raises(ValueError, match="too few"):
        worker.train_summary({**record, "step_end_s": [1.0], "step_tokens": [5]}, warmup=1)


def test_summary_table_has_every_part_and_the_ratios() -> None:
    check = _tool("gpu_check")
    run = {"tokens_per_s": 1000.0, "peak_mib": 2000.0, "s_per_step": 0.5, "loss_first": 3.0, "loss_last": 2.0,
           "trainer_class": "SFTTrainer", "speed_x_trl": 1.0, "memory_x_trl": 1.0}  # fmt: skip
    ours = {**run, "trainer_class": "DistMatchSFTTrainer", "speed_x_trl": 1.2, "memory_x_trl": 0.9,
            "first_step_after_s": 21.5}  # fmt: skip
    cut = {**ours, "partial": "timeout after 9 of 20 steps"}
    result = {
        "mode": "full on cuda",
        "environment": {
            "date": "2026-11-27 06:00 UTC",
            "device_name": "NVIDIA H100",
            "torch": "2.11.0",
            "python": "3.12.3",
        },  # fmt: skip
        "records": [{"step": "triton", "status": "ok", "seconds": 12.0}],
        "triton": {"counts": {"passed": 59}, "verdict": "pass"},
        "train": {
            "runs": {"trl": run, "gem_ls": ours, "ce": cut, "emo": {"error": "timeout"}},
            "steps": 20,
            "warmup_steps": 3,
            "batch_size": 4,
            "seq_len": 2048,
            "model": {"hidden_size": 2048, "num_hidden_layers": 4, "vocab_size": 128256, "params": 7.8e8},
        },  # fmt: skip
    }
    text = check.summary_markdown(result)
    assert "NVIDIA H100; torch 2.11.0" in text and "| triton | ok | 12.0 | |" in text
    assert "| triton | pass | passed 59 |" in text and "| bench | not run | |" in text
    assert (
        "| gem_ls | DistMatchSFTTrainer | 1000 | 1.20 | 2000 | 0.90 | 0.500 | 3.000 -> 2.000 | 21.5 |" in text
    )
    assert "| ce | DistMatchSFTTrainer (timeout after 9 of 20 steps) | 1000 |" in text
    assert "| emo | error: timeout |" in text


def test_a_run_stopped_by_its_time_limit_keeps_its_measured_steps(tmp_path: Path) -> None:
    check = _tool("gpu_check")
    probe = tmp_path / "run.probe.json"
    record = {"step_end_s": [10.0, 11.0, 12.0, 14.0], "step_tokens": [100, 300, 500, 900], "peak_mib": 5.0,
              "losses": [2.0, 1.5], "trainer_class": "DistMatchSFTTrainer", "finished": False}  # fmt: skip
    probe.write_text(json.dumps(record))
    got = check.run_result("gem_ls", "timeout", probe, warmup=1, steps=20)
    assert got["partial"] == "timeout after 4 of 20 steps" and got["tokens_per_s"] == pytest.approx(200)
    assert check.run_result("gem_ls", "ok", probe.with_name("x"), 1, 20) == {"error": "no probe record"}
    assert check.run_result("gem_ls", "failed", probe, 1, 20) == {"error": "failed"}
    assert check.run_result("trl", "ok", probe, 1, 20) == {
        "error": "trained by DistMatchSFTTrainer, not SFTTrainer"
    }
    probe.write_text(json.dumps({**record, "finished": True}))
    assert "partial" not in check.run_result("gem_ls", "ok", probe, 1, 20)
    # Either sign of a cut run is enough: killed after training ended, or exited 0 before the probe saw the end.
    assert check.run_result("gem_ls", "timeout", probe, 1, 20)["partial"] == "timeout after 4 of 20 steps"
    probe.write_text(json.dumps(record))
    assert check.run_result("gem_ls", "ok", probe, 1, 20)["partial"] == "ok after 4 of 20 steps"
    probe.write_text(json.dumps({**record, "step_end_s": [1.0], "step_tokens": [5]}))
    assert check.run_result("gem_ls", "timeout", probe, 1, 20) == {
        "error": "timeout: 1 steps recorded: too few to time"
    }


def test_train_verdict_puts_failed_runs_before_cut_ones() -> None:
    check = _tool("gpu_check")
    ok, cut, failed = (
        {"tokens_per_s": 1.0},
        {"tokens_per_s": 1.0, "partial": "timeout after 9 of 20 steps"},
        {"error": "x"},
    )
    assert check.train_verdict({"a": ok, "b": ok}) == "ok"
    assert check.train_verdict({"a": ok, "b": cut}) == "partial"
    assert check.train_verdict({"a": failed, "b": cut}) == "errors"
    assert check.train_verdict({"a": cut, "b": failed}) == "errors"
    assert check.train_verdict({}) == "errors"


def test_run_limit_sets_each_training_runs_limit() -> None:
    check = _tool("gpu_check")
    assert check.step_limits(check.parse_args([]))["train_run"] == check.LIMITS["train_run"]
    limits = check.step_limits(check.parse_args(["--run-limit", "90"]))
    assert limits["train_run"] == 90 and limits["build"] == check.LIMITS["build"]
    assert check.step_limits(check.parse_args(["--device", "cpu", "--run-limit", "7"]))["train_run"] == 7


def test_probe_record_is_on_disk_after_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run cut by its limit keeps what it measured: the record is rewritten at each step's end, and 'first step
    after s' is the first step's (later steps leave it alone)."""
    import torch

    worker = _tool("gpu_check_worker")
    probe = tmp_path / "run.probe.json"
    monkeypatch.setenv(worker.PROBE_ENV, str(probe))
    monkeypatch.setenv(worker.LAUNCHED_ENV, repr(time.time() - 100.0))

    class Host:  # the two methods the probe wraps, and the callback list of a transformers Trainer
        def __init__(self) -> None:
            self.callbacks: list = []

        def add_callback(self, callback) -> None:
            self.callbacks.append(callback)

        def training_step(self, model, inputs):
            return 0.0

    worker._patch_trainer(Host)
    host = Host()
    (callback,) = host.callbacks
    host.training_step(None, {"input_ids": torch.ones(1, 8, dtype=torch.long)})
    callback.on_step_end(None, None, None)
    first = json.loads(probe.read_text())
    assert first["step_tokens"] == [8] and not first["finished"] and first["trainer_class"] == "Host"
    assert 100 <= first["first_step_after_s"] < 200 and first["peak_mib"] > 0
    time.sleep(0.05)
    host.training_step(
        None, {"input_ids": torch.ones(1, 8), "attention_mask": torch.tensor([[1] * 5 + [0] * 3])}
    )
    callback.on_step_end(None, None, None)
    second = json.loads(probe.read_text())
    assert second["step_tokens"] == [8, 13] and not second["finished"]
    assert second["first_step_after_s"] == first["first_step_after_s"]
    callback.on_train_end(None, None, None)
    assert json.loads(probe.read_text())["finished"]


def test_every_low_memory_run_trains_its_loss_with_the_low_memory_settings() -> None:
    check = _tool("gpu_check")
    tiles = {"DISTMATCH_GRAD_WEIGHT_ACCUM": "tiles", "DISTMATCH_CHUNK_MEMORY_MB": "60"}
    assert check.TILES_ENV == {**check.LOW_MEMORY_ENV, **tiles}
    low = []
    for suffix, env in (("_lowmem", check.LOW_MEMORY_ENV), ("_tiles", check.TILES_ENV)):
        runs = [run for run in check.TRAIN_RUNS if run.endswith(suffix)]
        assert runs == [f"gem_ls{suffix}", f"emo{suffix}"]
        for run in runs:
            assert check.TRAIN_RUNS[run] == ("--loss", run.removesuffix(suffix))
            assert check.TRAIN_RUN_ENV[run] == env
        low += runs
    assert not set(check.TRAIN_RUN_ENV) - set(low)


def test_unknown_step_or_run_is_refused() -> None:
    check = _tool("gpu_check")
    for argv in (["--steps", "triton,nope"], ["--runs", "trl,gem"]):
        with pytest.raises(SystemExit):
            check.parse_args(argv)


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_documented_gpu_check_command_is_accepted(command: DocCommand) -> None:
    """Every `tools/gpu_check.sh ...` of the docs passes the driver's parser (the script hands it its arguments)."""
    check = _tool("gpu_check")
    argv = command.program_argv
    assert argv[0].endswith("tools/gpu_check.sh"), command.where
    check.parse_args(argv[1:])


# ---------------------------------------------------------------------------------------------------------------
# The CPU dry run


@pytest.mark.slow  # real processes: a `trl sft` launch, the parity trainer, pytest, the loss benchmark
def test_cpu_dry_run_runs_every_step_and_writes_the_summary(tmp_path: Path) -> None:
    check, kit = _tool("gpu_check"), _tool("gpu_kit")
    wheels = tmp_path / "kit"
    marks = tmp_path / "marks"
    marks.mkdir()
    module = "import os, pathlib\np = os.environ.get('GPU_CHECK_TEST_MARKS')\nif p:\n    pathlib.Path(p, str(os.getpid())).touch()\n"
    kit.write_wheel(wheels, "gpu-check-probe", "1.0", {"gpu_check_probe.py": module,
                                                      "gpu_check_probe.pth": "import gpu_check_probe\n"})  # fmt: skip
    out, site = tmp_path / "out", tmp_path / "site"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_TEST_MARKS": str(marks)}
    done = subprocess.run(
        ["tools/gpu_check.sh", "--device", "cpu", "--out", str(out), "--site", str(site), "--kit", str(wheels),
         "--scratch", str(tmp_path / "scratch"),
         "--runs", "gem_ls_lowmem"],  # fmt: skip
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "summary.json").read_text())
    steps = [r["step"] for r in result["records"]]
    assert steps == ["install", "triton", "memory", "build", "parity", "train_gem_ls_lowmem", "bench"]
    assert result["install"]["wheels"] == ["gpu_check_probe-1.0-py3-none-any.whl"]
    assert (site / "gpu_check_probe.py").is_file() and (site / "sitecustomize.py").is_file()
    # Every step's processes imported from the target folder: its .pth ran in each (the steps, the launch's child).
    assert len(list(marks.iterdir())) >= len(steps) + 2
    assert result["triton"]["counts"]["tests"] > 0 and result["triton"]["verdict"] in ("pass", "all skipped")
    assert result["bench"]["rows"] == 2 and result["bench"]["errors"] == 0
    assert result["memory"]["rows"] == 6 and result["memory"]["errors"] == 0  # 2 settings x ce, gem_ls, emo
    run = result["train"]["runs"]["gem_ls_lowmem"]
    assert run["trainer_class"] == "DistMatchSFTTrainer" and run["tokens_per_s"] > 0 and run["peak_mib"] > 0
    # The low-memory run's training process had its settings (float32 here: the 16-bit chunk is a no-op).
    assert check.LOW_MEMORY_ENV.items() <= run["settings"].items()
    assert (
        run["finished"]
        and "partial" not in run
        and 0 < run["trainer_ready_after_s"] < run["first_step_after_s"]
    )
    assert result["parity"]["ok"] and result["parity"]["grad_rel_err_max"] < 1e-4
    assert not list(
        out.rglob("*.safetensors")
    )  # the model and the runs' output folders stay in the scratch folder
    summary = (out / "summary.md").read_text()
    assert summary == done.stdout
    assert "| parity | pass |" in summary and "| gem_ls_lowmem | DistMatchSFTTrainer |" in summary
    assert "## Results" in summary  # the loss benchmark's own table
    assert "| gem_ls | accum-weight (float32, weight, default) |" in summary  # the memory settings' table


def test_install_unpacks_the_wheels_when_pip_fails(tmp_path: Path) -> None:
    """An image without a working pip still gets the kit: the wheels are unpacked into the target folder."""
    kit, check = _tool("gpu_kit"), _tool("gpu_check")
    kit.write_wheel(tmp_path / "kit", "probe-pkg", "1.0", {"probe_pkg.py": "X = 1\n"})

    class FailingRunner:
        def run(self, name: str, cmd: list[str], limit: float) -> dict:
            return {"step": name, "status": "failed"}

    plan = check.install(tmp_path / "kit", tmp_path / "site", FailingRunner(), 10)
    assert "unpacked" in plan["fallback"] and (tmp_path / "site" / "probe_pkg.py").read_text() == "X = 1\n"
    assert (tmp_path / "site" / "sitecustomize.py").is_file() and (tmp_path / "site-bin" / "trl").is_file()
