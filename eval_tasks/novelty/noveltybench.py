"""NoveltyBench v1.0 (Zhang et al., 2025; novelty-bench/novelty-bench, MIT): the rules as pure functions.

Per prompt, K responses are partitioned into equivalence classes (:func:`partition`); ``distinct`` is the number of
classes, ``utility`` the patience-discounted mean of the binned rewards in which a response of an already-seen class
scores 0 (:func:`utility`). The benchmark's numbers are the means over prompts. The rules are those of the
repository's ``src/partition.py``, ``src/score.py`` and ``src/summarize.py`` (commit 5b22b53); README.md lists them
and every difference. The models that produce the classifier probabilities and the raw rewards are
:mod:`eval_tasks.novelty.scorers`; here they are plain callables, so the rules are tested on fixed outputs against
NoveltyBench's own code (tests/eval/novelty/fixtures). Standard library only.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CLASSIFIER_THRESHOLD",
    "MAX_TOKENS",
    "NOVELTY_METRICS",
    "NOVELTY_SETS",
    "PATIENCE",
    "PUBLISHED_CLASSIFIER",
    "PUBLISHED_CLASSIFIER_TOKENIZER",
    "PUBLISHED_REWARD_MODEL",
    "REWARD_THRESHOLDS",
    "comparability",
    "detect_subset",
    "gem_diversity",
    "generation_scores",
    "novelty_documents",
    "partition",
    "prompt_scores",
    "reward_bin",
    "short_response_equality",
    "summarize",
    "utility",
]

#: the pairwise generation-similarity classifier (a fine-tuned DeBERTa-v3-large) and the tokenizer it is used with
PUBLISHED_CLASSIFIER = "yimingzhang/deberta-v3-large-generation-similarity"
PUBLISHED_CLASSIFIER_TOKENIZER = "microsoft/deberta-v3-large"
#: two responses are equivalent when the classifier's probability of "equivalent" (label 1) is > this
CLASSIFIER_THRESHOLD = 0.102
#: each response is truncated to its first 128 classifier tokens
MAX_TOKENS = 128
#: the reward model (score.py) and the raw-reward thresholds of its 1-10 bins (bisect_left + 1)
PUBLISHED_REWARD_MODEL = "Skywork/Skywork-Reward-Gemma-2-27B-v0.2"
REWARD_THRESHOLDS = (-7.71875, -6.28125, -6.0, -5.71875, -5.5, -5.0, -4.375, -3.4375, -2.046875)
#: the discount of the k-th response's weight (score.py --patience default)
PATIENCE = 0.8
NOVELTY_METRICS = ("distinct", "utility")
#: GEM's diversity metrics of the same samples, reported beside (those that need no model; 0-100)
GEM_METRICS = ("ngram_diversity", "self_bleu_diversity")

PACKAGE_DATA = Path(__file__).resolve().parent / "data"
#: the two prompt sets: shipped file, rows, the Hub dataset's split (``yimingzhang/novelty-bench``)
NOVELTY_SETS = {
    "curated": {"file": "noveltybench_curated.jsonl", "rows": 100, "split": "curated"},
    "wildchat": {"file": "noveltybench_wildchat.jsonl", "rows": 1000, "split": "wildchat"},
}
HUB_DATASET = "yimingzhang/novelty-bench"


def short_response_equality(a: str, b: str) -> bool | None:
    """NoveltyBench's rule for short responses (``maybe_test_equality``): when neither has more than 5 lowercased
    whitespace-separated words, they are equivalent iff 2 x (shared distinct words) >= the longer word count; else
    None (the classifier decides)."""
    words_a, words_b = a.strip().lower().split(), b.strip().lower().split()
    longest = max(len(words_a), len(words_b))
    if longest <= 5:
        return len(set(words_a) & set(words_b)) * 2 >= longest
    return None


def partition(
    responses: Sequence[str],
    similarity: Callable[[Sequence[tuple[str, str]]], Sequence[float]],
    threshold: float = CLASSIFIER_THRESHOLD,
) -> list[int]:
    """The class of each response, classes numbered in the order of their first member.

    Each response, in order, is compared with the first member of every existing class as the pair
    ``(first member, response)``; it joins the first class (in creation order) that matches, else opens a new one.
    A pair matches by :func:`short_response_equality` when that decides, else when ``similarity`` (a batch of text
    pairs -> the classifier's probabilities of "equivalent") gives > `threshold`. One call per response scores its
    pairs against all classes at once (NoveltyBench scores them one by one and stops at the first match: the same
    partition, more classifier work here, fewer calls).
    """
    firsts: list[str] = []  # the first member of each class
    classes: list[int] = []
    for response in responses:
        decided = [short_response_equality(first, response) for first in firsts]
        ask = [(firsts[c], response) for c, d in enumerate(decided) if d is None]
        probs = iter(similarity(ask) if ask else ())
        match = None
        for c, d in enumerate(decided):
            if d is None:
                d = float(next(probs)) > threshold
            if d:
                match = c
                break
        if match is None:
            match = len(firsts)
            firsts.append(response)
        classes.append(match)
    return classes


def reward_bin(raw_reward: float) -> int:
    """The 1-10 score of a raw reward: 1 + the number of thresholds strictly below it (``bisect_left``)."""
    return bisect.bisect_left(REWARD_THRESHOLDS, float(raw_reward)) + 1


def generation_scores(classes: Sequence[int], scores: Sequence[float]) -> list[float]:
    """Each response's score, or 0 when its class was seen before (only a class's first member counts)."""
    if len(classes) != len(scores):
        raise ValueError(f"{len(classes)} classes but {len(scores)} scores; one of each per response.")
    seen = 0
    out: list[float] = []
    for c, s in zip(classes, scores):
        if c == seen:  # the first member of the next class (classes are numbered in order of first members)
            out.append(s)
            seen += 1
        else:
            out.append(0)
    return out


def utility(scores: Sequence[float], patience: float = PATIENCE) -> float:
    """The patience-weighted mean sum_k p^k s_k / sum_k p^k of the generation scores (k = 0, 1, ...)."""
    if not scores:
        raise ValueError("utility needs at least one response.")
    weights = [patience**k for k in range(len(scores))]
    return sum(w * s for w, s in zip(weights, scores)) / sum(weights)


def prompt_scores(
    classes: Sequence[int], bins: Sequence[int], patience: float = PATIENCE
) -> dict[str, float]:
    """``distinct`` (the number of classes) and ``utility`` of one prompt from its partition and reward bins."""
    if not classes:
        raise ValueError("a prompt needs at least one response to be scored.")
    return {
        "distinct": float(max(classes) + 1),
        "utility": float(utility(generation_scores(classes, bins), patience)),
    }


def summarize(per_prompt: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The benchmark's numbers: ``distinct`` and ``utility`` averaged over prompts (summarize.py's means)."""
    if not per_prompt:
        raise ValueError("no prompts to summarize.")
    return {m: sum(float(p[m]) for p in per_prompt) / len(per_prompt) for m in NOVELTY_METRICS}


