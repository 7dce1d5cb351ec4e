"""The GPU check's table (tools/gpu_check_table.py, tools/gpu_check_plan.py): adding a step or a training run is one
entry, and the check plans, runs, limits and summarises it; the training runs' memory settings are `trl sft`
options; each step's seconds come from its entry (`--run-limit` for a training run)."""

from __future__ import annotations

import importlib
import json
import os
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


def _toy_steps() -> tuple[Any, Any, Any]:
    """Three steps a developer might add: one that writes which path it ran (`cpu` in the dry run), one that runs
    past its limit, and one that needs the model and data."""
    plan = _module("gpu_check_plan")

    def run_toy(ctx: Any, limit: float) -> dict[str, Any]:
        said = ctx.args.out / "toy.txt"
        path = "cpu" if ctx.args.tiny else "gpu"
        script = f"import pathlib; pathlib.Path({str(said)!r}).write_text({path!r})"
        rec = ctx.runner.run("toy", [sys.executable, "-c", script], limit)
        return {"status": rec["status"], "said": said.read_text() if said.is_file() else None}

    def run_slow(ctx: Any, limit: float) -> dict[str, Any]:
        return {"status": ctx.runner.run("toy_slow", ["sleep", "30"], limit)["status"]}

    toy = plan.Step(
        "toy",
        gpu_s=30,
        cpu_s=20,
        run=run_toy,
        verdict=lambda part, device: "pass" if part["status"] == "ok" and part["said"] else part["status"],
        note=lambda part: f"ran the {part['said']} path",
        report=lambda part: ["", f"Toy report: {part['said']}"],
    )
    slow = plan.Step(
        "toy_slow",
        gpu_s=30,
        cpu_s=1,
        run=run_slow,
        verdict=lambda part, device: "pass" if part["status"] == "ok" else part["status"],
        note=lambda part: "",
    )
    modelled = plan.Step("toy_model", gpu_s=30, cpu_s=20, run=run_toy, needs=("build",), note=lambda part: "")
    return toy, slow, modelled


def test_a_new_step_is_planned_in_the_tables_order_with_what_it_needs() -> None:
    plan, table = _module("gpu_check_plan"), _module("gpu_check_table")
    toy, slow, modelled = _toy_steps()
    steps = (*table.STEPS, toy, slow, modelled)

    def names(chosen: list[str]) -> list[str]:
        return [step.name for step in plan.plan(steps, chosen)]

    assert plan.chosen_steps(steps) == [
        "memory",
        "train",
        "axolotl",
        "lm_eval",
        "triton",
        "parity",
        "bench",
        "toy",
        "toy_slow",
        "toy_model",
    ]
    assert names(["toy"]) == ["install", "toy"]
    assert names(["toy_slow", "triton", "toy"]) == ["install", "triton", "toy", "toy_slow"]
    # The model and data are built once, before the first step that needs them.
    assert names(["toy_model"]) == ["install", "build", "toy_model"]
    assert names(["toy_model", "parity"]) == ["install", "build", "parity", "toy_model"]
    # The documented order of the shipped steps: the open questions first (Liger at the head, then end to end),
    # the loss benchmark last (it takes what is left of the budget).
    assert names(plan.chosen_steps(table.STEPS)) == [
        "install",
        "memory",
        "build",
        "train",
        "axolotl",
        "lm_eval",
        "triton",
        "parity",
        "bench",
    ]


def test_a_step_whose_preparation_failed_is_not_started(tmp_path: Path) -> None:
    """A preparation runs before the step that needs it and hands it what it made; when it fails (None) the step
    is not started and reads `not started (build failed)`, a failure."""
    check, plan, runner = (
        _module("distmatch_tool_gpu_check"),
        _module("gpu_check_plan"),
        _module("gpu_check_runner"),
    )
    table = _module("gpu_check_table")
    args = check.parse_args(["--device", "cpu", "--out", str(tmp_path / "out")])
    started: list[Any] = []

    def run_dependent(ctx: Any, limit: float) -> dict[str, Any]:
        started.append(ctx.prepared["build"])
        return {"status": "ok"}

    dependent = plan.Step(
        "toy_model",
        gpu_s=30,
        cpu_s=20,
        run=run_dependent,
        verdict=lambda part, device: "pass",
        note=lambda part: "",
        needs=("build",),
    )
    limits = {"build": 60, "toy_model": 20}
    for made, want in (
        (None, {"verdict": "not started (build failed)"}),
        ({"model": "/m"}, {"status": "ok", "verdict": "pass"}),
    ):
        build = plan.Step("build", gpu_s=45, cpu_s=60, run=lambda ctx, limit, made=made: made, when="needed")
        ctx = plan.Context(args, runner.Runner(args.out, {}, 60), table.RUNS, tmp_path / "kit")
        assert plan.run_plan(ctx, [build, dependent], limits) == {"toy_model": want}
    assert started == [{"model": "/m"}]  # only once the build had made something


