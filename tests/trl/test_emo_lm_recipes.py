"""EMO Table 1's language-modeling recipes (GPT-2 / OPT-125M on the six open-ended corpora; GPU-scale), offline.

* `examples/reproduce/emo_lm_data.py` runs on the open-ended corpus fixtures (tests/eval/fixtures/open_ended: Hub
  parquet, raw text, JSON lines) through the benchmark's reader and writes the train / validation JSONL that
  `datasets.load_dataset(FOLDER)` reads as two splits; bad input is one line; its documented commands parse.
* `examples/trl/emo_lm_{gpt2,opt125m}.yaml` parse through `trl sft`'s parser and our checks with the paper's settings
  (EMO Section 4.1), the loss switches on the command line, and the GPT-2 recipe trains for its 3 epochs on prepared
  rows (a tiny GPT-2 built in code in place of gpt2): 256-token blocks across rows, one evaluation per epoch and the
  lowest-validation-loss checkpoint kept.
* `examples/reproduce/emo_lm_table1.sh`: syntax and a dry run (every command it prints, parsed by its program's
  parser). The Axolotl recipe is validated offline in tests/axolotl/test_plugin.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.doc_commands import DocCommand, commands_of, ids
from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module

FIXTURES = REPO_ROOT / "tests" / "eval" / "fixtures" / "open_ended"
#: corpus -> (training file, validation file or None): each corpus in a format its reader accepts
SOURCES = {
    "wikitext2": ("wikitext2_test-00000-of-00001.parquet", "wikitext103_wiki.test.raw"),  # Hub parquet, raw
    "wikitext103": ("wikitext103_wiki.test.raw", "wikitext2_test-00000-of-00001.parquet"),
    "ptb": ("ptb.test.txt", "ptb.test.txt"),  # the text-only release, one sentence a line
    "webtext": ("webtext.test.jsonl", "webtext.test.jsonl"),  # MixCE / GPT-2 output-dataset records
    "writingprompts": ("writingprompts.test.jsonl", "writingprompts.test.jsonl"),
    "ag_news": ("ag_news_test-00000-of-00001.parquet", None),  # no validation split: 5% held out
}
COMMANDS = commands_of("emo-lm-data")
RECIPE = REPO_ROOT / "examples" / "reproduce" / "emo_lm_table1.sh"


def _script() -> ModuleType:
    return load_module("emo_lm_data", REPO_ROOT / "examples" / "reproduce" / "emo_lm_data.py", register=False)


def _read(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]


def _prepare(corpus: str, out: Path) -> int:
    train, valid = SOURCES[corpus]
    argv = [corpus, "--source", str(FIXTURES / train), "--out", str(out)]
    return _script().main([*argv, "--valid-source", str(FIXTURES / valid)] if valid else argv)


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_documented_data_command_parses(command: DocCommand) -> None:
    args = _script().build_parser().parse_args(command.program_argv[2:])
    assert args.out == f"data/emo_lm/{args.corpus}"


@pytest.mark.parametrize("corpus", list(SOURCES))
def test_data_script_writes_the_splits_of_each_format(
    corpus: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from eval_tasks.open_ended.open_ended import read_corpus

    out = tmp_path / corpus
    assert _prepare(corpus, out) == 0
    train, valid = _read(out / "train.jsonl"), _read(out / "validation.jsonl")
    source, valid_source = SOURCES[corpus]
    rows = [r for r in read_corpus(corpus, FIXTURES / source) if r.strip()]  # the benchmark's own reader
    if valid_source is None:  # AG News: the first 5% (at least one row) held out, the rest for training
        assert (valid, train) == (rows[:1], rows[1:])
    else:
        assert train == rows
        assert valid == [r for r in read_corpus(corpus, FIXTURES / valid_source) if r.strip()]
    assert all(text.strip() for text in train + valid)  # WikiText's empty lines dropped
    assert f"{corpus}: {len(train)} training rows, {len(valid)} validation" in capsys.readouterr().out
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset(str(out))  # what `trl sft --dataset_name FOLDER` reads
    assert set(loaded) == {"train", "validation"} and loaded["train"]["text"] == train


def test_ag_news_holds_out_five_percent() -> None:
    assert _script().VALIDATION_PERCENT == 5  # run_lm.py: --validation_split_percentage 5 (train[:5%])
    assert _script().NO_VALIDATION_SPLIT == {"ag_news"}
    # MixCE split files / the GPT-2 output dataset's (Table 2's oracle data), no Hub copy
    assert _script().FILES_ONLY == {"webtext", "writingprompts", "gpt2_large"}


def test_data_script_refuses_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    webtext = str(FIXTURES / "webtext.test.jsonl")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n", encoding="utf-8")  # rows, none with text
    cases = [
        (["webtext", "--source", webtext], "webtext: has no Hub copy; give MixCE's split files"),
        (["writingprompts"], "writingprompts: has no Hub copy"),
        (["ptb", "--source", str(FIXTURES / "ptb.test.txt")], "ptb: --source given without --valid-source"),
        (["ptb", "--valid-source", webtext], "--valid-source needs --source"),
        (
            ["ptb", "--source", str(tmp_path / "none.txt"), "--valid-source", webtext],
            "none.txt: no such file",
        ),
        (
            ["webtext", "--source", webtext, "--valid-source", str(empty)],
            "webtext: no validation row with text",
        ),
    ]
    for argv, message in cases:
        assert _script().main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("emo_lm_data: ") and message in err[0], err
    assert not out.exists()  # refused before writing


# ---------------------------------------------------------------------------------------------------------
# The TRL recipes


def _parse_recipe(model: str, *extra: str):  # noqa: ANN202
    from trl_ext.cli import check_parsed, make_sft_parser

    parsed = make_sft_parser().parse_args_and_config(
        ["--config", str(REPO_ROOT / f"examples/trl/emo_lm_{model}.yaml"), "--use_cpu", "true", *extra],
        return_remaining_strings=True,
        separate_remaining_strings=True,
    )
    check_parsed(parsed[:4])
    return parsed


@pytest.mark.parametrize(("model", "hub_id"), [("gpt2", "gpt2"), ("opt125m", "facebook/opt-125m")])
def test_trl_recipe_has_the_paper_settings(model: str, hub_id: str) -> None:
    pytest.importorskip("trl")
    script, training, model_args = _parse_recipe(model)[:3]
    assert model_args.model_name_or_path == hub_id
    settings = {
        "loss": "emo",
        "num_train_epochs": 3,  # EMO 4.1: 3 epochs, AdamW, lr 5e-5, batch 32, max input length 256
        "learning_rate": 5e-5,
        "per_device_train_batch_size": 32,
        "gradient_accumulation_steps": 1,
        "max_length": 256,
        "packing": True,
        "packing_strategy": "wrapped",  # run_lm.py: the rows concatenated and cut into 256-token blocks
        "dataset_text_field": "text",
        "load_best_model_at_end": True,  # the lowest validation loss
        "metric_for_best_model": "eval_loss",
        "greater_is_better": False,
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "bf16": False,
    }
    assert {k: getattr(training, k) for k in settings} == settings
    value = {
        k: getattr(getattr(training, k), "value", getattr(training, k))
        for k in ("optim", "lr_scheduler_type", "eval_strategy", "save_strategy")
    }
    assert value == {
        "optim": "adamw_torch",
        "lr_scheduler_type": "linear",
        "eval_strategy": "epoch",
        "save_strategy": "epoch",
    }
    options = training.loss_options()  # the authors' GPT-2 code, mode emo: emo1, the pre-trained head frozen
    assert (options["emo_weighting"], options["emo_cost_embedding"], options["emo_ratio_clamp"]) == (
        "emo1",
        "frozen",
        None,
    )
    # gpt2.py's D keeps the target's own mass (no gt_q): `--emo_target_mass included`, given on the command line
    # (the recipe's documented command, emo_lm_table1.sh) so that the file stays valid with `--loss ce`
    assert training.emo_target_mass is None
    header = (REPO_ROOT / f"examples/trl/emo_lm_{model}.yaml").read_text(encoding="utf-8")
    assert f"trl sft --config examples/trl/emo_lm_{model}.yaml --emo_target_mass included" in header
    included = _parse_recipe(model, "--emo_target_mass", "included")[1].loss_options()
    assert {**options, "emo_target_mass": "included"} == included
    assert (script.dataset_name, script.dataset_train_split, script.dataset_test_split) == (
        "data/emo_lm/wikitext2",
        "train",
        "validation",
    )


@pytest.mark.parametrize(
    ("extra", "loss", "option", "value"),
    [
        (["--loss", "ce"], "ce", None, None),
        (["--loss", "mixce", "--mixce_gamma", "0.9"], "mixce", "mixce_gamma", 0.9),
        (
            ["--loss", "tailr", "--tailr_variant", "emo_code", "--tailr_gamma", "0.7"],
            "tailr",
            "tailr_gamma",
            0.7,
        ),
    ],
)
def test_trl_recipe_switches_loss_on_the_command_line(
    extra: list[str], loss: str, option: str | None, value: float | None
) -> None:
    pytest.importorskip("trl")
    training = _parse_recipe("gpt2", *extra)[1]
    assert training.loss == loss
    if option is not None:
        assert training.loss_options()[option] == value


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_trl_recipe_trains_its_epochs_and_keeps_the_best_checkpoint(tmp_path: Path) -> None:
    """The GPT-2 recipe's data, packing, loss, evaluation and checkpoint settings on a tiny GPT-2: 3 epochs of one
    step each; a learning rate high enough (3.0) that the later epochs are worse, so the model saved at the end is
    epoch 1's (what `load_best_model_at_end` on eval_loss does)."""
    pytest.importorskip("trl")
    import torch
    from datasets import load_dataset
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from trl_ext.testing import build_tokenizer
    from trl_ext.trainer import DistMatchSFTTrainer

    assert _prepare("writingprompts", tmp_path / "d") == 0
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model_dir = tmp_path / "gpt2"
    GPT2LMHeadModel(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "out"
    script, training, model_args = _parse_recipe(
        "gpt2",
        "--model_name_or_path",
        str(model_dir),
        "--dataset_name",
        str(tmp_path / "d"),
        "--output_dir",
        str(out),
        "--report_to",
        "none",
        "--learning_rate",
        "3.0",
        "--disable_tqdm",
        "true",
    )[:3]
    data = load_dataset(script.dataset_name)  # as TRL's sft script loads `dataset_name`
    trainer = DistMatchSFTTrainer(
        model=GPT2LMHeadModel.from_pretrained(model_args.model_name_or_path, dtype=torch.float32),
        args=training,
        train_dataset=data[script.dataset_train_split],
        eval_dataset=data[script.dataset_test_split],
        processing_class=AutoTokenizer.from_pretrained(model_args.model_name_or_path),
    )
    blocks = [row["input_ids"] for row in trainer.train_dataset]
    # 256-token blocks, then the rest
    assert {len(b) for b in blocks[:-1]} == {256} and 0 < len(blocks[-1]) <= 256
    assert len(blocks) <= 32  # one batch of 32: one step per epoch
    rows = [
        tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
        for text in _read(tmp_path / "d" / "train.jsonl")
    ]
    # the rows in order, cut across their boundaries (TRL's EOS after each)
    assert sum(blocks, []) == sum(rows, [])
    assert all(len(r) != 256 for r in rows)  # so the blocks are not the rows
    trainer.train()
    evals = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    assert len(evals) == 3 and all(math.isfinite(x) for x in evals)  # one evaluation per epoch
    best = min(range(3), key=evals.__getitem__)
    assert best < 2 and trainer.state.best_metric == evals[best]  # the last epoch is not the best here
    trainer.save_model(str(out))  # what `trl sft` does after training
    checkpoint = Path(trainer.state.best_model_checkpoint)
    assert checkpoint.name == f"checkpoint-{best + 1}"
    saved, kept = load_file(out / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    assert saved.keys() == kept.keys() and all(torch.equal(saved[k], kept[k]) for k in saved)
    assert json.loads((out / "distmatch.json").read_text())["loss"] == "emo"


# ---------------------------------------------------------------------------------------------------------
# The Table 1 loop (GPU-scale): syntax and a dry run


def test_table1_recipe_dry_run_prints_accepted_commands(tmp_path: Path) -> None:
    subprocess.run(["bash", "-n", str(RECIPE)], check=True)
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "OUT": str(tmp_path / "out"),
        "CONFIG_PYTHON": sys.executable,
        "CORPORA": "ptb ag_news",
        "SEEDS": "1 2",
    }
    done = subprocess.run(
        ["bash", str(RECIPE)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [line[2:].split() for line in done.stderr.splitlines() if line.startswith("+ ")]
    data = [w for w in printed if w[1].endswith("emo_lm_data.py")]
    trains = [w for w in printed if w[1:3] == ["sft", "--config"]]
    prompts = [w for w in printed if w[1:3] == ["open-ended", "prompts"]]
    generates = [w for w in printed if w[1] == "generate"]
    scores = [w for w in printed if w[1:3] == ["open-ended", "score"]]
    runs = 2 * (1 + 3 + 3 + 1)  # corpora x (ce, tailr x 3 gammas, mixce x 3 gammas, emo)
    assert (len(data), len(prompts)) == (2, 2)
    assert (len(trains), len(generates), len(scores)) == (runs * 2, runs * 2, runs)  # x 2 seeds
    _check_printed(data, trains, prompts, generates, scores)


def _check_printed(data, trains, prompts, generates, scores) -> None:  # noqa: ANN001
    from eval_tasks import cli
    from eval_tasks.open_ended.open_ended import CORPORA, decoding_flags, published_benchmark

    for words in data:
        args = _script().build_parser().parse_args(words[2:])
        assert args.corpus in ("ptb", "ag_news")
    gammas = set()
    for words in trains:
        training = _parse_recipe("gpt2", *words[4:])[1]
        assert training.output_dir.endswith(f"seed{training.seed}/model") and training.seed in (1, 2)
        options = training.loss_options()
        if training.loss == "tailr":
            assert options["tailr_variant"] == "emo_code"
            gammas.add(("tailr", options["tailr_gamma"]))
        elif training.loss == "mixce":
            gammas.add(("mixce", options["mixce_gamma"]))
        elif training.loss == "emo":  # gpt2.py's mode emo: D with the target's own mass (no gt_q)
            assert options["emo_target_mass"] == "included"
            gammas.add(("emo", options["emo_target_mass"]))
    sweep = {(loss, g) for loss in ("tailr", "mixce") for g in (0.9, 0.8, 0.7)}  # EMO 4.1's sweep
    assert gammas == sweep | {("emo", "included")}
    for words in prompts + generates + scores:
        cli.build_parser().parse_args(words[1:])
    for words in generates:
        corpus = next(c for c in CORPORA if published_benchmark(c) in words)
        # the protocol's decoding, 5 rounds
        assert " ".join(decoding_flags(CORPORA[corpus])) in " ".join(words)
    assert all(len([w for w in words[3:] if w.endswith("samples.jsonl")]) == 2 for words in scores)  # 2 seeds


def test_table2_oracle_data_needs_its_files_then_runs_the_same_loop(tmp_path: Path) -> None:
    """Table 2 is the loop on the GPT-2 output dataset's GPT-2-large samples (no Hub copy): refused in one line
    before anything runs without its files; with them, the data / prompts commands read them."""
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "OUT": str(tmp_path / "out"),
        "CONFIG_PYTHON": sys.executable,
        "CORPORA": "gpt2_large",
        "SEEDS": "1",
        "LOSSES": "emo",
    }
    refused = subprocess.run(
        ["bash", str(RECIPE)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        "GPT2_LARGE_TRAIN is not set: gpt2_large has no Hub copy; give its train / valid / test split files"
    )
    files = {
        f"GPT2_LARGE_{part}": str(FIXTURES / "webtext.test.jsonl") for part in ("TRAIN", "VALID", "TEST")
    }
    done = subprocess.run(
        ["bash", str(RECIPE)], cwd=REPO_ROOT, env={**env, **files}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [line[2:].split() for line in done.stderr.splitlines() if line.startswith("+ ")]
    (data,) = [w for w in printed if w[1].endswith("emo_lm_data.py")]
    assert data[2] == "gpt2_large" and data[data.index("--source") + 1] == files["GPT2_LARGE_TRAIN"]
    (prompts,) = [w for w in printed if w[1:3] == ["open-ended", "prompts"]]
    assert prompts[prompts.index("--corpus") + 1] == "gpt2_large" and "--data" in prompts
