"""GEM's domain fine-tuning recipes (MetaMathQA, Magicoder-OSS-Instruct; GPU-scale), checked offline.

* `examples/reproduce/gem_domain_data.py` runs on fixture rows in each dataset's own format (MetaMathQA's JSON list,
  Magicoder's JSONL) and writes the chat JSONL subsets; its documented commands parse with its own parser.
* `examples/trl/gem_ls_{metamathqa,magicoder}.yaml` parse through `trl sft`'s parser and our checks with the paper's
  settings (Appendix D), and one real training step runs on the prepared rows, loaded through TRL's dataset mixture
  code with the recipe's data, loss and masking settings (the tiny Llama in place of Llama-3-8B).
  The Axolotl recipes are validated offline in tests/axolotl/test_plugin.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.doc_commands import DocCommand, commands_of, ids
from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module

FIXTURES = Path(__file__).parent / "fixtures" / "gem_domain"
SOURCES = {
    "metamathqa": FIXTURES / "MetaMathQA-395K.json",
    "magicoder": FIXTURES / "data-oss_instruct-decontaminated.jsonl",
}
COMMANDS = commands_of("gem-domain-data")


def _script() -> ModuleType:
    return load_module(
        "gem_domain_data", REPO_ROOT / "examples" / "reproduce" / "gem_domain_data.py", register=False
    )


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_documented_data_command_parses(command: DocCommand) -> None:
    args = _script().build_parser().parse_args(command.program_argv[2:])
    assert args.dataset in ("metamathqa", "magicoder") and args.out == f"data/gem/{args.dataset}"


@pytest.mark.parametrize("dataset", ["metamathqa", "magicoder"])
def test_data_script_writes_disjoint_chat_subsets(
    dataset: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("datasets")
    script = _script()
    assert script.DATASETS["metamathqa"][3:] == (79_000, 1_000)  # GEM D.3: 79,000 training + 1,000 held out
    assert script.DATASETS["magicoder"][3:] == (
        None,
        1_000,
    )  # GEM D.2: 1,000 test, the rest (74,197) training
    source = SOURCES[dataset]
    prompt_col, response_col = script.DATASETS[dataset][1:3]
    rows = json.loads(source.read_text()) if source.suffix == ".json" else _read(source)
    pairs = {(r[prompt_col], r[response_col]) for r in rows}
    out = tmp_path / dataset
    base = [dataset, "--source", str(source), "--out", str(out), "--test-size", "3"]
    sizes = ["--train-size", "6"] if dataset == "metamathqa" else []
    assert script.main([*base, *sizes]) == 0
    train, test = _read(out / "train.jsonl"), _read(out / "test.jsonl")
    assert (len(train), len(test)) == ((6, 3) if dataset == "metamathqa" else (7, 3))  # magicoder: the rest
    assert f"{len(train)} training rows, 3 held out" in capsys.readouterr().out
    got = [(r["messages"][0]["content"], r["messages"][1]["content"]) for r in train + test]
    assert [[m["role"] for m in r["messages"]] for r in train + test] == [["user", "assistant"]] * len(got)
    assert len(set(got)) == len(got) and set(got) <= pairs  # disjoint subsets of the source rows
    assert script.main([*base, *sizes, "--out", str(tmp_path / "again")]) == 0  # seeded: the same draw
    assert (tmp_path / "again" / "train.jsonl").read_text() == (out / "train.jsonl").read_text()
    assert script.main([*base, *sizes, "--out", str(tmp_path / "seed1"), "--seed", "1"]) == 0
    assert (tmp_path / "seed1" / "train.jsonl").read_text() != (out / "train.jsonl").read_text()


def test_data_script_refuses_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("datasets")
    script = _script()
    out = str(tmp_path / "out")
    cases = [
        (
            ["metamathqa", "--source", str(SOURCES["metamathqa"])],
            "--train-size 79000 + --test-size 1000 exceed",
        ),
        (["magicoder", "--source", str(SOURCES["metamathqa"])], "no problem, solution column"),
        (["magicoder", "--source", str(tmp_path)], "expected .json / .jsonl files or .parquet files"),
        (["metamathqa", "--source", str(SOURCES["metamathqa"]), "--test-size", "-1"], "--test-size >= 0"),
    ]
    for argv, message in cases:
        assert script.main([*argv, "--out", out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not Path(out).exists()  # refused before writing


def _parse_recipe(dataset: str):  # noqa: ANN202
    from trl_ext.cli import check_parsed, make_sft_parser

    path = f"examples/trl/gem_ls_{dataset}.yaml"
    parsed = make_sft_parser().parse_args_and_config(
        ["--config", str(REPO_ROOT / path), "--use_cpu", "true"],
        return_remaining_strings=True,
        separate_remaining_strings=True,
    )
    check_parsed(parsed[:4])
    return parsed


@pytest.mark.parametrize("dataset", ["metamathqa", "magicoder"])
def test_trl_recipe_has_the_paper_settings(dataset: str) -> None:
    pytest.importorskip("trl")
    _, training, model, data = _parse_recipe(dataset)[:4]
    assert model.model_name_or_path == "meta-llama/Meta-Llama-3-8B"
    settings = {
        "loss": "gem_ls",
        "gem_beta": 0.7,
        "learning_rate": 2e-5,
        "num_train_epochs": 3,
        "max_length": 1024,
        "packing": False,
        "assistant_only_loss": True,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "warmup_steps": 0.03,
        "weight_decay": 0.0,
    }
    assert {k: getattr(training, k) for k in settings} == settings
    assert getattr(training.lr_scheduler_type, "value", training.lr_scheduler_type) == "cosine"
    assert training.per_device_train_batch_size * training.gradient_accumulation_steps * 8 == 128  # 8 GPUs
    assert [(d.path, d.data_files, d.split) for d in data.datasets] == [
        ("json", f"data/gem/{dataset}/train.jsonl", "train")
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_trl_recipe_trains_a_step_on_the_prepared_rows(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from transformers import AutoTokenizer
    from trl import get_dataset

    from tests.helpers.sft import load_model, make_config
    from trl_ext.testing import build_tiny_llama
    from trl_ext.trainer import DistMatchSFTTrainer

    assert (
        _script().main(
            [
                "metamathqa",
                "--source",
                str(SOURCES["metamathqa"]),
                "--out",
                str(tmp_path / "d"),
                "--train-size",
                "4",
                "--test-size",
                "1",
            ]
        )
        == 0
    )
    _, training, _, data = _parse_recipe("metamathqa")[:4]
    data.datasets[0].data_files = str(tmp_path / "d" / "train.jsonl")  # the recipe's path, under tmp_path
    train = get_dataset(data)["train"]
    recipe = (
        "loss",
        "gem_beta",
        "assistant_only_loss",
        "max_length",
        "packing",
        "learning_rate",
        "weight_decay",
    )
    args = make_config(tmp_path, **{k: getattr(training, k) for k in recipe}, max_steps=1)
    model_dir = build_tiny_llama(tmp_path / "model")
    trainer = DistMatchSFTTrainer(
        model=load_model(model_dir),
        args=args,
        train_dataset=train,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    tokenizer = trainer.processing_class
    first = trainer.train_dataset[0]
    trained = [label for label in first["labels"] if label != -100]
    response = _read(tmp_path / "d" / "train.jsonl")[0]["messages"][1]["content"]
    assert tokenizer.decode(trained).startswith(response)  # the loss sees the response only
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 1 and math.isfinite(losses[0])