@pytest.mark.launches  # the toy steps' processes and the interpreter that reads the environment line
def test_adding_a_step_is_one_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table with two more entries, through the check's own main (the CPU path): `--steps` accepts them, each runs
    under its entry's CPU limit (the slow one is cut by it), and the summary shows their processes, verdicts, details
    and report; the cut one fails the check. The shipped table does not know them."""
    check, plan, table = (
        _module("distmatch_tool_gpu_check"),
        _module("gpu_check_plan"),
        _module("gpu_check_table"),
    )
    toy, slow, _ = _toy_steps()
    steps = (*table.STEPS, toy, slow)
    monkeypatch.setattr(check, "DEFAULT_KIT", tmp_path / "no-kit")  # no pip: the environment's packages
    out = tmp_path / "out"
    folders = ["--out", str(out), "--site", str(tmp_path / "site"), "--scratch", str(tmp_path / "scratch")]
    assert check.main(["--device", "cpu", "--steps", "toy", *folders]) == 2
    assert (
        "unknown step or run: toy (steps: memory,train,axolotl,lm_eval,triton,parity,bench;"
        in capsys.readouterr().err
    )
    limits = plan.step_limits(check.parse_args(["--steps", "toy,toy_slow", *folders], steps), steps)
    assert (limits["toy"], limits["toy_slow"]) == (30, 30)  # their GPU entries; the dry run's below

    assert check.main(["--device", "cpu", "--steps", "toy_slow,toy", *folders], steps) == 1
    captured = capsys.readouterr()
    records = {rec["step"]: rec for rec in json.loads((out / "summary.json").read_text())["records"]}
    assert list(records) == ["toy", "toy_slow"]  # in the table's order; no kit, so no install process
    assert records["toy"]["status"] == "ok" and records["toy"]["limit_s"] == 20
    assert records["toy_slow"]["status"] == "timeout" and records["toy_slow"]["limit_s"] == 1
    assert records["toy_slow"]["seconds"] < 10  # cut at its limit, not after its 30 s
    text = (out / "summary.md").read_text()
    assert text == captured.out
    assert "| toy | exit 0 |" in text and "| toy_slow | timeout (1 s) |" in text
    assert "| toy | pass | ran the cpu path |" in text and "| toy_slow | timeout |  |" in text
    assert "\nToy report: cpu\n" in text
    assert "| triton | not run | |" in text  # the shipped steps not chosen
    assert captured.err.splitlines()[-1] == "gpu_check: failed: toy_slow (timeout)"


def test_run_limit_sets_each_training_runs_limit() -> None:
    check, plan, table = (
        _module("distmatch_tool_gpu_check"),
        _module("gpu_check_plan"),
        _module("gpu_check_table"),
    )
    gpu = {step.name: step.gpu_s for step in table.STEPS}
    cpu = {step.name: step.cpu_s for step in table.STEPS}
    assert plan.step_limits(check.parse_args([]), table.STEPS) == gpu
    assert plan.step_limits(check.parse_args(["--device", "cpu"]), table.STEPS) == cpu
    limits = plan.step_limits(check.parse_args(["--run-limit", "90"]), table.STEPS)
    assert limits["train"] == 90 and limits["build"] == gpu["build"] and gpu["train"] != 90
    assert (
        plan.step_limits(check.parse_args(["--device", "cpu", "--run-limit", "7"]), table.STEPS)["train"] == 7
    )


def test_every_low_memory_run_trains_its_loss_with_the_low_memory_settings() -> None:
    """docs/losses.md: the low-memory settings are 16-bit chunk logits, the weight-dtype d-weight accumulator and a
    64 MiB chunk; tiles forms d weight by vocabulary tile, in 60 MiB. Each is a `trl sft` option at a value the
    fused path accepts, given on the run's command line (never an environment variable)."""
    table = _module("gpu_check_table")
    from distmatch._loss_names import LOSS_OPTION_NAMES
    from trl_ext.losses import settings

    low = {"loss_chunk_logits": "input", "loss_grad_weight_accum": "weight", "loss_chunk_memory_mb": 64}
    assert table.LOW_MEMORY == low
    assert table.TILES == {**low, "loss_grad_weight_accum": "tiles", "loss_chunk_memory_mb": 60}
    tuned = []
    for suffix, chosen in (("_lowmem", low), ("_tiles", table.TILES)):
        runs = [run for name, run in table.RUNS.items() if name.endswith(suffix)]
        assert [run.name for run in runs] == [f"gem_ls{suffix}", f"emo{suffix}"]
        for run in runs:
            argv = run.argv()
            assert argv[:2] == ["--loss", run.name.removesuffix(suffix)]
            assert dict(zip(argv[2::2], argv[3::2])) == {
                f"--{name}": str(value) for name, value in chosen.items()
            }
        tuned += runs
    assert [run.name for run in table.RUNS.values() if run.settings] == [run.name for run in tuned]
    params = {option.name: option.param for option in settings.OPTIONS}
    for name, value in table.TILES.items() | table.LOW_MEMORY.items():
        assert name in LOSS_OPTION_NAMES and settings.problem(params[name], value) is None, name


