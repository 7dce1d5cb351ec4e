"""eval_tasks.metrics.ngram against its contract, for what tests/eval/test_metrics.py leaves open: the default
tokenizer is ``nltk.word_tokenize`` with an untrained Punkt model (its first use builds it, and without NLTK says
which extra to install: distmatch.optional.require), ``tokenizer='punkt'`` is NLTK's own ``word_tokenize`` (without
its trained data, a LookupError that says how to get it or what to use instead), a callable is used as the
tokenizer, and the bad inputs are refused in words."""

from __future__ import annotations

import sys

import pytest

from eval_tasks.metrics import ngram
from eval_tasks.metrics.inputs import DiversityInputError
from eval_tasks.metrics.ngram import distinct_n, ngram_diversity, word_tokenize


@pytest.fixture
def fresh_tokenizer(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The module builds its Punkt and Treebank tokenizers on first use: start from before that use."""
    monkeypatch.setattr(ngram, "_PUNKT", None)
    monkeypatch.setattr(ngram, "_TREEBANK", None)
    return monkeypatch


def test_the_first_use_builds_nltk_word_tokenize(fresh_tokenizer: pytest.MonkeyPatch) -> None:
    # nltk.word_tokenize: sentences (Punkt), then the Treebank word tokenizer on each
    assert word_tokenize("Hello world. It's 3.5 km!") == ["Hello", "world", ".", "It", "'s", "3.5", "km", "!"]


def test_without_nltk_the_default_tokenizer_names_the_extra(fresh_tokenizer: pytest.MonkeyPatch) -> None:
    fresh_tokenizer.setitem(sys.modules, "nltk", None)
    with pytest.raises(ImportError) as err:
        word_tokenize("a b")
    assert str(err.value) == (
        "N-gram diversity (NLTK word tokenisation) needs nltk, which is not installed. "
        "Install it with: pip install 'distmatch[eval]'"
    )


def test_punkt_is_nltks_own_word_tokenize(monkeypatch: pytest.MonkeyPatch) -> None:
    import nltk

    seen = []
    monkeypatch.setattr(nltk, "word_tokenize", lambda text: seen.append(text) or text.upper().split())
    assert distinct_n(["a b a"], 1, tokenizer="punkt") == pytest.approx(2 / 3)
    assert seen == ["a b a"]


def test_punkt_without_its_data_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    import nltk

    def no_data(text: str) -> list[str]:
        raise LookupError("Resource punkt_tab not found.")

    monkeypatch.setattr(nltk, "word_tokenize", no_data)
    with pytest.raises(LookupError) as err:
        distinct_n(["a b"], 1, tokenizer="punkt")
    assert str(err.value) == (
        "tokenizer='punkt' needs NLTK's trained 'punkt_tab' data, which is not installed (and cannot be "
        "downloaded offline). Use the default tokenizer='nltk' (the same tokenizer with an untrained Punkt "
        "model, no data needed) or install the data: python -m nltk.downloader punkt_tab"
    )


def test_punkt_without_nltk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nltk", None)
    with pytest.raises(ImportError) as err:
        distinct_n(["a b"], 1, tokenizer="punkt")
    assert str(err.value) == (
        "N-gram diversity with tokenizer='punkt' needs nltk, which is not installed. "
        "Install it with: pip install 'distmatch[eval]'"
    )


def test_a_callable_is_the_tokenizer() -> None:
    assert distinct_n(["a-b-a"], 1, tokenizer=lambda text: text.split("-")) == pytest.approx(2 / 3)


def test_an_unknown_tokenizer_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError) as err:
        distinct_n(["a"], 1, tokenizer="spacy")
    assert (
        str(err.value)
        == "Unknown tokenizer 'spacy'. Valid: nltk, punkt, whitespace or a callable str -> list[str]."
    )


@pytest.mark.parametrize("n", [0, -1, 1.5, "2"])
def test_n_must_be_a_positive_integer(n: object) -> None:
    with pytest.raises(ValueError) as err:
        distinct_n(["a b"], n)  # type: ignore[arg-type]
    assert str(err.value) == f"n must be a positive integer, got {n!r}."


def test_samples_without_a_token_are_refused_in_words() -> None:
    with pytest.raises(DiversityInputError) as err:
        ngram_diversity(["", " "], allow_empty=True, tokenizer="whitespace")
    assert str(err.value) == "samples: no sample has a single token; n-gram diversity is undefined."
