"""GEM's creative-writing diversity protocol pinned to its independent sources.

The metrics against oracles written after the official GEM evaluation script (liziniu/GEM
``evaluation/evaluation_diversity.py``, commit e5b1430); the sampling settings and prompt counts against the GEM
paper's text (tests/eval/fixtures/paper_tables/gem_creative_writing_text.txt).

Self-BLEU: the oracle follows ``evaluation/evaluation_diversity.py`` of liziniu/GEM (``SelfBLEUMetric``, commit e5b1430):
the responses are held as ``response_set[j][i]`` (sample j of prompt i); per prompt, each text i is the hypothesis
and ``texts[:i] + texts[i + 1:]`` its references, scored by ``sacrebleu.corpus_bleu([hypothesis], [references])``
(sacrebleu's defaults: 13a tokens, 4-grams, uniform weights, exp smoothing; the K-1 references passed as ONE
reference stream); the mean over samples, then over prompts, is the similarity and ``100 - similarity`` the
reported ``bleu_diversity_score``. The fixture texts (tests/eval/fixtures/gem_self_bleu_samples.json) make every
other choice of references (last other sample, previous, all others, ...) score differently.
"""

from __future__ import annotations

import json
import re
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
    from eval_tasks.creative.creative import diversity_scores

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


def official_ngram_diversity(response_set: list[list[str]]) -> float:
    """GEM's AveragedNgramDiversityMetric(n_min=1, n_max=3) x 100: distinct-n of each prompt's K responses pooled
    (nltk.util.ngrams over word_tokenize tokens; 0 when there is no n-gram), mean over all (prompt, n)."""
    from nltk.util import ngrams

    results = []
    for i in range(len(response_set[0])):
        responses = [response_set[j][i] for j in range(len(response_set))]
        for n in range(1, 4):
            all_ngrams = [g for r in responses for g in ngrams(M.word_tokenize(r), n)]
            results.append(len(set(all_ngrams)) / len(all_ngrams) if all_ngrams else 0)
    return 100 * sum(results) / len(results)


def test_ngram_diversity_equals_the_official_script() -> None:
    """(word_tokenize itself equals nltk.word_tokenize with an empty punkt_tab: test_metrics.py.)"""
    expected = official_ngram_diversity(_response_set(PROMPTS))
    assert M.corpus_ngram_diversity(PROMPTS) == pytest.approx(expected, abs=1e-9)
    for samples in PROMPTS:
        one = official_ngram_diversity(_response_set([samples]))
        assert M.ngram_diversity(samples) == pytest.approx(one, abs=1e-9)


def test_sbert_diversity_equals_the_official_script() -> None:
    """GEM's SentBertDiversity: for every pair j < i of a prompt's responses the cosine of their embeddings (each
    embedded by the model on its own), 1 - the mean over all pairs, x 100 (here with the offline default model)."""
    import numpy as np

    model = M.load_sbert(None)
    for samples in PROMPTS:
        emb = [np.asarray(model.encode(s), dtype=np.float64) for s in samples]
        sims = [
            float(emb[i] @ emb[j] / (np.linalg.norm(emb[i]) * np.linalg.norm(emb[j])))
            for i in range(len(emb))
            for j in range(i)
        ]
        expected = 100 * (1 - sum(sims) / len(sims))
        assert M.sbert_diversity(samples) == pytest.approx(expected, abs=1e-4)


PAPER_TEXT = Path(__file__).parent / "fixtures" / "paper_tables" / "gem_creative_writing_text.txt"


def test_sampling_settings_and_prompt_counts_equal_the_paper() -> None:
    import yaml

    from eval_tasks.creative.creative import creative_documents
    from eval_tasks.generation import GEM_GENERATION
    from eval_tasks.published import benchmarks
    from tests.helpers.env import REPO_ROOT

    text = " ".join(line for line in PAPER_TEXT.read_text().splitlines() if not line.startswith("#"))
    sampling = re.search(
        r"generate (\d+) samples using the decoding configuration temperature=(\d+), "
        r"top_k=(\d+), and top_p=(\d+(?:\.\d+)?)",
        text,
    )
    max_tokens = re.search(r"maximum number of generation tokens is set to (\d+)", text)
    poems = re.search(r"which includes (\d+) poems", text)
    stories = re.search(r"we create (\d+) prompts based on the ROC Story", text)
    assert sampling and max_tokens and poems and stories
    paper = {
        "num_samples": int(sampling[1]),
        "temperature": float(sampling[2]),
        "top_k": int(sampling[3]),
        "top_p": float(sampling[4]),
        "max_new_tokens": int(max_tokens[1]),
    }
    assert paper == GEM_GENERATION  # distmatch-eval generate's defaults and the protocol notes' reference
    loader = type("L", (yaml.SafeLoader,), {})
    loader.add_constructor("!function", lambda loader, node: None)
    config = yaml.load((REPO_ROOT / "eval_tasks/creative/_diversity_template_yaml").read_text(), loader)
    gen = config["generation_kwargs"]
    assert (config["repeats"], config["filter_list"][0]["filter"][0]["k"]) == (paper["num_samples"],) * 2
    assert gen["do_sample"] is True
    assert (gen["temperature"], gen["top_k"], gen["top_p"], gen["max_gen_toks"]) == (
        paper["temperature"],
        paper["top_k"],
        paper["top_p"],
        paper["max_new_tokens"],
    )
    counts = {"gem_poem": int(poems[1]), "gem_story": int(stories[1])}
    assert {b: benchmarks()[b]["num_prompts"] for b in counts} == counts
    assert len(creative_documents("poem")) == counts["gem_poem"]
    assert len(creative_documents("story")) == counts["gem_story"]
