"""Names and titles the report's tables and plots share."""

from __future__ import annotations

from typing import Any

from eval_tasks.metrics.names import REPORTED_METRICS
from eval_tasks.nlu.nlu import NLU_TASK_NAMES

__all__ = [
    "DIVERSITY_METRICS",
    "NOVELTY_METRICS",
    "METRIC_TITLES",
    "NLU_ORDER",
    "NLU_SHORT",
    "BEST_OF_N_METRICS",
    "NOT_FRACTIONS",
    "SHORT_TITLES",
    "probe_tokens",
]

#: the diversity columns of the report: the per-prompt diversity metrics, then MAUVE
DIVERSITY_METRICS = REPORTED_METRICS
#: lm-eval metrics that are not fractions in [0, 1] (everything else is shown x100, as the papers do)
#: The best-of-n / voting / code tasks report percent (mv@k, bon@k, win_rate_bon@k, pass@k) or raw rewards already.
BEST_OF_N_METRICS = frozenset(
    {f"{m}@{k}" for m in ("mv", "bon", "reward_bon", "win_rate_bon", "pass") for k in range(1, 1025)}
    | {"no_answer", "reference_reward"}
)
NOT_FRACTIONS = frozenset(
    {
        *DIVERSITY_METRICS,
        *BEST_OF_N_METRICS,
        "perplexity",
        "word_perplexity",
        "byte_perplexity",
        "bits_per_byte",
        "rouge1",  # the open-ended tasks report ROUGE x100 and the oracle perplexity raw
        "rougeL",
        "oracle_ppl",
        "distinct",  # NoveltyBench: classes among K samples, and utility on its 0-10 scale
        "utility",
    }
)
#: the NoveltyBench table's metrics: its distinct / utility, then GEM's diversity of the same samples
NOVELTY_METRICS = ("distinct", "utility", "ngram_diversity", "self_bleu_diversity")
METRIC_TITLES = {
    "acc": "acc",
    "ngram_diversity": "N-gram div.",
    "self_bleu_diversity": "Self-BLEU div.",
    "sbert_diversity": "Sentence-BERT div.",
    "mauve": "MAUVE",
    "prompt_level_strict_acc": "prompt strict",
    "inst_level_strict_acc": "instr. strict",
    "prompt_level_loose_acc": "prompt loose",
    "inst_level_loose_acc": "instr. loose",
    "perplexity": "perplexity",
}
#: short column titles of the per-prompt diversity metrics (the demo's tables and log lines)
SHORT_TITLES = {
    "ngram_diversity": "n-gram div",
    "self_bleu_diversity": "Self-BLEU div",
    "sbert_diversity": "SBERT div",
}
#: the NLU benchmarks in the papers' table order, from the task table (eval_tasks/nlu/nlu.py)
NLU_ORDER = tuple(name.removeprefix("distmatch_") for name in NLU_TASK_NAMES)
#: their column titles
NLU_SHORT = {
    "tweet_emotion": "TE",
    "sst2": "SST-2",
    "trec": "TREC",
    "subj": "Subj",
    "cr": "CR",
    "rt": "RT",
    "ag_news": "AG",
    "mmlu": "MMLU",
}


def probe_tokens(d: dict[str, Any]) -> list[tuple[Any, str, float]]:
    """(key, label, probability) per listed token; keyed by id (several byte tokens decode to the same '\ufffd')."""
    ids = d.get("token_ids") or d["tokens"]
    pieces = d.get("token_pieces") or d["tokens"]
    out = []
    for key, text, piece, prob in zip(ids, d["tokens"], pieces, d["probs"]):
        label = repr(piece) if "\ufffd" in text or not text.strip() else repr(text)
        out.append((key, label, prob))
    return out
