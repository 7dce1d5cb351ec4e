"""NoveltyBench v1.0 (Zhang et al., 2025): ``distinct`` and ``utility`` of K responses per prompt.

The rules (:mod:`eval_tasks.novelty.noveltybench`, pure), the model-backed classifier and reward model
(:mod:`eval_tasks.novelty.scorers`, torch and transformers, not imported here), the lm-eval task class
(:mod:`eval_tasks.novelty.harness`, needs lm-eval, not imported here), the lm-eval YAMLs, the prompts (``data/``)
and README.md.
"""

from eval_tasks.novelty.noveltybench import (
    CLASSIFIER_THRESHOLD,
    NOVELTY_METRICS,
    NOVELTY_SETS,
    PATIENCE,
    PUBLISHED_CLASSIFIER,
    PUBLISHED_REWARD_MODEL,
    REWARD_THRESHOLDS,
    comparability,
    novelty_documents,
    partition,
    prompt_scores,
    reward_bin,
    summarize,
)

__all__ = [
    "CLASSIFIER_THRESHOLD",
    "NOVELTY_METRICS",
    "NOVELTY_SETS",
    "PATIENCE",
    "PUBLISHED_CLASSIFIER",
    "PUBLISHED_REWARD_MODEL",
    "REWARD_THRESHOLDS",
    "comparability",
    "novelty_documents",
    "partition",
    "prompt_scores",
    "reward_bin",
    "summarize",
]
