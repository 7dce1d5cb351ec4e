"""The result files of ``distmatch-eval``: ``distmatch.diversity`` (diversity / MAUVE of a samples file) and
``distmatch.nexttoken`` (next-token statistics of a checkpoint), built from :mod:`eval_tasks.metrics`.

Each result records the settings that produced it and, for the GEM creative-writing benchmarks, why its numbers are
not on the protocol of the GEM paper's Table 2 (:func:`gem_protocol_notes`). ``distmatch-eval report`` reads them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eval_tasks import metrics as M
from eval_tasks.generation import GEM_GENERATION
from eval_tasks.samples import InputError

__all__ = [
    "DIVERSITY_KIND",
    "FORMAT_VERSION",
    "NEXTTOKEN_KIND",
    "diversity_result",
    "gem_protocol_notes",
    "mauve_against_references",
    "nexttoken_result",
    "paper_sbert_or_default",
]

FORMAT_VERSION = 1
DIVERSITY_KIND = "distmatch.diversity"
NEXTTOKEN_KIND = "distmatch.nexttoken"


def gem_protocol_notes(
    settings: Mapping[str, Any],
    meta: Mapping[str, Any] | None,
    n_prompts: int,
    k: set[int],
    benchmark: str | None,
) -> list[str]:
    """Why these numbers are not on the protocol of the GEM paper's Table 2 (empty list: same protocol)."""
    notes = []
    if "self_bleu" in settings and not settings["self_bleu"]["gem_compat"]:
        notes.append(
            "Self-BLEU uses every other sample as a reference (GEM's script: the first other sample only)"
        )
    if settings.get("scoring") != "prompt+response":
        notes.append("response-only text (GEM's script scored prompt + response)")
    if "sbert" in settings and not settings["sbert"].get("paper_model"):
        notes.append(
            f"Sentence-BERT model {settings['sbert']['name']} (paper: bert-large-nli-stsb-mean-tokens)"
        )
    if k != {16}:
        notes.append(f"{'/'.join(map(str, sorted(k)))} samples per prompt (paper: 16)")
    if benchmark:
        from eval_tasks.published import benchmarks

        expected = benchmarks().get(benchmark, {}).get("num_prompts")
        if expected and n_prompts != expected:
            notes.append(f"{n_prompts} prompts (paper: {expected})")
    if meta:
        for key, value in GEM_GENERATION.items():
            if key != "num_samples" and meta.get(key) is not None and meta.get(key) != value:
                notes.append(f"{key}={meta.get(key)} (paper: {value})")
    return notes


def paper_sbert_or_default(device: str | None) -> tuple[str | None, str | None]:
    """GEM's Sentence-BERT model if it can be loaded, else the offline default and why (a warning is printed)."""
    try:
        M.load_sbert(M.GEM_SBERT_MODEL, device=device)
        return M.GEM_SBERT_MODEL, None
    except (ValueError, ImportError) as err:
        # SbertUnavailableError: its reason, in one line
        why = getattr(err, "reason", None) or " ".join(str(err).split())[:300]
        reason = f"{M.GEM_SBERT_MODEL} could not be loaded ({why})"
        print(
            f"distmatch-eval diversity: warning: {reason}; Sentence-BERT diversity uses the offline default "
            "instead (not comparable with GEM's Table 2). Give a local copy with --sbert-model PATH.",
            file=sys.stderr,
        )
        return None, reason


