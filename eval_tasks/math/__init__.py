"""GEM's GSM8K and MATH voting and coverage (Tables 5, 7, 8): the answer extraction and equivalence
(:mod:`eval_tasks.math.math_answers`: MetaMath's extractor, the Hendrycks ``is_equiv`` or ``math_verify``), the
lm-eval task class (:mod:`eval_tasks.math.harness`, which needs lm-eval, so it is not imported here), the lm-eval
YAMLs and README.md. The documents, GEM's instruction and the per-question MV@k / BON@k are
:mod:`eval_tasks.best_of_n`'s (shared with ``distmatch-eval voting``).
"""

from eval_tasks.math.math_answers import (
    MATH_CHECKERS,
    canonical_math_answer,
    extract_gsm8k_answer,
    extract_math_answer,
    gsm8k_gold_answer,
    is_equiv,
    math_answer_correct,
    math_gold_answer,
    strip_math_string,
)

__all__ = [
    "MATH_CHECKERS",
    "canonical_math_answer",
    "extract_gsm8k_answer",
    "extract_math_answer",
    "gsm8k_gold_answer",
    "is_equiv",
    "math_answer_correct",
    "math_gold_answer",
    "strip_math_string",
]
