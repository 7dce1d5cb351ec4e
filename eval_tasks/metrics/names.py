"""The names of the diversity metrics: the one definition every other list derives from.

``METRIC_KEYS`` maps the short names (``distmatch-eval diversity --metrics``, :func:`corpus_diversity`'s
``metrics``) to the result keys (lm-eval metric names, ``distmatch.diversity`` JSON keys, report columns).
"""

from __future__ import annotations

__all__ = ["DIVERSITY_METRICS", "MAUVE", "METRICS", "METRIC_KEYS", "REPORTED_METRICS"]

#: short name -> result key of the per-prompt diversity metrics (order = column order everywhere)
METRIC_KEYS = {"ngram": "ngram_diversity", "self_bleu": "self_bleu_diversity", "sbert": "sbert_diversity"}
#: the short names
METRICS = tuple(METRIC_KEYS)
#: the result keys of the per-prompt diversity metrics (the creative-writing tasks' metrics)
DIVERSITY_METRICS = tuple(METRIC_KEYS.values())
#: MAUVE: a corpus-level metric against human references (``distmatch-eval diversity --metrics mauve``)
MAUVE = "mauve"
#: what a diversity report shows: the per-prompt metrics, then MAUVE
REPORTED_METRICS = (*DIVERSITY_METRICS, MAUVE)
