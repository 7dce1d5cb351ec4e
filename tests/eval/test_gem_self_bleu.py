"""GEM's compatibility Self-BLEU pinned to the official GEM evaluation script.

The oracle below follows ``evaluation/evaluation_diversity.py`` of liziniu/GEM (``SelfBLEUMetric``, commit e5b1430):
the responses are held as ``response_set[j][i]`` (sample j of prompt i); per prompt, each text i is the hypothesis
and ``texts[:i] + texts[i + 1:]`` its references, scored by ``sacrebleu.corpus_bleu([hypothesis], [references])``
(sacrebleu's defaults: 13a tokens, 4-grams, uniform weights, exp smoothing; the K-1 references passed as ONE
reference stream); the mean over samples, then over prompts, is the similarity and ``100 - similarity`` the
reported ``bleu_diversity_score``. The fixture texts (tests/eval/fixtures/gem_self_bleu_samples.json) make every
other choice of references (last other sample, previous, all others, ...) score differently.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_tasks import metrics as M

sacrebleu = pytest.importorskip("sacrebleu")

PROMPTS: list[list[str]] = json.loads(
    (Path(__file__).parent / "fixtures" / "gem_self_bleu_samples.json").read_text()
)["prompts"]


def official_bleu_diversity(response_set: list[list[str]]) -> tuple[float, list[float]]:
    """GEM's SelfBLEUMetric on ``response_set[j][i]``: (100 - mean similarity, per-prompt 100 - similarity)."""
    k = len(response_set)
    per_prompt = []
    for i in range(len(response_set[0])):
        texts = [response_set[j][i] for j in range(k)]
        scores = []
        for h in range(len(texts)):
            references = texts[:h] + texts[h + 1 :]
            if references:
                scores.append(sacrebleu.corpus_bleu([texts[h]], [references]).score)
        per_prompt.append(sum(scores) / len(scores) if scores else 0)
    similarity = sum(per_prompt) / len(per_prompt)
    return 100 - similarity, [100 - s for s in per_prompt]


def _response_set(prompts: list[list[str]]) -> list[list[str]]:
    return [[samples[j] for samples in prompts] for j in range(len(prompts[0]))]


def test_gem_compat_self_bleu_equals_the_official_script() -> None:
    from eval_tasks.creative import diversity_scores

    total, per_prompt = official_bleu_diversity(_response_set(PROMPTS))
    for samples, expected in zip(PROMPTS, per_prompt, strict=True):
        assert M.self_bleu_diversity(samples, gem_compat=True) == pytest.approx(expected, abs=1e-9)
        # the lm-eval diversity tasks' per-prompt scores (DiversityTask / diversity_process_results; the
        # offline Sentence-BERT model is loaded for the third metric)
        got = diversity_scores(samples, gem_compat=True)["self_bleu_diversity"]
        assert got == pytest.approx(expected, abs=1e-9)
    assert M.corpus_self_bleu_diversity(PROMPTS, gem_compat=True) == pytest.approx(total, abs=1e-9)


def test_default_self_bleu_uses_every_other_sample_and_differs_from_the_script() -> None:
    """The default is the corrected definition: each other sample its own reference stream."""
    total, per_prompt = official_bleu_diversity(_response_set(PROMPTS))
    for samples, script in zip(PROMPTS, per_prompt, strict=True):
        scores = [
            sacrebleu.corpus_bleu([h], [[r] for r in samples[:j] + samples[j + 1 :]]).score
            for j, h in enumerate(samples)
        ]
        expected = 100 - sum(scores) / len(scores)
        assert M.self_bleu_diversity(samples) == pytest.approx(expected, abs=1e-9)
        assert abs(expected - script) > 5  # the fixture makes the reference choice matter
    assert M.corpus_self_bleu_diversity(PROMPTS) != pytest.approx(total, abs=1)