def comparability(
    classifier: str | None, reward_model: str | None, num_samples: int, prompts: str | None = None
) -> dict[str, Any]:
    """What a result records about its setting: the models and K used, and whether that is NoveltyBench's published
    setting (comparable with the leaderboard) or, naming every change, not. `prompts`: how the prompt set differs
    from the subset's (None: it is the whole subset)."""
    classifier = classifier or PUBLISHED_CLASSIFIER
    reward_model = reward_model or PUBLISHED_REWARD_MODEL
    changes = []
    if classifier != PUBLISHED_CLASSIFIER:
        changes.append(f"classifier {classifier} (published: {PUBLISHED_CLASSIFIER})")
    if reward_model != PUBLISHED_REWARD_MODEL:
        changes.append(f"reward model {reward_model} (published: {PUBLISHED_REWARD_MODEL})")
    if int(num_samples) != 10:
        changes.append(f"{num_samples} samples per prompt (published: 10)")
    if prompts:
        changes.append(prompts)
    return {
        "classifier": classifier,
        "reward_model": reward_model,
        "num_samples": int(num_samples),
        "comparable": not changes,
        "note": "NoveltyBench's published setting: comparable with its leaderboard"
        if not changes
        else "not comparable with NoveltyBench's published numbers: " + "; ".join(changes),
    }


