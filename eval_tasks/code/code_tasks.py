"""HumanEval and MBPP+ as GEM ran them (Tables 6 and 9): Magicoder's prompt, sampled completions, tests, pass@k.

The task table (:data:`CODE_TASKS`) is the one place the code tasks are listed; ``tools/generate.py`` writes their
lm-eval YAMLs from it. Per problem:

* **prompt** (Magicoder's ``experiments/text2code.py``, which GEM's paper names): HumanEval's instruction is
  ``Write a solution to the following problem:`` and the problem's prompt in a Python block, the response prefix
  a Python fence followed by that prompt; MBPP+'s instruction is the task description (a ``.`` added when missing)
  and ``Your code should satisfy the following assertion:`` with the first test assertion, the response prefix a
  bare Python fence. ``raw``: Magicoder's whole template as plain text (:data:`MAGICODER_PROMPT`, the response prefix
  after ``@@ Response``); ``chat``: the template up to the instruction as the user turn of the model's chat template
  and the response prefix at the start of the assistant turn (run with ``--apply_chat_template``);
* **completion**: the generated text up to the first code fence (Magicoder's cut);
* **program**: HumanEval = the problem's prompt + completion + its ``check`` function + ``check(<entry point>)``;
  MBPP+ = the test imports + completion + the assertions of ``test_list`` (base tests) or, with ``code_tests:
  plus``, the row's ``test`` script (EvalPlus's extra inputs; HumanEval+ rows come from ``evalplus/humanevalplus``).

Pure Python: nothing here imports lm-eval, datasets or torch (the loaders import ``datasets`` when called).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from distmatch.errors import DistMatchConfigError

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

#: Magicoder's prompt template (``src/magicoder/prompt_template.py``'s evaluation prompt in ``text2code.py``).
MAGICODER_PROMPT = (
    "You are an exceptionally intelligent coding assistant that consistently delivers accurate and reliable "
    "responses to user instructions.\n\n@@ Instruction\n{instruction}\n\n@@ Response\n{response}"
)
FENCE = "```"


@dataclass(frozen=True)
class CodeTaskSpec:
    """One code benchmark: its lm-eval task, Hub datasets (base and EvalPlus rows), problem count, GEM tables."""

    key: str
    title: str
    path: str  #: Hub dataset of the base tests
    plus_path: str  #: Hub dataset with EvalPlus's extra tests (the same rows for MBPP+)
    split: str
    problems: int
    note: str

    @property
    def task(self) -> str:
        return f"distmatch_{self.key}"


CODE_TASKS: dict[str, CodeTaskSpec] = {
    s.key: s
    for s in (
        CodeTaskSpec(
            "humaneval",
            "HumanEval",
            "openai/openai_humaneval",
            "evalplus/humanevalplus",
            "test",
            164,
            "the 164 HumanEval problems; code_tests: plus runs HumanEval+'s tests (evalplus/humanevalplus)",
        ),
        CodeTaskSpec(
            "mbpp_plus",
            "MBPP+",
            "evalplus/mbppplus",
            "evalplus/mbppplus",
            "test",
            378,
            "the 378 MBPP+ (EvalPlus v0.2.0) problems; base tests = test_list, code_tests: plus = the row's test",
        ),
    )
}


def _spec(task: str) -> CodeTaskSpec:
    try:
        return CODE_TASKS[task.removeprefix("distmatch_")]
    except KeyError:
        raise DistMatchConfigError(
            f"Unknown code task {task!r}; valid: {', '.join(s.task for s in CODE_TASKS.values())}."
        ) from None


def magicoder_parts(doc: Mapping[str, Any], task: str) -> tuple[str, str]:
    """(instruction, response prefix) of one problem, as Magicoder's ``text2code.py`` builds them."""
    key = _spec(task).key
    if key == "humaneval":
        prompt = str(doc["prompt"]).strip()
        return (
            f"Write a solution to the following problem:\n```python\n{prompt}\n```",
            f"```python\n{prompt}",
        )
    description = str(doc["prompt"]).strip()
    if not description.endswith("."):
        description += "."
    assertion = str(doc["test_list"][0]).strip()
    return (
        f"{description} Your code should satisfy the following assertion:\n```python\n{assertion}\n```",
        "```python",
    )


def prompt_text(doc: Mapping[str, Any], task: str, mode: str) -> tuple[str, str | None]:
    """(text of the request, assistant prefix or None). ``raw``: the whole Magicoder template with the response
    prefix, no separate prefix. ``chat``: the template up to the instruction (the user turn) and the prefix."""
    instruction, prefix = magicoder_parts(doc, task)
    if mode == "raw":
        return MAGICODER_PROMPT.format(instruction=instruction, response=prefix), None
    if mode == "chat":
        head = MAGICODER_PROMPT.split("\n\n@@ Response")[0]
        return head.format(instruction=instruction), prefix
    raise DistMatchConfigError(f"code_prompt={mode!r} is not valid; valid: raw, chat.")


def cut_completion(text: str) -> str:
    """The generated text up to the first code fence (Magicoder: the end of the Python block)."""
    index = text.find(FENCE)
    return text if index == -1 else text[:index]


def completion_program(
    doc: Mapping[str, Any], task: str, completion: str, tests: str = "base"
) -> tuple[str, ...]:
    """The program that passes when the completion of `doc` passes its tests (``base`` or ``plus``), as the pieces
    :func:`eval_tasks.sandbox.execute` parses each on its own: the completion cannot reach into the tests."""
    key = _spec(task).key
    code = cut_completion(completion)
    if key == "humaneval":
        # The response prefix ended with the stripped prompt, so the completion continues it (EvalPlus's join).
        return f"{doc['prompt']}{code}\n", f"{doc['test']}\n", f"check({doc['entry_point']})\n"
    imports = "\n".join(doc.get("test_imports") or [])
    body = doc["test"] if tests == "plus" else "\n".join(doc["test_list"])
    return imports, f"{code}\n", f"{body}\n"


def code_documents(task: str, *, tests: str = "base", data_dir: str | None = None) -> list[dict[str, Any]]:
    """The problems of `task` from the Hub (or `data_dir`/<key>/test.jsonl, <key>_plus for HumanEval+)."""
    from eval_tasks.dataset_loading import load_split

    spec = _spec(task)
    plus = tests == "plus" and spec.plus_path != spec.path
    key = f"{spec.key}_plus" if plus else spec.key
    rows = load_split(key, spec.plus_path if plus else spec.path, None, None, spec.split, data_dir)
    docs = [dict(row) for row in rows]
    for doc in docs:
        doc["task_id"] = str(doc["task_id"])
    return docs
