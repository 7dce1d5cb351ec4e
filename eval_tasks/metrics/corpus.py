"""Corpus-level diversity: each metric per prompt, then the mean over prompts (equal weight), as GEM did."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from distmatch.optional import require
from eval_tasks.metrics.bleu import self_bleu_diversity
from eval_tasks.metrics.inputs import EVAL_EXTRA, DiversityInputError, check_samples, no_text
from eval_tasks.metrics.names import METRIC_KEYS, METRICS
from eval_tasks.metrics.ngram import ngram_diversity
from eval_tasks.metrics.sentence_bert import embed, mean_pairwise_cosine, sbert_description

__all__ = [
    "DiversityResult",
    "corpus_diversity",
    "corpus_ngram_diversity",
    "corpus_sbert_diversity",
    "corpus_self_bleu_diversity",
]


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
            check_samples(samples, allow_empty=True, what=f"prompt #{index} (id={gid!r})")
            return gid, [prefix + s for s in samples], samples
        return gid, samples, samples
    if include_prompt:
        raise DiversityInputError(
            f"prompt #{index}: include_prompt=True needs records with 'prompt'/'input_text', got a plain list."
        )
    return index, group, group


def _prepared(
    groups: Iterable[Any], include_prompt: bool, allow_empty: bool
) -> list[tuple[Any, list[str], bool]]:
    """(id, texts to score, whether every sample is empty) of each prompt. The samples decide, not the texts: with
    the prompt before each sample, a prompt whose samples are all empty would otherwise be scored as K copies of its
    prompt (Self-BLEU calls K copies of a short prompt 100 % diverse)."""
    prepared = []
    for i, group in enumerate(groups):
        gid, texts, raw = _group_texts(group, include_prompt, i)
        raw = check_samples(raw, allow_empty=allow_empty, what=f"prompt #{i} (id={gid!r})")
        texts = check_samples(texts, allow_empty=True, what=f"prompt #{i} (id={gid!r})")
        prepared.append((gid, texts, no_text(raw)))
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
    per_prompt: list[dict[str, Any]] = [{"id": gid, "num_samples": len(texts)} for gid, texts, _ in prepared]
    # A prompt whose samples are all empty (allowed by allow_empty) has no diversity: 0 on every metric.
    empty = [i for i, (_, _, blank) in enumerate(prepared) if blank]
    for i in empty:
        per_prompt[i].update({METRIC_KEYS[m]: 0.0 for m in metrics}, all_empty=True)
    scored = [i for i, (_, _, blank) in enumerate(prepared) if not blank]
    iterator: Iterable[int] = scored
    if progress:
        require("tqdm", extra=EVAL_EXTRA, feature="The diversity progress bar (--no-progress: none)")
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, desc="diversity", unit="prompt")
    for i in iterator:
        gid, texts, _ = prepared[i]
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
        flat = [t for i in scored for t in prepared[i][1]]
        unit = embed(flat, sbert_model, batch_size, device) if flat else None
        start = 0
        for i in scored:
            texts = prepared[i][1]
            block = unit[start : start + len(texts)]
            start += len(texts)
            per_prompt[i]["sbert_diversity"] = 100.0 * (1.0 - mean_pairwise_cosine(block))
    keys = [METRIC_KEYS[m] for m in METRICS if m in metrics]
    means = {key: _mean([row[key] for row in per_prompt]) for key in keys}
    settings: dict[str, Any] = {
        "metrics": list(keys),
        "scoring": "prompt+response" if include_prompt else "response",
        "num_prompts": len(prepared),
        "allow_empty": allow_empty,
        "all_empty_prompts": len(empty),
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
