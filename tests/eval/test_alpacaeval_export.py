"""distmatch-eval alpacaeval: AlpacaEval's evaluation set (fixture in its format) -> Stanford-Alpaca prompts ->
generate with a tiny Llama -> model_outputs.json in AlpacaEval's format; annotations.json -> win rate by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_tasks.chat import alpacaeval as A
from eval_tasks.cli import main
from eval_tasks.samples import InputError

FIXTURES = Path(__file__).parent / "fixtures" / "alpacaeval_export"


def test_prompts_generate_export(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from trl_ext.testing import build_tiny_llama

    model = build_tiny_llama(tmp_path / "model")
    prompts, out, outputs = tmp_path / "p.jsonl", tmp_path / "s.jsonl", tmp_path / "model_outputs.json"
    assert (
        main(["alpacaeval", "prompts", "--eval-set", str(FIXTURES / "eval_set.json"), "-o", str(prompts)])
        == 0
    )
    records = [json.loads(x) for x in prompts.read_text().splitlines()]
    assert records[2]["text"] == (
        "Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\nWrite a haiku about rain.\n\n### Response:"
    )
    assert (
        main(
            [
                "generate",
                "--model",
                str(model),
                "--prompts",
                str(prompts),
                "-o",
                str(out),
                "-k",
                "1",
                "--max-new-tokens",
                "4",
                "--no-progress",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0]["meta"]["chat_template"] is False  # the Alpaca format, not the tokenizer's chat template
    argv = [
        "alpacaeval",
        "export",
        str(out),
        "--generator",
        "emo-7b",
        "--prompts",
        str(prompts),
        "-o",
        str(outputs),
    ]
    assert main(argv) == 0
    exported = json.loads(outputs.read_text())
    eval_set = json.loads((FIXTURES / "eval_set.json").read_text())
    assert [e["instruction"] for e in exported] == [e["instruction"] for e in eval_set]
    assert [e["dataset"] for e in exported] == ["helpful_base", "helpful_base", "selfinstruct"]
    assert all(set(e) == {"instruction", "output", "generator", "dataset"} for e in exported)
    assert [e["output"] for e in exported] == [r["samples"][0].strip() for r in rows]
    assert {e["generator"] for e in exported} == {"emo-7b"}


def test_win_rate_of_hand_made_annotations(tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    assert main(["alpacaeval", "winrate", str(FIXTURES / "annotations.json"), "-o", str(out)]) == 0
    got = json.loads(out.read_text())
    # preferences 2, 1, 2, draw (0 -> 1.5), unjudged: (1 + 0 + 1 + 0.5) / 4
    assert got["win_rate"] == pytest.approx(62.5)
    assert (got["n_wins"], got["n_wins_base"], got["n_draws"], got["n_total"], got["n_unjudged"]) == (
        2,
        1,
        1,
        4,
        1,
    )
    assert got["reference"] == ["text_davinci_003"] and got["annotator"] == ["alpaca_eval_gpt4"]
    # the report reads it back beside EMO Tables 9-10
    report = tmp_path / "report"
    assert main(["report", "--run", f"mine={out}", "-o", str(report)]) == 0
    section = (report / "report.md").read_text().split("### AlpacaEval win rate (EMO Tables 9-10; %)")[1]
    assert "| **mine** | 62.50 | 2 / 1 / 1 of 4 | alpaca_eval_gpt4 | text_davinci_003 |" in section
    assert "| EMO · LLaMa2-13B [EMO Table 9] | 79.10 |" in section
    assert "| MLE · LLaMa2-7B [EMO Table 10] | 76.20 |" in section


def test_bad_input() -> None:
    with pytest.raises(InputError, match="record #0 has no 'instruction' string"):
        A.prompt_records([{"output": "x"}])
    two = [{"generator_2": "a", "preference": 2}, {"generator_2": "b", "preference": 1}]
    with pytest.raises(InputError, match="several generators"):
        A.win_rate(two)
    assert A.win_rate(two, "b")["win_rate"] == 0.0
    with pytest.raises(InputError, match="outside 1..2"):
        A.win_rate([{"generator_2": "a", "preference": 3}])
