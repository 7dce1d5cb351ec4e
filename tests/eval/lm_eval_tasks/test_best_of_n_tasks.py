"""distmatch_gsm8k / distmatch_math / distmatch_alpacaeval_bon through the real lm-eval on the tiny model.

Offline: the data are tests/eval/fixtures/best_of_n/ (each dataset's own columns) through the tasks' real loaders;
the reward model is a tiny random LlamaForSequenceClassification built here. One `lm_eval run` (4 samples per
question, 6 new tokens, chat template) covers the three tasks; its logged samples are re-scored here with the
metric functions and must give the reported numbers. The scoring of crafted answers goes through the task objects
lm-eval builds from the YAMLs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.best_of_n.best_of_n import GEM_MATH_PROMPT, RewardScorer
from eval_tasks.math.math_answers import (
    canonical_math_answer,
    extract_gsm8k_answer,
    extract_math_answer,
    is_equiv,
)
from eval_tasks.metrics.voting import reward_best_of_n, voting_accuracies, win_rate_best_of_n
from tests.eval.lm_eval_tasks.helpers import _check, _lm_eval_cmd, _results, _run, _samples, needs_lm_eval
from tests.helpers.env import REPO_ROOT

pytestmark = [pytest.mark.slow, needs_lm_eval]

DATA = REPO_ROOT / "tests" / "eval" / "fixtures" / "best_of_n"
TASKS = ("distmatch_gsm8k", "distmatch_math", "distmatch_alpacaeval_bon")


@pytest.fixture(scope="module")
def reward_model(workdir: Path) -> Path:
    """A tiny random sequence-classification reward model with the tiny model's tokenizer (chat template)."""
    from transformers import AutoTokenizer

    from trl_ext.testing import build_tiny_reward_model

    target = workdir / "reward_model"
    if not target.exists():
        build_tiny_reward_model(target, AutoTokenizer.from_pretrained(workdir / "model"), seed=3)
    return target


@pytest.fixture(scope="module")
def bon_run(workdir: Path, env: dict[str, str], reward_model: Path) -> Path:
    out = workdir / "out_best_of_n"
    meta = {"data_dir": str(DATA), "bon_samples": 4, "max_new_tokens": 6, "reward_model": str(reward_model)}
    cmd = _lm_eval_cmd(workdir / "model", ",".join(TASKS), out, meta, "--apply_chat_template")
    _check(_run(cmd, dict(env, DISTMATCH_LM_EVAL_HOOK="0"), workdir))
    return out


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_math_tasks_sample_and_score_the_first_k(bon_run: Path) -> None:
    results = _results(bon_run)
    gsm_rows = _rows(DATA / "gsm8k" / "test.jsonl")
    for task in ("distmatch_gsm8k", "distmatch_math"):
        samples = _samples(bon_run, task)
        assert len(samples) == 3
        for record in samples:
            context = record["arguments"]["gen_args_0"]["arg_0"]
            assert "<|user|>" in context  # the chat template
            assert GEM_MATH_PROMPT.format(question=record["doc"]["question"]) in context
            assert len(record["resps"][0]) == 4  # bon_samples responses, all kept
        answers = [record["filtered_resps"][0] for record in samples]
        if task == "distmatch_gsm8k":
            golds = [extract_gsm8k_answer(r["answer"].replace("####", "The answer is:")) for r in gsm_rows]
            assert golds == [7, 2250, -6]
            extracted = [[extract_gsm8k_answer(s) for s in row] for row in answers]
            expected = voting_accuracies(extracted, golds, ks=(1, 4))
        else:
            golds = [r["doc"]["gold"] for r in samples]
            assert golds == ["\\frac{1}{2}", "4", "120^\\circ"]
            extracted = [[canonical_math_answer(extract_math_answer(s)) for s in row] for row in answers]
            expected = voting_accuracies(
                extracted, golds, ks=(1, 4), equal=lambda a, g: a is not None and is_equiv(a, g)
            )
        got = results["results"][task]
        for name, value in expected.items():
            assert got[f"{name},none"] == pytest.approx(value), (task, name)
        assert 0.0 <= got["no_answer,none"] <= 100.0
        meta = results["configs"][task]["metadata"]
        assert (meta["bon_samples"], meta["max_new_tokens"]) == (4, 6)
        gen = results["configs"][task]["generation_kwargs"]
        assert (gen["temperature"], gen["top_k"], gen["top_p"], gen["max_gen_toks"]) == (0.6, 50, 0.9, 6)


def test_alpacaeval_bon_scores_samples_and_reference_with_the_reward_model(
    bon_run: Path, reward_model: Path
) -> None:
    task = "distmatch_alpacaeval_bon"
    samples = _samples(bon_run, task)
    refs = [json.loads(line) for line in (DATA / "alpacaeval" / "eval.jsonl").read_text().splitlines()]
    assert [r["doc"]["reference"] for r in samples] == [r["output"] for r in refs]
    scorer = RewardScorer(str(reward_model))
    rewards, ref_rewards = [], []
    for record in samples:
        prompt, outputs = record["doc"]["prompt"], record["filtered_resps"][0]
        assert len(outputs) == 4
        scores = scorer.score([prompt] * 5, [*outputs, record["doc"]["reference"]])
        rewards.append(scores[:4])
        ref_rewards.append(scores[4])
    got = _results(bon_run)["results"][task]
    expected = {**reward_best_of_n(rewards, ks=(1, 4)), **win_rate_best_of_n(rewards, ref_rewards, ks=(1, 4))}
    for name, value in expected.items():
        assert got[f"{name},none"] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    assert got["reference_reward,none"] == pytest.approx(sum(ref_rewards) / 3, rel=1e-5)
    assert len({round(r, 6) for row in rewards for r in row}) > 1  # a real, input-dependent reward
    assert _results(bon_run)["configs"][task]["metadata"]["reward_model"] == str(reward_model)


