"""Properties of the evaluation metrics over random inputs, where the example tests are thin.

Drawn by Hypothesis (tests/helpers/properties.py: a fixed seed, a bounded number of examples) and called as users
call them (`eval_tasks.metrics`): pass@k equals the closed form 1 - C(n-c, k) / C(n, k) and is monotone in k (and in
c); distinct-n, n-gram diversity and Self-BLEU diversity do not depend on the order of the samples; a duplicated
sample never raises diversity. Samples are sentences over a small vocabulary (so that they share n-grams), with
punctuation as separate words.

Found: Self-BLEU scores a sample of fewer than 4 tokens 0 whatever its references (sacrebleu's corpus BLEU, GEM's
settings: no effective order), so identical short samples are scored maximally diverse and a duplicated short
sample raises diversity; the duplicate property holds from 4 tokens a sample, and the short case is kept below as
an `xfail(strict=True)` (reported, not fixed here).
"""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from eval_tasks.metrics import (
    distinct_n,
    mean_pass_at_k,
    ngram_diversity,
    pass_at_k,
    self_bleu_diversity,
)
from tests.helpers.properties import bounded

WORDS = ("the", "cat", "sat", "on", "a", "mat", "dog", "ran", "red", "big", ".", ",", "!")
N_MAX = 4  # distinct-n orders checked one by one


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def sentences(min_words: int = 1, max_words: int = 12) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(WORDS), min_size=min_words, max_size=max_words).map(" ".join)


def sample_lists(min_words: int = 1) -> st.SearchStrategy[list[str]]:
    """One prompt's K samples (2 to 6)."""
    return st.lists(sentences(min_words), min_size=2, max_size=6)


# ---------------------------------------------------------------------------------------------------------
# pass@k


@st.composite
def counts(draw: st.DrawFn, max_n: int = 250) -> tuple[int, int]:
    """(n samples, c correct) of one problem."""
    n = draw(st.integers(1, max_n))
    return n, draw(st.integers(0, n))


@bounded(150)
@given(problem=counts())
@example(problem=(200, 1))  # pass@100 = 1/2 exactly (GEM's largest k)
@example(problem=(200, 199))
def test_pass_at_k_is_the_closed_form_and_monotone_in_k(problem: tuple[int, int]) -> None:
    """For every k of the problem: 1 - C(n-c, k) / C(n, k) (exact fractions) to float rounding; not falling with k,
    nor with one more correct sample."""
    n, c = problem
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    for k, value in enumerate(values, start=1):
        assert value == pytest.approx(float(exact_pass_at_k(n, c, k)), rel=1e-12, abs=1e-13)
        assert 0.0 <= value <= 1.0
    assert all(a <= b for a, b in zip(values, values[1:])), values
    if c < n:
        assert all(pass_at_k(n, c, k) <= pass_at_k(n, c + 1, k) for k in range(1, n + 1))


@bounded(40)
@given(problems=st.lists(counts(max_n=60), min_size=1, max_size=8), data=st.data())
def test_mean_pass_at_k_is_the_mean_of_the_closed_forms(
    problems: list[tuple[int, int]], data: st.DataObject
) -> None:
    k = data.draw(st.integers(1, min(n for n, _ in problems)), label="k")
    want = sum(exact_pass_at_k(n, c, k) for n, c in problems) / len(problems)
    assert mean_pass_at_k(problems, k) == pytest.approx(float(want), rel=1e-12, abs=1e-13)


# ---------------------------------------------------------------------------------------------------------
# Diversity: the order of the samples, a duplicated sample


@bounded(60)
@given(samples=sample_lists(), data=st.data())
def test_distinct_n_and_ngram_diversity_do_not_depend_on_the_order(
    samples: list[str], data: st.DataObject
) -> None:
    shuffled = data.draw(st.permutations(samples), label="shuffled")
    for n in range(1, N_MAX + 1):
        assert distinct_n(shuffled, n) == distinct_n(samples, n)
    assert ngram_diversity(shuffled) == ngram_diversity(samples)


@bounded(60)
@given(samples=sample_lists(), data=st.data())
def test_self_bleu_diversity_does_not_depend_on_the_order(samples: list[str], data: st.DataObject) -> None:
    """Each sample against all the others (the default; gem_compat's first-other reference is order-bound)."""
    shuffled = data.draw(st.permutations(samples), label="shuffled")
    assert self_bleu_diversity(shuffled) == pytest.approx(self_bleu_diversity(samples), abs=1e-9)


@bounded(60)
@given(samples=sample_lists(), data=st.data())
def test_a_duplicated_sample_does_not_raise_ngram_diversity(samples: list[str], data: st.DataObject) -> None:
    copy = data.draw(st.sampled_from(samples), label="duplicated")
    more = [*samples, copy]
    for n in range(1, N_MAX + 1):
        before, after = distinct_n(samples, n), distinct_n(more, n)
        assert (before is None) == (after is None)
        assert after is None or after <= before
    assert ngram_diversity(more) <= ngram_diversity(samples)


@bounded(60)
@given(samples=sample_lists(min_words=4), data=st.data())
@example(samples=["the cat sat on", "the cat sat on the mat"], data=None)  # a sample of exactly 4 tokens
def test_a_duplicated_sample_does_not_raise_self_bleu_diversity(
    samples: list[str], data: st.DataObject
) -> None:
    """From 4 tokens a sample (BLEU's 4-grams; fewer: test_a_duplicated_short_sample_raises_self_bleu_diversity)."""
    copy = samples[-1] if data is None else data.draw(st.sampled_from(samples), label="duplicated")
    assert self_bleu_diversity([*samples, copy]) <= self_bleu_diversity(samples) + 1e-9


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="Self-BLEU scores a sample under 4 tokens 0 against any references (sacrebleu corpus BLEU without "
    "effective order, GEM's settings): identical short samples score diversity 100, duplicating one raises it",
)
@pytest.mark.parametrize(
    "samples",
    [
        pytest.param(["Yes .", "Yes ."], id="identical-short-samples"),  # diversity 100, not 0
        pytest.param(["a b c d e", "a b c d e f", "x"], id="one-short-sample"),  # 47.4 -> 60.5 with "x" twice
    ],
)
def test_a_duplicated_short_sample_raises_self_bleu_diversity(samples: list[str]) -> None:
    assert self_bleu_diversity([*samples, samples[-1]]) <= self_bleu_diversity(samples) + 1e-9
    assert self_bleu_diversity([samples[-1]] * 2) == pytest.approx(0.0, abs=1e-9)  # the docstring's promise