def test_adding_a_run_is_one_entry(tmp_path: Path) -> None:
    """A run added to the table is accepted by `--runs`, given its arguments and settings after the common ones,
    and, its package missing, not started and reported as such."""
    check, plan, runner = (
        _module("distmatch_tool_gpu_check"),
        _module("gpu_check_plan"),
        _module("gpu_check_runner"),
    )
    steps, table = _module("gpu_check_steps"), _module("gpu_check_table")
    toy = plan.Run(
        "toy_run", ("--loss", "emo"), {"loss_chunk_memory_mb": 32}, needs=("no_such", "no-such-package")
    )
    runs = {**table.RUNS, "toy_run": toy}
    folders = ["--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "scratch")]
    with pytest.raises(check.Refused, match="unknown step or run: toy_run"):
        check.parse_args(["--device", "cpu", "--runs", "toy_run", *folders])
    args = check.parse_args(["--device", "cpu", "--runs", "trl,toy_run", *folders], runs=runs)
    assert args.runs == ["trl", "toy_run"]
    assert check.parse_args(["--device", "cpu", *folders], runs=runs).runs == [
        "trl",
        "gem_ls",
        "gem_ls_lora",
    ]  # not a default
    ctx = plan.Context(args, runner.Runner(args.out, dict(os.environ), 60), runs, tmp_path / "kit")
    ctx.prepared["build"] = {"model": "/m", "data": "/d"}
    argv = steps.train_args(toy, ctx, tmp_path / "toy_run")
    assert argv[:6] == [
        "--model_name_or_path",
        "/m",
        "--dataset_name",
        "/d",
        "--output_dir",
        str(tmp_path / "toy_run"),
    ]
    assert argv[-4:] == ["--loss", "emo", "--loss_chunk_memory_mb", "32"] and "--use_cpu" in argv
    ctx.environment = {"torch": "2.13.0+cpu", "no_such": None}
    args.runs = ["toy_run"]
    train = steps.run_train(ctx, 60)
    assert train["runs"] == {"toy_run": {"not_run": "needs no-such-package"}} and ctx.runner.records == []


def test_every_gpu_step_and_run_is_documented_in_benchmarks_md() -> None:
    """docs/benchmarks.md "The GPU check" names every step and every training run of the table (`trl sft` and
    Axolotl), each as `name`: a step or run added without its documentation fails here."""
    table, axolotl = _module("gpu_check_table"), _module("gpu_check_axolotl")
    text = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    section = text[text.index("## The GPU check") :]
    section = section[: section.index("\n## ", 3)]
    names = [step.name for step in table.STEPS] + list(table.RUNS) + list(axolotl.AXOLOTL_RUNS)
    missing = [name for name in names if f"`{name}`" not in section]
    assert not missing, f"not in docs/benchmarks.md's GPU check section: {missing}"


def test_the_gpu_runs_train_llama_3_2_1b_shapes_and_the_same_lora_adapter(tmp_path: Path) -> None:
    """GPU goal 2's model (Llama-3.2-1B's shapes, built in code; the dry run's tiny one on the CPU) and its LoRA
    runs: r 16 on every linear layer of the decoder, the same adapter for ours and TRL+Liger's."""
    worker, table, steps = _module("gpu_check_worker"), _module("gpu_check_table"), _module("gpu_check_steps")
    check, plan, runner = (
        _module("distmatch_tool_gpu_check"),
        _module("gpu_check_plan"),
        _module("gpu_check_runner"),
    )
    shape = worker.MODEL_SHAPES["llama32_1b"]
    assert (shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]) == (2048, 16, 128256)
    assert (shape["num_attention_heads"], shape["num_key_value_heads"], shape["tie_word_embeddings"]) == (
        32,
        8,
        True,
    )
    started: list[list[str]] = []
    for device, want in (("cuda", "llama32_1b"), ("cpu", "tiny")):
        args = check.parse_args(
            ["--device", device, "--out", str(tmp_path / "out"), "--scratch", str(tmp_path)]
        )
        ctx = plan.Context(args, runner.Runner(args.out, {}, 60), table.RUNS, tmp_path / "kit")
        ctx.runner.run = lambda name, cmd, limit, env=None: started.append(cmd) or {"status": "failed"}
        assert steps.run_build(ctx, 60) is None
        assert started[-1][started[-1].index("--shape") + 1] == want
    lora = {name: table.RUNS[name].argv() for name in ("trl_liger_lora", "ce_lora", "gem_ls_lora")}
    adapters = {name: argv[argv.index("--use_peft") :] for name, argv in lora.items()}
    assert adapters["trl_liger_lora"] == adapters["ce_lora"] == adapters["gem_ls_lora"]
    adapter = adapters["ce_lora"]
    assert adapter[:4] == ["--use_peft", "true", "--lora_r", "16"]
    assert adapter[adapter.index("--lora_target_modules") + 1 :] == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    ]  # fmt: skip
    assert lora["trl_liger_lora"][:2] == ["--use_liger_kernel", "true"]
    gpu = [run.name for run in table.RUNS.values() if run.gpu_default]
    assert gpu == ["trl_liger", "ce", "gem_ls", "emo", "trl_liger_lora", "ce_lora", "gem_ls_lora", "asft"]
