"""Self-BLEU diversity: 100 - mean over samples j of sacrebleu BLEU(sample j | the other samples)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distmatch.optional import require
from eval_tasks.metrics.inputs import EVAL_EXTRA as _EVAL
from eval_tasks.metrics.inputs import check_samples

__all__ = ["self_bleu", "self_bleu_diversity"]


_BLEU: Any = None


def _bleu() -> Any:
    global _BLEU
    if _BLEU is None:
        require("sacrebleu", extra=_EVAL, feature="Self-BLEU diversity")
        from sacrebleu.metrics import BLEU

        # GEM's settings = sacrebleu.corpus_bleu defaults: 13a tokenizer, 4-grams, 'exp' smoothing,
        # case-sensitive, no effective order.
        _BLEU = BLEU()
    return _BLEU


def self_bleu(samples: Sequence[str], *, gem_compat: bool = False, allow_empty: bool = False) -> float:
    """Mean over samples j of BLEU(sample j | the other samples), 0-100.

    Default: each of the K-1 other samples is a separate reference (multi-reference BLEU: n-gram matches are
    clipped by the maximum count in any reference, brevity penalty from the closest reference length).
    ``gem_compat=True``: only the first other sample (in order) is the reference, as in the published GEM script.
    """
    samples = check_samples(samples, allow_empty=allow_empty)
    bleu = _bleu()
    scores = []
    for j, hypothesis in enumerate(samples):
        others = samples[:j] + samples[j + 1 :]
        references = [[others[0]]] if gem_compat else [[other] for other in others]
        scores.append(bleu.corpus_score([hypothesis], references).score)
    return sum(scores) / len(scores)


def self_bleu_diversity(
    samples: Sequence[str], gem_compat: bool = False, *, allow_empty: bool = False
) -> float:
    """100 - Self-BLEU (see :func:`self_bleu`): 0 for identical samples, 100 when no sample shares a word."""
    return 100.0 - self_bleu(samples, gem_compat=gem_compat, allow_empty=allow_empty)
