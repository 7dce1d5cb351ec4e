"""N-gram diversity (GEM's definition): distinct-n pooled over one prompt's samples, averaged over n = 1..n_max.

Tokens: ``nltk.word_tokenize`` as it behaves with an empty (untrained) ``punkt_tab`` (:func:`word_tokenize`, no
NLTK data needed); ``tokenizer="punkt"`` uses the trained data when installed; ``"whitespace"`` splits on spaces.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from distmatch.optional import require
from eval_tasks.metrics.inputs import EVAL_EXTRA as _EVAL
from eval_tasks.metrics.inputs import DiversityInputError, check_samples

__all__ = ["distinct_n", "ngram_diversity", "word_tokenize"]


# ---------------------------------------------------------------------------------------------------------
# Tokenisation

_PUNKT: Any = None
_TREEBANK: Any = None


def word_tokenize(text: str) -> list[str]:
    """``nltk.word_tokenize(text)`` as it behaves with an empty (untrained) ``punkt_tab``; needs no NLTK data."""
    global _PUNKT, _TREEBANK
    if _PUNKT is None:
        require("nltk", extra=_EVAL, feature="N-gram diversity (NLTK word tokenisation)")
        from nltk.tokenize.destructive import NLTKWordTokenizer
        from nltk.tokenize.punkt import PunktSentenceTokenizer

        _PUNKT, _TREEBANK = PunktSentenceTokenizer(), NLTKWordTokenizer()
    return [token for sentence in _PUNKT.tokenize(text) for token in _TREEBANK.tokenize(sentence)]


def _punkt_word_tokenize(text: str) -> list[str]:
    nltk = require("nltk", extra=_EVAL, feature="N-gram diversity with tokenizer='punkt'")
    try:
        return nltk.word_tokenize(text)
    except LookupError as err:
        raise LookupError(
            "tokenizer='punkt' needs NLTK's trained 'punkt_tab' data, which is not installed (and cannot be "
            "downloaded offline). Use the default tokenizer='nltk' (the same tokenizer with an untrained Punkt "
            "model, no data needed) or install the data: python -m nltk.downloader punkt_tab"
        ) from err


_TOKENIZERS: dict[str, Callable[[str], list[str]]] = {
    "nltk": word_tokenize,
    "punkt": _punkt_word_tokenize,
    "whitespace": str.split,
}


def _get_tokenizer(tokenizer: str | Callable[[str], list[str]]) -> Callable[[str], list[str]]:
    if callable(tokenizer):
        return tokenizer
    try:
        return _TOKENIZERS[tokenizer]
    except KeyError:
        raise ValueError(
            f"Unknown tokenizer {tokenizer!r}. Valid: {', '.join(_TOKENIZERS)} or a callable str -> list[str]."
        ) from None


# ---------------------------------------------------------------------------------------------------------
# N-gram diversity


def distinct_n(
    samples: Sequence[str], n: int, *, tokenizer: str | Callable[[str], list[str]] = "nltk"
) -> float | None:
    """Unique / total n-grams pooled over `samples` (a fraction), or None when no sample has n tokens."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}.")
    tokenize = _get_tokenizer(tokenizer)
    counts: Counter[tuple[str, ...]] = Counter()
    for text in samples:
        tokens = tokenize(text)
        counts.update(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    total = sum(counts.values())
    return len(counts) / total if total else None


def ngram_diversity(
    samples: Sequence[str],
    n_max: int = 3,
    *,
    tokenizer: str | Callable[[str], list[str]] = "nltk",
    allow_empty: bool = False,
) -> float:
    """N-gram diversity of one prompt's samples: mean over n = 1..n_max of distinct-n, x100 (GEM's definition).

    An order n that no sample reaches (every sample shorter than n tokens) is left out of the mean.
    Identical samples without repeated n-grams give 100 / K; samples sharing no n-gram and repeating none, 100.
    """
    samples = check_samples(samples, allow_empty=allow_empty)
    if not isinstance(n_max, int) or n_max < 1:
        raise ValueError(f"n_max must be a positive integer, got {n_max!r}.")
    values = [
        v for n in range(1, n_max + 1) if (v := distinct_n(samples, n, tokenizer=tokenizer)) is not None
    ]
    if not values:
        raise DiversityInputError("samples: no sample has a single token; n-gram diversity is undefined.")
    return 100.0 * sum(values) / len(values)
