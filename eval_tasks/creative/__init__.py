"""GEM's creative-writing diversity (Table 2): the poem / story prompts and the diversity scores
(:mod:`eval_tasks.creative.creative`), the lm-eval task classes (:mod:`eval_tasks.creative.harness`, which needs
lm-eval, so it is not imported here), the lm-eval YAMLs and README.md. The prompts themselves are package data in
``eval_tasks/data/``.
"""

from eval_tasks.creative.creative import (
    CREATIVE_TASKS,
    DIVERSITY_METRICS,
    PACKAGE_DATA,
    creative_documents,
    diversity_scores,
)

__all__ = ["CREATIVE_TASKS", "DIVERSITY_METRICS", "PACKAGE_DATA", "creative_documents", "diversity_scores"]
