"""The benchmark scripts run end to end on tiny inputs (the harness, not the numbers: those go in docs/benchmarks.md).

Each is a real run in subprocesses: the loss benchmark at its `tiny` shape, the training benchmark through TRL's
real trainer on a tiny Llama built in code with the demo's bundled data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module
from tests.helpers.tiny_model import build_tiny_llama

pytestmark = pytest.mark.slow


def _run(args: list[str], out: Path) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(
        [sys.executable, *args, "--threads", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report,) = out.glob("*.json")
    assert report.with_suffix(".md").read_text() == proc.stdout.strip() + "\n"
    return json.loads(report.read_text())


def test_loss_benchmark_harness(tmp_path):
    data = _run(
        [
            "benchmarks/bench_losses.py",
            "--shapes",
            "tiny",
            "--paths",
            "fused",
            "--repeats",
            "1",
            "--losses",
            "ce,gem_ls,emo,dft,eaft",
            "--anchors",
            "hf_ce,torch_lce",
        ],
        tmp_path,
    )
    rows = {(r["loss"], r["path"]): r for r in data["results"]}
    assert set(rows) == {
        ("ce", "hf_ce"),
        ("ce", "torch_lce"),
        ("ce", "fused"),
        ("gem_ls", "fused"),
        ("emo", "fused"),
        ("dft", "fused"),
        ("eaft", "fused"),
    }
    assert not [r for r in rows.values() if "error" in r]
    # The same inputs in every process: CE through transformers, PyTorch and our fused rows agree; emo1's value is CE.
    for key in (("ce", "torch_lce"), ("ce", "fused"), ("emo", "fused")):
        assert rows[key]["loss_value"] == pytest.approx(rows[("ce", "hf_ce")]["loss_value"], rel=1e-5)
    # dft = sg(p_y) * CE and eaft = sg((H_k / 3) ** alpha) * CE are smaller than CE here (p_y < 1; H_k < 3 since
    # ln 20 < 3), and positive.
    for loss in ("dft", "eaft"):
        assert 0 < rows[(loss, "fused")]["loss_value"] < rows[("ce", "hf_ce")]["loss_value"]
    assert all(
        r["extra_mib"] >= 0 and r["time_s"] > 0 and r["memory_ratio"] is not None for r in rows.values()
    )


def test_fused_memory_settings_benchmark_harness(tmp_path):
    """bench_fused_memory.py: every (loss x setting) row measured in one process, with its float64 errors."""
    data = _run(
        [
            "benchmarks/bench_fused_memory.py",
            "--device",
            "cpu",
            "--shape",
            "tiny",
            "--dtype",
            "bfloat16",
            "--losses",
            "ce,emo",
            "--settings",
            "default,accum-weight",
            "--repeats",
            "1",
            "--profile",
        ],
        tmp_path,
    )
    rows = {(r["loss"], r["setting"]): r for r in data["rows"]}
    for row in rows.values():  # --profile: the heaviest operations of each case, the matmuls among them
        assert 0 < len(row["profile"]) <= 10 and all(p["ms"] > 0 and p["calls"] > 0 for p in row["profile"])
        assert [p["ms"] for p in row["profile"]] == sorted((p["ms"] for p in row["profile"]), reverse=True)
        assert any("mm" in p["op"] for p in row["profile"]), row["profile"]
    (report,) = tmp_path.glob("*.md")
    assert "Most CPU self time per case" in report.read_text()
    assert set(rows) == {(loss, s) for loss in ("ce", "emo") for s in ("default", "accum-weight")}
    for loss in ("ce", "emo"):
        default, low = rows[(loss, "default")], rows[(loss, "accum-weight")]
        assert default["time_ms"] > 0 and default["loss_value"] == low["loss_value"]
        # The float32 accumulator is bf16's rounding of the exact gradient (~1.7e-3 relative); the bf16 one more.
        assert 1e-3 < default["weight_err"] < 2e-3 and 1.2 * default["weight_err"] < low["weight_err"] < 1e-2
        assert default["hidden_err"] == low["hidden_err"] < 2e-3 and default["loss_err"] < 1e-6


def test_fused_memory_tiles_settings_run_the_tiles_mode(monkeypatch):
    """bench_fused_memory.py's `tiles` rows (measured on GPUs; the Triton kernel only) set what their names and
    docs/losses.md say: d weight by vocabulary tile, with float32 or input-dtype chunks, the default or a 60 MiB
    budget."""
    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))  # its sibling modules, as when run as a script
    bench = load_module("bench_fused_memory", REPO_ROOT / "benchmarks" / "bench_fused_memory.py")
    for env in ("DISTMATCH_CHUNK_LOGITS", "DISTMATCH_GRAD_WEIGHT_ACCUM", "DISTMATCH_CHUNK_MEMORY_MB"):
        monkeypatch.setenv(env, "unset by the test")
    expected = {"tiles": ("float32", None), "tiles-input-60": ("input", "60")}
    for setting, (logits, budget) in expected.items():
        bench._apply(setting)
        assert os.environ["DISTMATCH_GRAD_WEIGHT_ACCUM"] == "tiles"
        assert os.environ["DISTMATCH_CHUNK_LOGITS"] == logits
        assert os.environ.get("DISTMATCH_CHUNK_MEMORY_MB") == budget
    docs = (REPO_ROOT / "docs" / "losses.md").read_text()
    assert all(f"`{setting}`" in docs for setting in expected)


def test_anchored_loss_benchmark_harness(tmp_path):
    data = _run(
        [
            "benchmarks/bench_anchored.py",
            "--N",
            "64",
            "--d",
            "16",
            "--V",
            "256",
            "--repeats",
            "1",
            "--cases",
            "asft logits,asft fused",
        ],
        tmp_path,
    )
    rows = {r["case"]: r for r in data["results"]}
    assert set(rows) == {"asft logits", "asft fused"}
    assert not [r for r in rows.values() if "error" in r]
    # The same inputs in every process: both asft paths give the same loss.
    assert rows["asft fused"]["loss_value"] == pytest.approx(rows["asft logits"]["loss_value"], rel=1e-5)
    assert rows["asft fused"]["loss_value"] > 0
    assert all(r["extra_mib"] >= 0 and r["time_s"] > 0 for r in rows.values())


def test_training_benchmark_harness(tmp_path):
    model = build_tiny_llama(tmp_path / "model")
    data = _run(
        [
            "benchmarks/bench_trl_training.py",
            "--model",
            str(model),
            "--losses",
            "nll,ce,gem_ls",
            "--steps",
            "3",
            "--warmup-steps",
            "1",
            "--batch-size",
            "2",
        ],
        tmp_path / "out",
    )
    rows = {r["loss"]: r for r in data["results"]}
    assert list(rows) == ["nll", "ce", "gem_ls"] and not [r for r in rows.values() if "error" in r]
    for r in rows.values():
        # The GPU check's measurement (benchmarks/_training_probe.py): every step timed from training's start, the
        # first (--warmup-steps 1) left out of tokens/s.
        assert r["tokens_per_s"] > 0 and r["peak_mib"] > 0 and len(r["step_seconds"]) == 3
        assert r["timed_steps"] == 2 and r["timed_seconds"] == pytest.approx(sum(r["step_seconds"][1:]))
        assert r["tokens_per_s"] == pytest.approx(r["timed_tokens"] / r["timed_seconds"])
        assert r["memory_method"] == "ru_maxrss (whole process)"
        assert r["speed_ratio"] == pytest.approx(r["tokens_per_s"] / rows["nll"]["tokens_per_s"])
        assert r["memory_ratio"] == pytest.approx(r["peak_mib"] / rows["nll"]["peak_mib"])
    # The tokens counted are the batches' non-padding ones: batch 2, at most --max-length 256 each, both timed steps.
    assert all(0 < r["timed_tokens"] <= 2 * 2 * 256 for r in rows.values())
    # Same model, data, seed: our `ce` logs TRL's own `nll` value on the first step.
    assert rows["ce"]["loss_first"] == pytest.approx(rows["nll"]["loss_first"], rel=1e-4)
    assert rows["gem_ls"]["loss_first"] != pytest.approx(rows["nll"]["loss_first"], rel=1e-2)


def _bench_module(name: str):
    """A benchmark script as a module (benchmarks/ on sys.path, as when it runs): its main() in this process."""
    import importlib

    folder = str(REPO_ROOT / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def test_training_benchmark_rejects_bad_input(tmp_path, capsys):
    """In this process (its main(), exit status 2 and the message): the checks run before any model or process."""
    bench = _bench_module("bench_trl_training")
    for args, message in (
        (["--losses", "gem_lsx"], "unknown loss ['gem_lsx']"),
        (["--model", str(tmp_path)], "not a Hugging Face model folder"),
        (["--steps", "2", "--warmup-steps", "2"], "--steps must be larger than --warmup-steps"),
    ):
        try:
            status = bench.main(args)
        except SystemExit as stop:  # argparse's errors
            status = stop.code
        err = capsys.readouterr().err
        assert status == 2 and message in err, err[-2000:]
    with pytest.raises(SystemExit) as stop:
        _bench_module("bench_sharded_loss").main(["--cases", "ddp:fused,zero3:nope"])
    assert stop.value.code == 2 and "--cases: ['zero3:nope'] not SETUP:PATH" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_sharded_loss_benchmark_harness(tmp_path):
    """Two launches cover both setups and both paths: the unsharded logits path and the sharded head's fused path,
    whose rank-0 losses must agree (tests/distributed/test_fsdp2.py checks every layout x path for exactness)."""
    data = _run(
        [
            "benchmarks/bench_sharded_loss.py",
            "--cases",
            "ddp:logits,fsdp2_head:fused",
            "--losses",
            "ce",
            "--d",
            "32",
            "--vocab",
            "512",
            "--tokens",
            "64",
            "--seq",
            "32",
        ],
        tmp_path,
    )
    rows = {(r["setup"], r["path"]): r for r in data["results"]}
    assert list(rows) == [("ddp", "logits"), ("fsdp2_head", "fused")]
    assert not [r for r in rows.values() if "error" in r]
    for (_, path), r in rows.items():
        assert [x["rank"] for x in r["ranks"]] == [0, 1]
        assert all(x["path_reported"] == path and x["extra_mib"] >= 0 and x["peak_reset"] for x in r["ranks"])
    # Same model and batches on every setup and path: rank 0's loss value agrees (rank 1 has other tokens).
    values = [r["ranks"][0]["loss_value"] for r in rows.values()]
    assert max(values) - min(values) < 1e-5 * abs(values[0])


def test_demo_sampler_benchmark_harness(tmp_path):
    """bench_demo_sampler.py on a tiny Llama: two interpreters with different torch kernels, the table printed, and
    the demo's sampler drew the same samples in both."""
    model = build_tiny_llama(tmp_path / "model")
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/bench_demo_sampler.py",
            "--model",
            str(model),
            "--prompts",
            "2",
            "--samples",
            "2",
            "--tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
        cwd=REPO_ROOT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "torch kernels: AVX2 vs DEFAULT" in proc.stdout
    assert "| demo | 4 / 4 |" in proc.stdout and "| hf | " in proc.stdout
