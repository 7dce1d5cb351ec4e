"""GEM's code generation (HumanEval, MBPP+; Tables 6, 9): the code task table, Magicoder's prompt and the test
programs (:mod:`eval_tasks.code.code_tasks`), the lm-eval task class (:mod:`eval_tasks.code.harness`: it runs the
samples in :mod:`eval_tasks.sandbox` and needs lm-eval, so it is not imported here), the lm-eval YAMLs and
README.md.
"""

from eval_tasks.code.code_tasks import (
    CODE_TASKS,
    MAGICODER_PROMPT,
    CodeTaskSpec,
    code_documents,
    completion_program,
    cut_completion,
    magicoder_parts,
    prompt_text,
)

__all__ = [
    "CODE_TASKS",
    "MAGICODER_PROMPT",
    "CodeTaskSpec",
    "code_documents",
    "completion_program",
    "cut_completion",
    "magicoder_parts",
    "prompt_text",
]
