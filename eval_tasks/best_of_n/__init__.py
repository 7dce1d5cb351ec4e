"""GEM's test-time scaling (section 5, Tables 4, 5, 7, 8): the GSM8K / MATH and AlpacaEval documents, the
per-question MV@k / BON@k and Reward BON@k scores and the reward model (:mod:`eval_tasks.best_of_n.best_of_n`,
shared by ``distmatch-eval bon`` / ``voting`` and the lm-eval tasks); the lm-eval task classes
(:mod:`eval_tasks.best_of_n.harness`, which needs lm-eval, so it is not imported here), the ``distmatch_alpacaeval_bon``
YAML and README.md. The math tasks' YAMLs are the ``math`` family's (:mod:`eval_tasks.math`).
"""

from eval_tasks.best_of_n.best_of_n import (
    ALPACAEVAL,
    GEM_MATH_PROMPT,
    GSM8K,
    KS,
    MATH,
    MATH_SUBJECTS,
    RewardScorer,
    alpacaeval_documents,
    check_reward_architecture,
    check_reward_model_folder,
    ks_for,
    math_documents,
    math_question_scores,
    read_sampled,
    reward_question_scores,
    rows_by_prompt,
    sample_count,
    voting_curve,
)

__all__ = [
    "ALPACAEVAL",
    "GEM_MATH_PROMPT",
    "GSM8K",
    "KS",
    "MATH",
    "MATH_SUBJECTS",
    "RewardScorer",
    "alpacaeval_documents",
    "check_reward_architecture",
    "check_reward_model_folder",
    "ks_for",
    "math_documents",
    "math_question_scores",
    "read_sampled",
    "reward_question_scores",
    "rows_by_prompt",
    "sample_count",
    "voting_curve",
]
