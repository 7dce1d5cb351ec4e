"""MAUVE between human and model texts (package ``mauve-text``), with configurable features.

The offline default featurizer is the Sentence-BERT default of :mod:`eval_tasks.metrics.sentence_bert`, so numbers
are not comparable to papers that used gpt2-large features (``featurizer="lm:gpt2-large"``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from distmatch.optional import require
from eval_tasks.metrics.inputs import EVAL_EXTRA as _EVAL
from eval_tasks.metrics.inputs import DiversityInputError
from eval_tasks.metrics.sentence_bert import DEFAULT_SBERT_MODEL, embed

__all__ = ["mauve_score", "text_features"]


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
        return embed(texts, None if name == DEFAULT_SBERT_MODEL else name, batch_size, device)
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
    max_text_length: int = 1024,
) -> dict[str, Any]:
    """MAUVE between human texts P and model texts Q, x100 (the EMO paper's scale), via ``mauve-text``.

    Features come from `featurizer` (see :func:`text_features`) unless given. Returns ``mauve``,
    ``frontier_integral`` (x100), ``num_buckets``, ``featurizer``. MAUVE is only comparable between runs scored
    with the same featurizer, number of texts and settings; the papers used gpt2-large features.
    `max_text_length`: tokens kept per text by a language-model featurizer (mauve-text's default 1024; EMO: 256).
    """
    mauve = require("mauve", extra=_EVAL, feature="MAUVE (package mauve-text)")
    if p_features is None:
        p_texts = _check_mauve_texts(p_texts, "p_texts (human / reference texts)")
        p_features = text_features(
            p_texts, featurizer, batch_size=batch_size, max_length=max_text_length, device=device
        )
    if q_features is None:
        q_texts = _check_mauve_texts(q_texts, "q_texts (model texts)")
        q_features = text_features(
            q_texts, featurizer, batch_size=batch_size, max_length=max_text_length, device=device
        )
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