def test_reward_is_the_score_at_the_last_real_token(reward_model: Path) -> None:
    """Right padding in a batch does not change a pair's reward: the score head is read at its last real token."""
    import torch
    from transformers import AutoModelForSequenceClassification

    scorer = RewardScorer(str(reward_model), batch_size=2)
    short, long = ("hi", "ok"), ("a much longer question here", "and a longer answer too")
    batched = scorer.score([short[0], long[0]], [short[1], long[1]])
    model = AutoModelForSequenceClassification.from_pretrained(reward_model).eval()
    text = scorer.text(*short)
    # GEM's trailing header
    assert "<|assistant|>" in text and text.index("ok") < text.rindex("<|assistant|>")
    ids = scorer.tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        alone = model(**ids).logits[0, 0].item()
    assert batched[0] == pytest.approx(alone, abs=1e-5) and batched[0] != pytest.approx(batched[1])


def _task(name: str, metadata: dict[str, Any]) -> Any:
    from lm_eval.tasks import TaskManager

    folder = str(REPO_ROOT / "eval_tasks")
    tm = TaskManager(include_path=folder, include_defaults=False, metadata=metadata)
    return tm.load([name])["tasks"][name]


def test_process_results_on_crafted_answers(workdir: Path) -> None:
    gsm = _task("distmatch_gsm8k", {"data_dir": str(DATA), "bon_samples": 4})
    doc = next(iter(gsm.test_docs()))
    assert doc["gold"] == "7" and doc["prompt"].startswith("\nYour task is to answer the question below.")
    samples = ["The answer is: 8", "so the answer is 7 pens", "The answer is: 8", "no idea"]
    scores = gsm.process_results(doc, [samples])
    assert scores == {"mv@1": 0.0, "bon@1": 0.0, "mv@4": 0.0, "bon@4": 100.0, "no_answer": 25.0}
    assert (
        gsm.process_results(doc, [["The answer is: 7.0", *samples[1:]]])["mv@4"] == 100.0
    )  # 7 vs 7 vs 8 8 tie
    math_task = _task("distmatch_math", {"data_dir": str(DATA), "bon_samples": 4})
    doc = next(iter(math_task.test_docs()))
    samples = [
        "The answer is: 0.5",
        "The answer is: \\dfrac{1}{2}.\nDone",
        "The answer is: 1/3",
        "The answer is: 1/3",
    ]
    # Normalised votes: \frac{1}{2} x2 (first seen) ties \frac{1}{3} x2 -> correct.
    assert math_task.process_results(doc, [samples])["mv@4"] == 100.0
    greedy = _task("distmatch_math", {"data_dir": str(DATA), "greedy": True})
    assert greedy.config.repeats == 1 and greedy.config.generation_kwargs["do_sample"] is False
    assert greedy.process_results(doc, [["The answer is: \\frac12"]]) == {"acc": 100.0, "no_answer": 0.0}


def test_gem_official_protocol_sets_the_papers_sampling() -> None:
    for name, tokens in (
        ("distmatch_gsm8k", 512),
        ("distmatch_math", 512),
        ("distmatch_alpacaeval_bon", 2048),
    ):
        task = _task(name, {"data_dir": str(DATA), "protocol": "gem_official"})
        gen = task.config.generation_kwargs
        assert task.config.repeats == 32 and gen["max_gen_toks"] == tokens, name
        assert (gen["do_sample"], gen["temperature"], gen["top_k"], gen["top_p"]) == (True, 0.6, 50, 0.9)
        metrics = [m["metric"] for m in task.config.metric_list]
        first = "reward_bon" if name.endswith("bon") else "mv"
        assert [m for m in metrics if m.startswith(first + "@")] == [
            f"{first}@{k}" for k in (1, 4, 8, 16, 32)
        ]
    default = _task("distmatch_gsm8k", {"data_dir": str(DATA)})
    assert default.config.repeats == 8 and default.config.generation_kwargs["max_gen_toks"] == 256
    chat = _task("distmatch_alpacaeval_bon", {"data_dir": str(DATA)})
    assert chat.config.repeats == 8 and chat.config.generation_kwargs["max_gen_toks"] == 512
    assert (
        chat.config.metadata["reward_model"] == "sfairXC/FsfairX-LLaMA3-RM-v0.1"
    )  # GEM's, loaded when scoring


def test_bad_options_are_refused_in_one_line() -> None:
    with pytest.raises(DistMatchConfigError, match=r"bon_samples=0 is invalid .* expected an integer >= 1"):
        _task("distmatch_gsm8k", {"bon_samples": 0})
    with pytest.raises(
        DistMatchConfigError, match=r"math_checker='sympy' is invalid .* 'hendrycks', 'math_verify'"
    ):
        _task("distmatch_math", {"math_checker": "sympy"})
    with pytest.raises(DistMatchConfigError, match=r"reward_model='/nonexistent/rm' cannot be loaded"):
        RewardScorer("/nonexistent/rm")
