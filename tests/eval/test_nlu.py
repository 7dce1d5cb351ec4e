"""The ICL classification tasks (`eval_tasks/nlu/nlu.py`): the papers' templates, the prompts built from retrieved
demonstrations."""

from __future__ import annotations

import pytest

from eval_tasks.nlu import nlu


@pytest.mark.slow  # as in tests/eval/lm_eval_tasks/, where it came from
def test_paper_and_emo_code_templates() -> None:
    """The exact strings of the EMO paper's Table 5 (default) and of the EMO code's icl.py (variant)."""
    expected_paper = {
        "sst2": {"positive": 'Review: "<X>" It is positive.', "negative": 'Review: "<X>" It is negative.'},
        "tweet_emotion": {"anger": 'Tweet: "<X>" It is anger.', "sadness": 'Tweet: "<X>" It is sadness.'},
        "trec": {
            "abbreviation": 'Question: "<X>" It is about abbreviation.',
            "description": 'Question: "<X>" It is about description and abstract concept.',
            "human": 'Question: "<X>" It is about human being.',
            "numeric": 'Question: "<X>" It is about numerical value.',
        },
        "subj": {"objective": '"<X>" It is objective.', "subjective": '"<X>" It is subjective.'},
        "cr": {"positive": 'Review: "<X>" It is positive.'},
        "rt": {"negative": 'Review: "<X>" It is negative.'},
        "ag_news": {
            "sci_tech": '"<X>" It is about science and technology.',
            "sports": '"<X>" It is about sports.',
        },
    }
    for key, expected in expected_paper.items():
        assert {k: nlu.ICL_TASKS[key].template("paper")[k] for k in expected} == expected, key
    code = {key: spec.template("emo_code") for key, spec in nlu.ICL_TASKS.items()}
    assert code["rt"]["positive"] == "Review: <X> It is positive"  # no quotes, no final period
    assert code["cr"]["negative"] == "Review: <X> It is negative."
    assert code["tweet_emotion"]["joy"] == "<X> It is joy."
    assert code["subj"]["subjective"] == "<X> It is subjective."
    assert code["trec"]["numeric"] == '"<X>" It is about numeric value.'
    # Label names follow the ids of the dataset actually loaded (SetFit/sst2: 0 = negative).
    assert nlu.ICL_TASKS["sst2"].labels == ("negative", "positive")
    with pytest.raises(ValueError, match="valid: paper, emo_code"):
        nlu.ICL_TASKS["sst2"].template("nope")


@pytest.mark.slow  # as in tests/eval/lm_eval_tasks/, where it came from
def test_build_icl_rows_exact_prompt() -> None:
    spec = nlu.ICL_TASKS["sst2"]
    pool = [{"text": "great fun", "label": 1}, {"text": "dull", "label": 0}, {"text": "fine", "label": 1}]
    (doc,) = nlu.build_icl_rows(spec, [{"text": "so good", "label": 1}], pool, [[2, 0]], [[0.9, 0.5]])
    demos = 'Review: "fine" It is positive.\nReview: "great fun" It is positive.\n'
    assert doc["full_prompts"] == [
        demos + 'Review: "so good" It is negative.',
        demos + 'Review: "so good" It is positive.',
    ]
    assert (doc["label"], doc["label_name"], doc["ice_indices"]) == (1, "positive", [2, 0])
    (code,) = nlu.build_icl_rows(
        nlu.ICL_TASKS["rt"], [{"text": "x", "label": 0}], pool, [[1]], variant="emo_code"
    )
    assert code["full_prompts"][1] == "Review: dull It is negative\nReview: x It is positive"


def test_get_spec_by_short_or_task_name() -> None:
    assert nlu.get_spec("sst2") is nlu.get_spec("distmatch_sst2") is nlu.ICL_TASKS["sst2"]
    assert nlu.get_spec("distmatch_mmlu") is nlu.MMLU
    with pytest.raises(
        ValueError, match=r"Unknown distmatch NLU task 'distmatch_imdb'; valid: tweet_emotion, "
    ):
        nlu.get_spec("distmatch_imdb")
    assert [nlu.get_spec(name).task for name in nlu.NLU_TASK_NAMES] == list(nlu.NLU_TASK_NAMES)