def _rows(rows: Sequence[Any], where: str) -> list[dict[str, Any]]:
    docs = []
    for i, row in enumerate(rows):
        if (
            not isinstance(row, Mapping)
            or not isinstance(row.get("prompt"), str)
            or not row["prompt"].strip()
        ):
            raise ValueError(f"{where}: record #{i}: each prompt needs a non-empty string field 'prompt'.")
        docs.append(
            {"id": str(row.get("id", i)), "prompt": row["prompt"], "category": row.get("category") or ""}
        )
    return docs


def novelty_documents(
    subset: str,
    prompts_file: str | os.PathLike[str] | None = None,
    *,
    source: str = "package",
    load_dataset: Callable[..., Any] | None = None,
) -> list[dict[str, Any]]:
    """The prompts (``id``, ``prompt``, ``category``) of ``curated`` / ``wildchat``.

    ``source``: ``package`` (the files shipped in ``eval_tasks/novelty/data``, copied from the repository's
    ``data/``), ``hub`` (the ``yimingzhang/novelty-bench`` dataset's split, through ``datasets.load_dataset`` or the
    given `load_dataset`); a `prompts_file` (JSONL with ``prompt``, optional ``id``) replaces both.
    """
    if subset not in NOVELTY_SETS:
        raise ValueError(f"Unknown NoveltyBench subset {subset!r}; valid: {', '.join(NOVELTY_SETS)}.")
    if prompts_file:
        path = Path(prompts_file).expanduser()
    elif source == "hub":
        if load_dataset is None:
            from datasets import load_dataset
        rows = load_dataset(HUB_DATASET, split=NOVELTY_SETS[subset]["split"])
        return _rows(list(rows), f"{HUB_DATASET}:{subset}")
    elif source == "package":
        path = PACKAGE_DATA / NOVELTY_SETS[subset]["file"]
    else:
        raise ValueError(f"Unknown prompt source {source!r}; valid: package, hub.")
    if not path.is_file():
        raise FileNotFoundError(f"Prompt file {path} for NoveltyBench {subset} does not exist.")
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return _rows(rows, str(path))


def gem_diversity(samples: Sequence[str]) -> dict[str, float]:
    """GEM's n-gram and Self-BLEU diversity (0-100) of one prompt's samples, as the creative-writing tasks score
    them (the response only; all-empty samples or an undefined metric score 0)."""
    from eval_tasks.metrics import DiversityInputError, ngram_diversity, self_bleu_diversity
    from eval_tasks.metrics.inputs import no_text

    samples = [str(s) for s in samples]
    if no_text(samples):
        return dict.fromkeys(GEM_METRICS, 0.0)
    out = {}
    for name, fn in (("ngram_diversity", ngram_diversity), ("self_bleu_diversity", self_bleu_diversity)):
        try:
            out[name] = float(fn(samples, allow_empty=True))
        except DiversityInputError:
            out[name] = 0.0
    return out


def detect_subset(prompts: Sequence[str]) -> tuple[str | None, int]:
    """The NoveltyBench subset every prompt belongs to and its number of prompts (None, 0: not NoveltyBench's)."""
    for subset in NOVELTY_SETS:
        known = {d["prompt"] for d in novelty_documents(subset)}
        if prompts and all(p in known for p in prompts):
            return subset, len(known)
    return None, 0


def prompt_set_note(prompts: Sequence[str], count: int | None = None) -> tuple[str | None, str | None]:
    """The subset `prompts` belong to, and how the prompt set differs from that whole subset (None: it is the
    whole subset) for :func:`comparability`. `count`: the number of prompts scored (default: the distinct ones)."""
    subset, total = detect_subset(prompts)
    count = len(set(prompts)) if count is None else count
    if subset is None:
        return None, "prompts not NoveltyBench's"
    return subset, None if count == total else f"{count} of the {total} NB-{subset} prompts"
