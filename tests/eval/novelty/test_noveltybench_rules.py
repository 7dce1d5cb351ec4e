"""NoveltyBench's rules (eval_tasks/novelty/noveltybench.py) against NoveltyBench's own code.

fixtures/noveltybench_rules.json: novelty-bench/novelty-bench @ 5b22b53's partition.py / score.py / summarize.py run
outside the project (fixtures/run_noveltybench.py) on fixed responses, with its classifier call and reward model
replaced by the fixed probabilities (every ordered pair, asymmetric) and raw rewards stored beside them.
fixtures/noveltybench_gemini_curated.json: the repository's example leaderboard submission (gemini-1.5-pro on
NB-Curated): its partitions, partition scores and utilities, and its summary.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_tasks.novelty import noveltybench as nb

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RULES = json.loads((FIXTURES / "noveltybench_rules.json").read_text())
CASES = RULES["cases"]


def _similarity(case: dict, calls: list | None = None):
    """The fixture's classifier: the probability NoveltyBench's stub returned for (first member, candidate)."""
    index = case["responses"].index

    def similarity(pairs):
        if calls is not None:
            calls.extend([index(a), index(b)] for a, b in pairs)
        return [case["classifier"][f"{index(a)},{index(b)}"] for a, b in pairs]

    return similarity


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_partition_and_utility_reproduce_noveltybench(case: dict) -> None:
    calls: list = []
    classes = nb.partition(case["responses"], _similarity(case, calls))
    assert classes == case["nb_partition"]
    # the same ordered pairs as NoveltyBench's (first member, candidate); here scored against every class at once
    assert {tuple(c) for c in case["classifier_calls"]} <= {tuple(c) for c in calls}
    assert all(a < b for a, b in calls)
    bins = [nb.reward_bin(r) for r in case["rewards"]]
    assert bins == case["nb_bins"]
    assert nb.generation_scores(classes, bins) == case["nb_generation_scores"]
    scores = nb.prompt_scores(classes, bins)
    assert scores["distinct"] == len(case["nb_partition_scores"]) == case["nb_distinct_field"] + 1
    assert scores["utility"] == pytest.approx(case["nb_utility"], rel=1e-12, abs=1e-12)


def test_summary_bins_and_short_rule_reproduce_noveltybench() -> None:
    per_prompt = [
        nb.prompt_scores(
            nb.partition(c["responses"], _similarity(c)), [nb.reward_bin(r) for r in c["rewards"]]
        )
        for c in CASES
    ]
    summary = nb.summarize(per_prompt)
    assert summary["distinct"] == pytest.approx(RULES["summary"]["mean_distinct"], rel=1e-12)
    assert summary["utility"] == pytest.approx(RULES["summary"]["mean_utility"], rel=1e-12)
    for raw, expected in RULES["bins"]:  # at, just below and just above every threshold: bisect_left + 1
        assert nb.reward_bin(raw) == expected, raw
    for a, b, expected in RULES["short_rule"]:
        assert nb.short_response_equality(a, b) is expected, (a, b)


def test_threshold_is_strict_and_pair_order_matters() -> None:
    long_a, long_b = "one two three four five six", "seven eight nine ten eleven twelve"
    assert nb.partition([long_a, long_b], lambda pairs: [0.102] * len(pairs)) == [0, 1]
    assert nb.partition([long_a, long_b], lambda pairs: [0.1021] * len(pairs)) == [0, 0]
    asked = []
    nb.partition([long_a, long_b], lambda pairs: asked.extend(pairs) or [0.0] * len(pairs))
    assert asked == [(long_a, long_b)]  # (first member of the class, the new response)


def test_gemini_example_submission_utilities_and_summary() -> None:
    example = json.loads((FIXTURES / "noveltybench_gemini_curated.json").read_text())
    per_prompt = []
    for row in example["rows"]:
        # the bins of a class's later members never count: give them anything
        firsts, bins = iter(row["partition_scores"]), []
        seen = 0
        for c in row["partition"]:
            if c == seen:
                bins.append(next(firsts))
                seen += 1
            else:
                bins.append(10)
        assert nb.generation_scores(row["partition"], bins) == row["generation_scores"]
        scores = nb.prompt_scores(row["partition"], bins)
        assert scores["utility"] == pytest.approx(row["utility"], rel=1e-12)
        per_prompt.append(scores)
    summary = nb.summarize(per_prompt)
    assert summary["utility"] == pytest.approx(example["summary_json"]["mean_utility"], rel=1e-12)
    # summary.json predates the summarize fix (db138f1): its 0.83 is the mean of max(partition), one less per prompt
    assert summary["distinct"] == pytest.approx(example["summary_json"]["mean_distinct"] + 1, rel=1e-12)


def test_shipped_prompts_and_refusals(tmp_path: Path) -> None:
    curated = nb.novelty_documents("curated")
    wildchat = nb.novelty_documents("wildchat")
    assert (len(curated), len(wildchat)) == (100, 1000)
    assert curated[0] == {
        "id": "curated-0",
        "prompt": "Tell me a story in five sentences about a girl and her dog.",
        "category": "Creativity",
    }
    assert len({d["id"] for d in wildchat}) == 1000
    hub_rows = [{"id": "w-1", "prompt": "Name a colour."}]
    asked = []
    docs = nb.novelty_documents(
        "wildchat", source="hub", load_dataset=lambda name, split: asked.append((name, split)) or hub_rows
    )
    assert asked == [("yimingzhang/novelty-bench", "wildchat")]
    assert docs == [{"id": "w-1", "prompt": "Name a colour.", "category": ""}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": ""}\n')
    with pytest.raises(ValueError, match="record #0"):
        nb.novelty_documents("curated", bad)
    with pytest.raises(ValueError, match="valid: curated, wildchat"):
        nb.novelty_documents("poems")
    with pytest.raises(ValueError, match="at least one"):
        nb.prompt_scores([], [])


def test_comparability_names_every_change() -> None:
    assert nb.comparability(None, None, 10)["comparable"] is True
    other = nb.comparability("tiny-cls", "tiny-rm", 4)
    assert other["comparable"] is False
    assert other["note"].startswith("not comparable")
    assert "tiny-cls" in other["note"] and "tiny-rm" in other["note"] and "4 samples" in other["note"]


def test_published_rows_equal_their_sources_and_the_readme() -> None:
    """eval_tasks/published/noveltybench.json: the leaderboard rows as the page lists them
    (tests/eval/fixtures/paper_tables/noveltybench_leaderboard.txt), the example submission's numbers as the
    repository's files give them (fixtures/noveltybench_gemini_curated.json; NB-WildChat: its summary.json), and the
    family README's table the same numbers."""
    from eval_tasks import published as P
    from tests.helpers.env import REPO_ROOT

    rows = [r for r in P.numbers() if r["source_file"] == "noveltybench.json"]
    page = (REPO_ROOT / "tests/eval/fixtures/paper_tables/noveltybench_leaderboard.txt").read_text()
    leaderboard = {}
    for line in page.splitlines():
        if not line.startswith("#"):
            _, model, distinct, utility, _ = (c.strip() for c in line.split("|"))
            leaderboard[(model, "distinct")], leaderboard[(model, "utility")] = (
                float(distinct),
                float(utility),
            )
    published = {
        (r["method"], r["metric"]): r["value"] for r in rows if r["benchmark"] == "noveltybench_leaderboard"
    }
    assert published == leaderboard
    example = json.loads((FIXTURES / "noveltybench_gemini_curated.json").read_text())
    curated = {r["metric"]: r["value"] for r in rows if r["benchmark"] == "noveltybench_curated"}
    assert curated["utility"] == round(example["summary_json"]["mean_utility"], 4)
    assert curated["distinct"] == pytest.approx(
        sum(len(r["partition_scores"]) for r in example["rows"]) / 100
    )
    wildchat = {r["metric"]: r["value"] for r in rows if r["benchmark"] == "noveltybench_wildchat"}
    assert wildchat == {"utility": round(2.7129662055358414, 4)}  # nb-wildchat/summary.json's mean_utility
    readme = (REPO_ROOT / "eval_tasks/novelty/README.md").read_text()
    for (model, metric), value in published.items():
        line = next(line for line in readme.splitlines() if line.startswith(f"| {model} | leaderboard |"))
        assert f"| {value:.2f} |" in line, (model, metric)
