"""Outside audit ("noveltybench and placement round"): NoveltyBench's model-backed scorer, lm-eval task, command and
report section, on tiny models built in code (tests/eval/novelty/models.py), each checked against a source other than
the code under test: partition.py's ``classifier_score`` recipe re-run here one unpadded pair at a time, score.py's
chat-template call, the README's documented settings, the published leaderboard numbers as the README lists them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from eval_tasks.cli import main
from eval_tasks.novelty import noveltybench as nb
from tests.eval.novelty.models import build_models, build_tiny_classifier
from tests.helpers.once import build_once

pytestmark = pytest.mark.slow

LONG = "the girl and her old dog walked to the sea at dawn {}"  # more than 5 words: the classifier decides


def _build(root: Path) -> Path:
    import torch
    from transformers import AutoModelForSequenceClassification

    build_models(root)
    # a classifier whose P(equivalent) is about 0.3 for every pair: above 0.102, below 0.5
    out = build_tiny_classifier(root / "classifier_p03")
    model = AutoModelForSequenceClassification.from_pretrained(out)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0.0, float(np.log(0.3 / 0.7))]))
    model.save_pretrained(out)
    return root


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = build_once(tmp_path_factory, "novelty_audit_models", _build)
    names = ("model", "classifier", "reward", "classifier_p03")
    return {name: str(root / name) for name in names}


def _official_classifier_score(tokenizer: Any, model: Any, s1: str, s2: str) -> float:
    """partition.py's classifier_score, one unpadded pair (novelty-bench @ 5b22b53)."""
    import torch

    input_ids = [tokenizer.cls_token_id]
    for s in (s1, s2):
        input_ids.extend(tokenizer.encode(s, truncation=True, max_length=128, add_special_tokens=False))
        input_ids.append(tokenizer.sep_token_id)
    prompt_len = input_ids.index(tokenizer.sep_token_id) + 1
    token_type_ids = [0] * prompt_len + [1] * (len(input_ids) - prompt_len)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([input_ids]), token_type_ids=torch.tensor([token_type_ids]))
    return float(out["logits"].softmax(-1)[0, 1])


def test_batched_pair_probabilities_are_classifier_score_pair_by_pair(models: dict[str, str]) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from eval_tasks.novelty.scorers import PairClassifier

    tokenizer = AutoTokenizer.from_pretrained(models["classifier"])
    model = AutoModelForSequenceClassification.from_pretrained(models["classifier"]).eval()
    pairs = [
        ("a", "b"),
        ("the cat sat on the mat", "a dog ran " * 40),  # the second one cut to 128 tokens
        (LONG.format(1), "yes"),
        ("one two", "three four five six seven eight nine ten eleven twelve"),
    ]
    got = PairClassifier(models["classifier"], device="cpu", batch_size=4)(pairs)
    want = [_official_classifier_score(tokenizer, model, a, b) for a, b in pairs]
    assert got == pytest.approx(want, abs=1e-6)


def test_scorer_uses_0_102_and_scores_each_class_first_member(models: dict[str, str]) -> None:
    from eval_tasks.novelty.scorers import NoveltyRewardScorer, PairClassifier, load_scorer

    pair = PairClassifier(models["classifier_p03"], device="cpu")
    responses = [LONG.format(i) for i in range(3)]
    probs = pair([(responses[0], r) for r in responses[1:]])
    assert all(0.102 < p < 0.5 for p in probs), probs
    scorer = load_scorer(models["classifier_p03"], models["reward"], device="cpu")
    assert scorer.score("Tell me a story.", responses)["partition"] == [0, 0, 0]  # 0.3 > 0.102

    # short responses: the short rule decides (partition [0, 0, 1, 1, 2]); rewards only for 0, 2 and 4
    responses = ["red apple", "Red apple", "blue sky", "blue sky", "green tea now"]
    prompt = "Name a thing."
    scored = load_scorer(models["classifier"], models["reward"], device="cpu").score(prompt, responses)
    assert scored["partition"] == [0, 0, 1, 1, 2]
    reward = NoveltyRewardScorer(models["reward"], device="cpu", dtype="bfloat16")
    firsts = reward.score([prompt] * 3, ["red apple", "blue sky", "green tea now"])
    assert scored["first_rewards"] == pytest.approx(firsts)
    bins = [nb.reward_bin(r) for r in firsts]
    expected = np.average([bins[0], 0, bins[1], 0, bins[2]], weights=0.8 ** np.arange(5))
    assert scored["utility"] == pytest.approx(float(expected)) and scored["distinct"] == 3


def test_reward_text_is_score_pys_chat_template_call(models: dict[str, str]) -> None:
    from transformers import AutoTokenizer

    from eval_tasks.novelty.scorers import NoveltyRewardScorer

    tokenizer = AutoTokenizer.from_pretrained(models["reward"])
    assert tokenizer.chat_template
    chat = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "A."}]
    reward = NoveltyRewardScorer(models["reward"], device="cpu")
    assert reward.text("Q?", "A.") == tokenizer.apply_chat_template(chat, tokenize=False)


