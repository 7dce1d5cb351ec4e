"""What a user reads in the exports and the report, each value computed by hand in the test.

* ``alpacaeval export``: sample 0 of each prompt (not another), stripped, with the prompt's instruction and subset
  found by id;
* ``alpacaeval winrate``: every count of hand-made annotations whose wins, draws and losses all differ (preference
  0 is AlpacaEval's draw), and the report's "wins / draws / losses" cell in that order;
* "not comparable": each condition alone (MAUVE features, MAUVE text length; an NLU task off the paper's protocol,
  or without a protocol check);
* an ``open-ended score`` output wins over an lm-eval result of the same benchmark, whichever is read first;
* ``open-ended score --oracle``: the oracle perplexity of the model's texts (prefix + " " + sample), computed here
  with plain torch; MAUVE's language-model features of a text padded in a batch equal its features alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from eval_tasks import published as P
from eval_tasks.chat import alpacaeval as A
from eval_tasks.report.collect import RunData, collect_run
from eval_tasks.report.emo_generation import ORACLE, TABLE1, open_ended_section, win_rate_section
from eval_tasks.report.labels import NLU_ORDER
from eval_tasks.report.markdown import nlu_section


def test_export_takes_sample_0_stripped_and_the_prompt_found_by_id() -> None:
    prompts = [
        {"id": "alpacaeval-0", "instruction": "Say hi.", "dataset": "helpful_base"},
        {"id": "alpacaeval-1", "instruction": "Count to 3.", "dataset": "selfinstruct"},
    ]
    rows = [  # in another order than the prompts, three samples each
        {"id": "alpacaeval-1", "samples": ["  1 2 3\n", "one two three", "3 2 1"]},
        {"id": "alpacaeval-0", "samples": ["\nhi ", "hello", "hey"]},
    ]
    assert A.export_outputs(rows, "mine", prompts) == [
        {"instruction": "Count to 3.", "output": "1 2 3", "generator": "mine", "dataset": "selfinstruct"},
        {"instruction": "Say hi.", "output": "hi", "generator": "mine", "dataset": "helpful_base"},
    ]


def _annotations() -> list[dict]:
    # model wins 4 (2, 2, 2, 1.75), loses 3 (1, 1, 1.25), draws 2 (1.5 and AlpacaEval's 0), 1 unjudged (None);
    # another generator's rows are left out
    prefs = [2, 2, 2, 1.75, 1, 1, 1.25, 1.5, 0, None]
    rows = [
        {"generator_1": "text_davinci_003", "generator_2": "mine", "annotator": "judge", "preference": p}
        for p in prefs
    ]
    return rows + [{"generator_1": "ref", "generator_2": "other", "annotator": "x", "preference": 2}]


def test_win_rate_counts_of_hand_made_annotations() -> None:
    got = A.win_rate(_annotations(), "mine")
    # 100 x mean(preference - 1) over the 9 judged: (1 + 1 + 1 + 0.75 + 0 + 0 + 0.25 + 0.5 + 0.5) / 9
    assert got["win_rate"] == pytest.approx(100 * 5.0 / 9)
    counts = {k: got[k] for k in ("n_wins", "n_draws", "n_wins_base", "n_total", "n_unjudged")}
    assert counts == {"n_wins": 4, "n_draws": 2, "n_wins_base": 3, "n_total": 9, "n_unjudged": 1}
    assert got["reference"] == ["text_davinci_003"] and got["annotator"] == ["judge"]


def test_the_report_shows_wins_draws_losses_in_that_order() -> None:
    run = RunData(
        "mine", win_rates={"alpacaeval": {**A.win_rate(_annotations(), "mine"), "source": "w.json"}}
    )
    lines = win_rate_section([run], False, None, set())
    assert "| run | win rate | wins / draws / losses | judge | reference |" in lines
    assert "| **mine** | 55.56 | 4 / 2 / 3 of 9 | judge | text_davinci_003 |" in lines


def _open_ended(featurizer: str, length: int | None) -> dict:
    entry = {"metrics": {"mauve": 80.0}, "std": {"mauve": 1.0}, "featurizer": featurizer, "seeds": 1}
    entry.update(via="distmatch-eval open-ended score", source="s.json")
    if length is not None:
        entry["max_text_length"] = length
    return entry


@pytest.mark.parametrize(
    ("featurizer", "length", "comparable"),
    [
        ("lm:gpt2-large", 256, True),
        ("lm:gpt2-large", None, True),  # an lm-eval task: the paper's length
        ("lm:gpt2", 256, False),  # the features alone
        ("lm:gpt2-large", 128, False),  # the length alone
        ("lm:gpt2-large", 1024, False),
    ],
)
def test_open_ended_scoring_is_marked_not_comparable_for_each_difference(
    featurizer, length, comparable
) -> None:
    run = RunData("mine", open_ended={TABLE1[0]: _open_ended(featurizer, length)})
    text = "\n".join(open_ended_section([run], False, None, set()))
    assert ("not comparable)" not in text) == comparable, text
    assert f"MAUVE features {featurizer}, {length or 256} tokens" in text


def _nlu_run(comparable: list[bool | None]) -> RunData:
    tasks = [P.benchmarks()[b]["lm_eval_tasks"][0] for b in NLU_ORDER]
    run = RunData("mine", lm_eval={t: {"acc": 50.0} for t in tasks})
    for task, ok in zip(tasks, comparable):
        if ok is not None:
            differences = [] if ok else [f"{task}: not the paper's demonstrations"]
            check = {"protocol": "emo_official" if ok else "default", "comparable": ok}
            run.lm_eval_protocol[task] = {**check, "differences": differences, "metric": "acc"}
    return run


@pytest.mark.parametrize(
    ("which", "comparable"),
    [("all", True), ("one_off_protocol", False), ("one_unchecked", False), ("all_off", False)],
)
def test_nlu_row_is_paper_comparable_only_when_every_task_is(which, comparable) -> None:
    n = len(NLU_ORDER)
    flags = {
        "all": [True] * n,
        "one_off_protocol": [True] * (n - 1) + [False],
        "one_unchecked": [True] * (n - 1) + [None],
        "all_off": [False] * n,
    }[which]
    row = next(x for x in nlu_section([_nlu_run(flags)], False, None, set()) if x.startswith("| **mine**"))
    assert row.endswith("| 50.00 | emo_official: paper-comparable |") == comparable, row
    assert ("not comparable [1]" in row) == (not comparable), row


def _write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("score_first", [True, False])
def test_an_open_ended_score_wins_over_the_lm_eval_result_read_before_or_after(tmp_path, score_first) -> None:
    task = "distmatch_open_ended_gpt2_large"
    lm_eval = _write(
        tmp_path / "results.json",
        {"results": {task: {"mauve,none": 11.0}}, "configs": {task: {"metadata": {}}}, "versions": {}},
    )
    score = _write(
        tmp_path / "score.json",
        {
            "kind": "distmatch.open_ended",
            "benchmark": ORACLE,
            "mauve": {"mean": 77.0, "std": 2.0},
            "seeds": [],
        },
    )
    run = collect_run("mine", [score, lm_eval] if score_first else [lm_eval, score])
    assert run.open_ended[ORACLE]["metrics"] == {"mauve": 77.0}
    assert run.open_ended[ORACLE]["via"] == "distmatch-eval open-ended score"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    from trl_ext.testing import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("report_columns") / "model")


def test_the_oracle_perplexity_is_of_the_model_texts(tiny, tmp_path) -> None:
    pytest.importorskip("mauve")
    pytest.importorskip("rouge_score")
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval_tasks.open_ended.open_ended import score_files

    words = ["river", "city", "king", "queen", "stone", "field", "house", "light"]
    rows = [
        {
            "id": str(i),
            "prompt": f"the {words[i]}",
            "reference": f"the {words[i]} and the {words[(i + 3) % 8]} of the old town",
            "samples": [f"is {words[(i + 1) % 8]} {words[(i + 5) % 8]}"],
        }
        for i in range(8)
    ]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    def features(texts: list[str]) -> np.ndarray:
        return np.array([[len(t), t.count("e"), t.count("o"), sum(map(ord, t)) % 7] for t in texts], float)

    model = AutoModelForCausalLM.from_pretrained(tiny).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    result = score_files([str(path)], featurizer=features, oracle=(model, tokenizer), device="cpu")
    model_texts = [f"{r['prompt']} {r['samples'][0]}" for r in rows]  # Q: prefix + " " + the sample
    nll, count = 0.0, 0  # one batch of 8: the token mean over all texts
    for text in model_texts:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
        nll -= float(logp.gather(1, ids[0, 1:, None]).sum())
        count += ids.shape[1] - 1
    assert result["oracle_ppl"]["mean"] == pytest.approx(math.exp(nll / count), rel=1e-4)


def test_mauve_lm_features_of_a_padded_text_are_its_features_alone(tiny) -> None:
    import numpy as np

    from eval_tasks.metrics.mauve import text_features

    texts = ["a", "the old king of the river city and the queen", "stone field"]
    together = text_features(texts, f"lm:{tiny}", batch_size=8, device="cpu")
    alone = np.concatenate([text_features([t], f"lm:{tiny}", batch_size=1, device="cpu") for t in texts])
    assert together.shape == alone.shape and np.allclose(together, alone, atol=1e-4)
