"""Outside audit ("noveltybench and placement round"): NoveltyBench's rules, its options and its pre-flight, each
parameter and guard alone, against values computed by hand from NoveltyBench's code (novelty-bench/novelty-bench @
5b22b53: partition.py's ``maybe_test_equality`` / ``partition_responses``, score.py's ``transform_raw_reward`` and
patience-weighted ``np.average``, summarize.py's means) and the README's documented contract, not from the module.
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path

import numpy as np
import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.lm_eval_tasks.preflight import check_novelty_models
from eval_tasks.novelty import noveltybench as nb
from eval_tasks.task_options import check_task_options, resolve

#: score.py's thresholds, as its source lists them
SCORE_PY_THRESHOLDS = [-7.71875, -6.28125, -6.0, -5.71875, -5.5, -5.0, -4.375, -3.4375, -2.046875]
LONG = "the girl and her old dog walked to the sea {}"  # more than 5 words: the classifier decides


def official_utility(scores: list[float], patience: float = 0.8) -> float:
    """score.py: np.average(generation_scores, weights=patience ** np.arange(len(generation_scores)))."""
    return float(np.average(scores, weights=patience ** np.arange(len(scores))))


def table_similarity(table: dict[tuple[str, str], float]):
    """A classifier of fixed outputs that answers only the pairs NoveltyBench would ask (KeyError otherwise)."""

    def similarity(pairs):
        return [table[pair] for pair in pairs]

    return similarity


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("red apple", "red pear", True),  # 1 shared word x 2 >= 2: exactly half is enough
        ("", "", True),  # two empty responses: 0 >= 0
        ("Yes", "yes", True),  # lowercased
        ("  Yes  ", "YES", True),  # stripped
        ("one two three four five", "one two", False),  # 2 x 2 < 5
        ("one two three four five", "one two three", True),  # 2 x 3 >= 5
        ("one two three four five six", "one", None),  # 6 words: the classifier decides
    ],
)
def test_short_response_rule_by_hand(a: str, b: str, expected: bool | None) -> None:
    assert nb.short_response_equality(a, b) is expected


def test_partition_joins_the_first_matching_class_comparing_first_members_only() -> None:
    a, b, c, d = (LONG.format(x) for x in "abcd")
    # b opens class 1; c matches both classes: it joins the first (class 0); d matches only class 1's first member b
    table = {(a, b): 0.0, (a, c): 0.9, (b, c): 0.9, (a, d): 0.0, (b, d): 0.9}
    assert nb.partition([a, b, c, d], table_similarity(table)) == [0, 1, 0, 1]
    # the pair is (first member, new response); a later member (c of class 0) is never asked
    a2, e = LONG.format("a2"), LONG.format("e")
    table = {(a, a2): 0.5, (a, e): 0.0}  # (a2, e) would say equivalent, but a2 is not the first member
    assert nb.partition([a, a2, e], table_similarity(table)) == [0, 0, 1]


def test_partition_default_threshold_is_0_102_strict() -> None:
    a, b = LONG.format("a"), LONG.format("b")
    for prob, classes in ((0.1021, [0, 0]), (0.15, [0, 0]), (0.19, [0, 0]), (0.102, [0, 1]), (0.05, [0, 1])):
        assert nb.partition([a, b], table_similarity({(a, b): prob})) == classes, prob
    assert nb.CLASSIFIER_THRESHOLD == 0.102


def test_short_rule_decides_without_the_classifier_in_partition() -> None:
    def no_classifier(pairs):
        raise AssertionError(f"classifier asked about {pairs}")

    assert nb.partition(["Yes", "yes", "No", "red apple", "red pear"], no_classifier) == [0, 0, 1, 2, 2]


def test_reward_bins_are_score_pys_transform() -> None:
    for i, t in enumerate(SCORE_PY_THRESHOLDS):
        assert nb.reward_bin(t) == i + 1  # a reward equal to a threshold falls in the lower bin
        assert nb.reward_bin(t + 1e-6) == i + 2
        assert nb.reward_bin(t) == bisect.bisect_left(SCORE_PY_THRESHOLDS, t) + 1
    assert nb.reward_bin(-100.0) == 1 and nb.reward_bin(100.0) == 10
    assert [nb.reward_bin(r) for r in (-5.3, -5.4, -5.6, -2.0)] == [6, 6, 5, 10]


def test_utility_is_score_pys_patience_average_by_hand() -> None:
    # weights 1, 0.8, 0.64: (10 + 0 + 0.64 * 5) / 2.44
    assert nb.utility([10, 0, 5]) == pytest.approx(13.2 / 2.44)
    assert nb.utility([10, 0, 5]) == pytest.approx(official_utility([10, 0, 5]))
    assert nb.utility([0, 0, 10]) == pytest.approx(6.4 / 2.44)
    assert nb.utility([3, 7], patience=0.5) == pytest.approx((3 + 3.5) / 1.5)
    assert nb.PATIENCE == 0.8


def test_prompt_scores_count_classes_and_score_first_members_only() -> None:
    classes, bins = [0, 0, 1, 2, 1], [4, 9, 6, 2, 10]
    scores = nb.prompt_scores(classes, bins)
    assert scores["distinct"] == 3.0  # the number of classes (summarize.py), not max(partition) = 2
    assert scores["utility"] == pytest.approx(official_utility([4, 0, 6, 2, 0]))
    assert nb.generation_scores(classes, bins) == [4, 0, 6, 2, 0]


def test_summary_is_the_mean_over_prompts() -> None:
    per_prompt = [
        {"distinct": 2.0, "utility": 3.0},
        {"distinct": 5.0, "utility": 6.0},
        {"distinct": 8.0, "utility": 0.0},
    ]
    assert nb.summarize(per_prompt) == {"distinct": 5.0, "utility": 3.0}


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("my/classifier", None, 10, None), "classifier my/classifier"),
        (
            (None, "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", 10, None),
            "reward model Skywork/Skywork-Reward-Llama",
        ),
        ((None, None, 4, None), "4 samples per prompt"),
        ((None, None, 10, "2 of the 100 NB-curated prompts"), "2 of the 100 NB-curated prompts"),
    ],
)
def test_each_change_alone_is_not_comparable(args: tuple, named: str) -> None:
    setting = nb.comparability(*args)
    assert setting["comparable"] is False and named in setting["note"]


def test_unset_or_published_models_are_comparable_and_recorded_by_name() -> None:
    for classifier, reward in ((None, None), (nb.PUBLISHED_CLASSIFIER, nb.PUBLISHED_REWARD_MODEL)):
        setting = nb.comparability(classifier, reward, 10)
        assert setting["comparable"] is True
        assert setting["classifier"] == "yimingzhang/deberta-v3-large-generation-similarity"
        assert setting["reward_model"] == "Skywork/Skywork-Reward-Gemma-2-27B-v0.2"


def test_detect_subset_needs_every_prompt_and_gives_the_subsets_size() -> None:
    curated = [d["prompt"] for d in nb.novelty_documents("curated")]
    assert nb.detect_subset(curated[:3]) == ("curated", 100)
    assert nb.detect_subset(curated[:3] + ["Write a poem about a lighthouse keeper's cat."]) == (None, 0)
    wildchat = [d["prompt"] for d in nb.novelty_documents("wildchat")]
    assert nb.detect_subset(wildchat[5:7]) == ("wildchat", 1000)


# --- options and pre-flight (README "Options") ------------------------------------------------------------------


def test_novelty_defaults_are_the_published_setting() -> None:
    options = resolve("novelty", {})
    assert options["num_samples"] == 10
    assert options["reward_model"] == "Skywork/Skywork-Reward-Gemma-2-27B-v0.2"
    assert options["classifier"] == "yimingzhang/deberta-v3-large-generation-similarity"


def test_num_samples_below_two_is_refused() -> None:
    check_task_options({"num_samples": 2})
    with pytest.raises(DistMatchConfigError, match="num_samples"):
        check_task_options({"num_samples": 1})


def _folder(root: Path, name: str, architectures: list[str], num_labels: int) -> str:
    folder = root / name
    folder.mkdir()
    spec = {
        "architectures": architectures,
        "num_labels": num_labels,
        "id2label": {str(i): f"L{i}" for i in range(num_labels)},
    }
    (folder / "config.json").write_text(json.dumps(spec))
    return str(folder)


TASKS = ["distmatch_noveltybench_curated"]


def test_preflight_takes_a_one_label_reward_model_and_refuses_other_checkpoints(tmp_path: Path) -> None:
    reward = _folder(tmp_path, "reward", ["LlamaForSequenceClassification"], 1)
    classifier = _folder(tmp_path, "classifier", ["DebertaV2ForSequenceClassification"], 2)
    check_novelty_models(TASKS, {"reward_model": reward, "classifier": classifier}, {})
    causal = _folder(tmp_path, "causal", ["LlamaForCausalLM"], 2)
    for option in ("classifier", "reward_model"):
        with pytest.raises(DistMatchConfigError, match=f"{option}=.*not a sequence classifier"):
            check_novelty_models(TASKS, {option: causal}, {})
    three = _folder(tmp_path, "three", ["DebertaV2ForSequenceClassification"], 3)
    with pytest.raises(DistMatchConfigError, match="classifier=.*3 labels"):
        check_novelty_models(TASKS, {"classifier": three}, {})


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "mps", "xpu", "xpu:0"])
def test_preflight_accepts_device_names(device: str) -> None:
    check_novelty_models(TASKS, {"scorer_device": device}, {})


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda1"])
def test_preflight_refuses_other_device_names(device: str) -> None:
    with pytest.raises(DistMatchConfigError, match="scorer_device"):
        check_novelty_models(TASKS, {"scorer_device": device}, {})


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on"])
def test_preflight_sees_every_offline_spelling(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """huggingface_hub reads HF_HUB_OFFLINE as true for 1 / true / yes / on: an uncached Hub id is refused for each."""
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))  # an empty cache
    with pytest.raises(DistMatchConfigError, match="HF_HUB_OFFLINE"):
        check_novelty_models(
            TASKS, {"classifier": "someone/not-cached-classifier"}, {"HF_HUB_OFFLINE": value}
        )