def test_lm_eval_task_samples_k_and_scores_with_its_own_models(models: dict[str, str]) -> None:
    pytest.importorskip("lm_eval")
    from eval_tasks.lm_eval_tasks import task_manager
    from eval_tasks.novelty.scorers import load_scorer

    meta = {"num_samples": 4, "classifier": models["classifier"], "reward_model": models["reward"]}
    meta["scorer_device"] = "cpu"
    task = task_manager(metadata=meta).load(["distmatch_noveltybench_curated"])["tasks"][
        "distmatch_noveltybench_curated"
    ]
    assert task.config.repeats == 4
    assert task.config.metadata["noveltybench_setting"]["num_samples"] == 4
    doc = next(iter(task.test_docs()))
    samples = ["red apple", "red apple", "blue sky", "green tea now"]
    got = task.process_results(doc, [samples])
    want = load_scorer(models["classifier"], models["reward"], device="cpu").score(doc["prompt"], samples)
    assert (got["distinct"], got["utility"]) == (want["distinct"], pytest.approx(want["utility"]))


# --- distmatch-eval novelty ---------------------------------------------------------------------------------------


def _write(path: Path, prompts: list[str], samples: list[list[str]]) -> str:
    path.write_text("".join(json.dumps({"prompt": p, "samples": s}) + "\n" for p, s in zip(prompts, samples)))
    return str(path)


def _run(models: dict[str, str], samples: str, out: Path, *extra: str) -> int:
    argv = ["novelty", samples, "--classifier", models["classifier"], "--reward-model", models["reward"]]
    return main([*argv, "--device", "cpu", "-o", str(out), *extra])


CURATED = [d["prompt"] for d in nb.novelty_documents("curated")[:3]]
THREE = [["red apple", "red apple", "blue sky"], ["yes", "no", "maybe"], ["a b", "a b", "a b"]]


def test_command_records_k_and_prompts_that_are_not_noveltybenchs(
    models: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    assert _run(models, _write(tmp_path / "s.jsonl", CURATED, THREE), out) == 0
    result = json.loads(out.read_text())
    assert (
        result["setting"]["num_samples"] == 3
        and "3 samples per prompt (published: 10)" in result["setting"]["note"]
    )
    assert result["metrics"]["distinct"] == pytest.approx((2 + 3 + 1) / 3)
    other = ["Write a haiku about rain.", "Name a colour."]
    assert _run(models, _write(tmp_path / "o.jsonl", other, THREE[:2]), out) == 0
    result = json.loads(out.read_text())
    assert result["benchmark"] is None and "prompts not NoveltyBench's" in result["setting"]["note"]


def test_command_refusals_each_alone(
    models: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out.json"
    other = _write(tmp_path / "o.jsonl", ["Write a haiku about rain."], [["a", "b"]])
    assert _run(models, other, out, "--subset", "curated") == 2
    assert "--subset curated" in capsys.readouterr().err and not out.exists()
    mixed = _write(tmp_path / "m.jsonl", CURATED[:2], [["a", "b"], ["a", "b", "c"]])
    assert _run(models, mixed, out) == 2
    assert "different numbers of samples" in capsys.readouterr().err and not out.exists()
    good = _write(tmp_path / "g.jsonl", CURATED[:1], [["a", "b"]])
    assert _run(models, good, out, "--batch-size", "0") == 2
    assert "--batch-size must be >= 1" in capsys.readouterr().err and not out.exists()


# --- distmatch-eval report's NoveltyBench section ----------------------------------------------------------------


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_report_columns_comparable_mark_and_leaderboard_rows() -> None:
    from eval_tasks.report.collect import RunData
    from eval_tasks.report.novelty import novelty_section

    metrics = {"distinct": 3.5, "utility": 2.25, "ngram_diversity": 40.0, "self_bleu_diversity": 30.0}
    off = {
        "comparable": False,
        "note": "not comparable with NoveltyBench's published numbers: reward model X",
    }
    runs = [
        RunData(name="run-a", novelty={"noveltybench_curated": {"metrics": metrics, "setting": off}}),
        RunData(
            name="run-b",
            novelty={"noveltybench_curated": {"metrics": metrics, "setting": {"comparable": True}}},
        ),
    ]
    lines = novelty_section(runs, True, None, set())
    rows = [_cells(x) for x in lines if x.startswith("| ")]
    header, body = rows[0], rows[1:]
    col = {name: header.index(name) for name in header}
    a = next(r for r in body if "run-a" in r[0])
    b = next(r for r in body if "run-b" in r[0])
    assert (a[col["distinct (1-K)"]], a[col["utility (0-10)"]]) == ("3.50", "2.25")
    assert (a[col["N-gram div."]], a[col["Self-BLEU div."]]) == ("40.00", "30.00")
    comparable = header[-1]
    assert (
        "reward model X" in a[col[comparable]] and a[col[comparable]] != "yes" and b[col[comparable]] == "yes"
    )
    gpt = next(r for r in body if r[0].startswith("gpt-4o"))  # the leaderboard row (README: 3.88, 3.27)
    assert (gpt[col["distinct (1-K)"]], gpt[col["utility (0-10)"]]) == ("3.88", "3.27")
    assert novelty_section(runs, False, None, set()) and not any(
        "gpt-4o" in x for x in novelty_section(runs, False, None, set())
    )