def diversity_result(
    records: Sequence[Mapping[str, Any]],
    *,
    samples_file: str,
    metrics: Sequence[str] = M.METRICS,
    benchmark: str | None = None,
    protocol: str = "default",
    protocol_differences: Sequence[str] | None = None,
    sbert_note: str | None = None,
    **scoring: Any,
) -> dict[str, Any]:
    """The ``distmatch.diversity`` result of a samples file's `records` (without MAUVE: see
    :func:`mauve_against_references`).

    `metrics`: short names of :data:`eval_tasks.metrics.METRICS` (``mauve`` is skipped here). `scoring`: keyword
    arguments of :func:`eval_tasks.metrics.corpus_diversity`. `protocol_differences`: None = the differences from
    GEM's protocol (:func:`gem_protocol_notes`); a given list (e.g. ``[]`` for prompts without published numbers) is
    recorded as it is and the result marked not comparable with published numbers. `sbert_note` is appended to the
    Sentence-BERT difference.
    """
    meta = records[0].get("meta") if records and isinstance(records[0].get("meta"), dict) else None
    diversity_metrics = [m for m in metrics if m != M.MAUVE]
    result: dict[str, Any] = {
        "kind": DIVERSITY_KIND,
        "format_version": FORMAT_VERSION,
        "samples_file": samples_file,
        "model": (meta or {}).get("model"),
        "generation": meta,
        "benchmark": benchmark,
        "num_prompts": len(records),
        "metrics": {},
    }
    ks = {len(r["samples"]) for r in records}
    if diversity_metrics:
        scored = M.corpus_diversity(records, diversity_metrics, **scoring)
        result["metrics"].update(scored.metrics)
        result["settings"] = scored.settings
        result["per_prompt"] = scored.per_prompt
        if protocol_differences is None:
            notes = gem_protocol_notes(scored.settings, meta, len(records), ks, benchmark)
        else:
            notes = list(protocol_differences)
        if sbert_note:
            notes = [n if not n.startswith("Sentence-BERT model") else f"{n}: {sbert_note}" for n in notes]
        result["protocol"] = protocol
        result["protocol_differences"] = notes
        result["comparable_to_published"] = not notes if protocol_differences is None else False
        if "ngram" in diversity_metrics and scoring.get("tokenizer", "nltk") != "punkt":
            result["minor_differences"] = [
                "n-gram tokens from an untrained Punkt sentence splitter (GEM: NLTK's trained punkt_tab); "
                "differs only around abbreviations such as 'Mr.'"
            ]
    result["samples_per_prompt"] = sorted(ks)
    return result


def mauve_against_references(
    records: Sequence[Mapping[str, Any]],
    references: Sequence[Any],
    *,
    featurizer: Any = None,
    batch_size: int = 64,
    device: str | None = None,
    seed: int = 25,
) -> dict[str, Any]:
    """MAUVE of sample index k (k-th sample of every prompt) against the references, averaged over k."""
    if any(not isinstance(t, str) for t in references):
        raise InputError(
            "--metrics mauve needs human references: a 'reference' field in every prompt record (carried over by "
            "generate from the prompts file) or --references FILE."
        )
    k = min(len(r["samples"]) for r in records)
    p_feats = M.text_features(references, featurizer, batch_size=batch_size, device=device)
    flat = [r["samples"][j] for j in range(k) for r in records]
    for j, text in enumerate(flat):
        if not isinstance(text, str) or not text.strip():
            raise InputError(
                f"MAUVE: sample {j // len(records)} of prompt id={records[j % len(records)]['id']!r} is empty."
            )
    q_all = M.text_features(flat, featurizer, batch_size=batch_size, device=device)
    n = len(records)
    scores = [
        M.mauve_score(
            None,
            None,
            p_features=p_feats,
            q_features=q_all[j * n : (j + 1) * n],
            featurizer=featurizer,
            seed=seed,
        )
        for j in range(k)
    ]
    values = [s["mauve"] for s in scores]
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return {
        "mauve": mean,
        "mauve_std": std,
        "mauve_runs": len(values),
        "mauve_featurizer": scores[0]["featurizer"],
        "mauve_comparable_to_published": scores[0]["featurizer"] == "lm:gpt2-large",
    }


def nexttoken_result(
    model: Any,
    tokenizer: Any,
    *,
    model_name: str,
    records: Iterable[Any] | None = None,
    probes: Sequence[str] = M.GEM_FIGURE6_PROMPTS,
    benchmark: str | None = None,
    data_file: str | None = None,
    top_k: int = 10,
    chat_template: str | bool = "auto",
    batch_size: int = 8,
    max_length: int = 1024,
    progress: bool = False,
) -> dict[str, Any]:
    """The ``distmatch.nexttoken`` result: statistics on `records` (when given) and the probes' distributions."""
    result: dict[str, Any] = {
        "kind": NEXTTOKEN_KIND,
        "format_version": FORMAT_VERSION,
        "model": model_name,
        "benchmark": benchmark,
        "data_file": data_file,
    }
    if records is not None:
        stats = M.next_token_stats(
            model,
            tokenizer,
            records,
            batch_size=batch_size,
            max_length=max_length,
            chat_template=chat_template,
            progress=progress,
        )
        result["stats"] = stats.to_dict()
    result["probes"] = [
        M.next_token_distribution(model, tokenizer, p, top_k=top_k, chat_template=chat_template)
        for p in probes
    ]
    return result
