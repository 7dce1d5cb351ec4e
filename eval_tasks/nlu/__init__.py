"""EMO's in-context NLU suite (Table 3) and MMLU: the task table (:mod:`eval_tasks.nlu.nlu`), demonstration
retrieval (:mod:`eval_tasks.nlu.retrieval`), the lm-eval task classes (:mod:`eval_tasks.nlu.harness`, which needs
lm-eval, so it is not imported here), the lm-eval YAMLs and README.md.

The names below are the family's public API; importing this package imports no lm-eval and no model.
"""

from eval_tasks.nlu.nlu import (
    ICL_TASKS,
    MMLU,
    MMLU_SUBJECTS,
    NLU_TASK_NAMES,
    TEMPLATE_VARIANTS,
    ClassificationSpec,
    MMLUSpec,
    build_icl_rows,
    build_mmlu_rows,
    demonstrations,
    fill,
    get_spec,
    mmlu_context,
    mmlu_question,
)
from eval_tasks.nlu.retrieval import (
    DEFAULT_RETRIEVER,
    OFFLINE_RETRIEVER,
    RETRIEVER_ENV,
    RetrieverUnavailableError,
    openicl_round_trip,
    resolve_retriever,
    retrieve,
    top_k,
)

__all__ = [
    "DEFAULT_RETRIEVER",
    "ICL_TASKS",
    "MMLU",
    "MMLU_SUBJECTS",
    "NLU_TASK_NAMES",
    "OFFLINE_RETRIEVER",
    "RETRIEVER_ENV",
    "TEMPLATE_VARIANTS",
    "ClassificationSpec",
    "MMLUSpec",
    "RetrieverUnavailableError",
    "build_icl_rows",
    "build_mmlu_rows",
    "demonstrations",
    "fill",
    "get_spec",
    "mmlu_context",
    "mmlu_question",
    "openicl_round_trip",
    "resolve_retriever",
    "retrieve",
    "top_k",
]