def test_demonstrations_fill_each_with_its_own_label() -> None:
    spec = nlu.ICL_TASKS["subj"]
    assert nlu.fill('"<X>" It is objective.', "a <X> b") == '"a <X> b" It is objective.'  # text kept verbatim
    got = nlu.demonstrations(spec, ["one", "two"], [1, 0])
    assert got == '"one" It is subjective.\n"two" It is objective.\n'
    assert nlu.demonstrations(spec, [], []) == ""  # zero-shot: no separator either
    with pytest.raises(ValueError):  # one label per text
        nlu.demonstrations(spec, ["one", "two"], [1])


def test_build_icl_rows_refuses_bad_labels_and_neighbour_counts() -> None:
    spec = nlu.ICL_TASKS["sst2"]
    pool = [{"text": "a", "label": 0}]
    with pytest.raises(
        ValueError, match=r"distmatch_sst2: label 2 in field 'label' is not a label id 0\.\.1"
    ):
        nlu.build_icl_rows(spec, [{"text": "x", "label": 2}], pool, [[0]])
    with pytest.raises(ValueError, match="is not a label id"):  # a bool is not a label id
        nlu.build_icl_rows(spec, [{"text": "x", "label": True}], pool, [[0]])
    with pytest.raises(ValueError, match="distmatch_sst2: 2 neighbour lists for 1 test rows"):
        nlu.build_icl_rows(spec, [{"text": "x", "label": 0}], pool, [[0], [0]])
    (doc,) = nlu.build_icl_rows(spec, [{"text": "x", "label": 0}], pool, [[0]])
    assert doc["ice_scores"] == [] and doc["ice_indices"] == [0]


def _mmlu_row(subject: str, question: str, answer: int) -> dict:
    return {"subject": subject, "question": question, "choices": ["w", "x", "y", "z"], "answer": answer}


def test_mmlu_context_is_opencompass_ppl_prompt() -> None:
    shots = [_mmlu_row("high_school_physics", f"Q{i}?", i % 4) for i in range(2)]
    row = _mmlu_row("high_school_physics", "What?", 3)
    expected = (
        "The following are multiple choice questions (with answers) about  high school physics.\n\n"
        "Q0?\nA. w\nB. x\nC. y\nD. z\nAnswer: A\n\nQ1?\nA. w\nB. x\nC. y\nD. z\nAnswer: B\n\n"
        "What?\nA. w\nB. x\nC. y\nD. z\nAnswer:"
    )
    assert nlu.mmlu_context("high_school_physics", shots, row) == expected
    with pytest.raises(ValueError, match="expected 4 choices, got 3"):
        nlu.mmlu_question({"question": "q", "choices": ["a", "b", "c"]})


def test_build_mmlu_rows_uses_the_first_shots_of_each_subject() -> None:
    shots = [_mmlu_row("anatomy", f"A{i}", 0) for i in range(6)] + [
        _mmlu_row("virology", f"V{i}", 1) for i in range(5)
    ]
    tests = [_mmlu_row("virology", "t1", 2), _mmlu_row("anatomy", "t2", 1)]
    docs = nlu.build_mmlu_rows(tests, shots)
    assert [(d["subject"], d["answer"], d["letters"]) for d in docs] == [
        ("virology", 2, ["A", "B", "C", "D"]),
        ("anatomy", 1, ["A", "B", "C", "D"]),
    ]
    assert (
        "A4?" not in docs[1]["context"]
        and "\nA4\n" in docs[1]["context"]
        and "\nA5\n" not in docs[1]["context"]
    )
    assert docs[0]["context"] == nlu.mmlu_context("virology", shots[6:11], tests[0])
    with pytest.raises(ValueError, match=r"fewer than 5 examples for subject\(s\) virology"):
        nlu.build_mmlu_rows(tests, shots[:6] + shots[6:10])
