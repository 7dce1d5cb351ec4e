"""A program's pieces are parsed each on its own: a completion cannot reach across its end into the tests.

The code tasks' own path (``CodeTask.process_results``): ``completion_program`` hands the sandbox the program in
pieces (prompt + completion, the tests, the entry point's call) and ``execute_many`` runs them. A wrong completion
that ends with something the tests would complete (a dangling decorator that turns ``def check`` into a no-op, an
open bracket, string, backslash or header, ...) or that tries to skip the next pieces at run time fails; a correct
one passes. The tests start with a ``def``, as some rows of both datasets do: there a dangling decorator used to
make a wrong completion pass. Then the pieces' line numbers, the program's type and the time limits' range.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks import sandbox
from eval_tasks.code import code_tasks as ct
from eval_tasks.task_options import TASK_OPTIONS, check_task_options

pytestmark = [
    pytest.mark.launches,
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or shutil.which("unshare") is None,
        reason="needs Linux and unshare",
    ),
]

FIXTURES = Path(__file__).parents[1] / "fixtures" / "code"


def _row(key: str, index: int) -> dict:
    return json.loads((FIXTURES / key / "test.jsonl").read_text().splitlines()[index])


HUMANEVAL = _row("humaneval", 0)  # has_close_elements; its tests start with `def check` (no METADATA first)
HUMANEVAL["test"] = HUMANEVAL["test"][HUMANEVAL["test"].index("def check") :]
MBPP = _row("mbpp_plus", 1)  # is_not_prime; its plus tests start with `def assertion` (numpy imported first)
MBPP["test_imports"], MBPP["test"] = ["import numpy as np"], MBPP["test"].split("\n\n", 1)[1]
#: task, doc, a wrong completion, a correct one
CASES = {
    "humaneval": ("distmatch_humaneval", HUMANEVAL, "    return False\n", HUMANEVAL["canonical_solution"]),
    "mbpp_plus": (
        "distmatch_mbpp_plus",
        MBPP,
        "\ndef is_not_prime(n):\n    return False\n",
        f"\n{MBPP['code']}\n",
    ),
}
NO_OP = "@(lambda f: (lambda *args: None))"
#: what a wrong completion ends with; each would make the tests part of the completion, or skip them
TRICKS = {
    "dangling_decorator": NO_OP,
    "dangling_decorator_and_newline": NO_OP + "\n",
    "named_decorator": "def skip(f):\n    return lambda *args: None\n@skip",
    "decorator_and_comment": NO_OP + "  # the tests follow",
    "decorator_and_backslash": NO_OP + " \\",
    "unclosed_bracket": "_ = (",
    "unclosed_string_continued": "_ = 'abc\\",
    "unterminated_triple_quoted_string": '_ = """',
    "trailing_backslash": "_ = 1 + \\",
    "open_if_header": "if False:",
    "open_def_header": "def unused():",
    "open_else_header": "if True:\n    pass\nelse:",
    "open_lambda": "_ = lambda: \\",
    "comment": "# ",
    "comment_and_backslash": "# \\",
    # at run time: advance every iterator and empty every list of source or code the runner might hold
    "skips_the_next_pieces_at_run_time": "import gc\nfor o in gc.get_objects():\n    try:\n"
    "        if type(o).__name__.endswith('iterator'):\n            next(o, None), next(o, None)\n"
    "        elif type(o) is list and o and all(type(x).__name__ in ('bytes', 'str', 'code') for x in o):\n"
    "            o.clear() if o is not __import__('sys').path else None\n"
    "    except Exception:\n        pass\n",
}
COMMENTS = {
    "comment",
    "comment_and_backslash",
    "skips_the_next_pieces_at_run_time",
}  # parse: the checks fail them


def _run_all(case: str, completions: list[str]) -> list[sandbox.ExecutionResult]:
    task, doc, _, _ = CASES[case]
    programs = [ct.completion_program(doc, task, c, "plus") for c in completions]
    return sandbox.execute_many(programs, 10.0, workers=2, allow=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_wrong_completion_cannot_reach_into_the_tests(case) -> None:
    _, _, wrong, right = CASES[case]
    wrongs = _run_all(case, [wrong + trick for trick in TRICKS.values()] + [right])
    assert {name: r.passed for name, r in zip(TRICKS, wrongs)} == dict.fromkeys(TRICKS, False)
    assert wrongs[-1] == sandbox.ExecutionResult(True, "passed", 0)  # the correct completion
    for name, result in zip(TRICKS, wrongs):
        why = "AssertionError" if name in COMMENTS else r"(Syntax|Indentation)Error"
        assert re.search(why, result.reason), (name, result.reason)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_completion_that_parses_only_with_the_tests_fails(case) -> None:
    """Even a correct one: the same program as one string passes (the identity decorator keeps the checks)."""
    task, doc, _, right = CASES[case]
    program = ct.completion_program(doc, task, right + "@(lambda f: f)", "plus")
    joined, pieces = sandbox.execute_many(["\n".join(program), program], 10.0, workers=2, allow=True)
    assert joined.passed, joined.reason
    assert not pieces.passed and "SyntaxError: invalid syntax" in pieces.reason, pieces.reason


def test_each_piece_keeps_its_lines_in_the_file() -> None:
    """Tracebacks and syntax errors name the line of program.py (the pieces joined by newlines)."""
    failed, syntax = sandbox.execute_many(
        [("x = 1\r\n", "\n\ny = 2", "assert x == y, 'third piece'"), ("x = 1", "def f(:", "pass")],
        5.0,
        allow=True,
    )
    assert re.search(r'program\.py", line 6, in <module> \| +assert x == y', failed.reason), failed.reason
    assert "AssertionError: third piece" in failed.reason
    assert re.search(r'program\.py", line 2 \| +def f\(:', syntax.reason), syntax.reason
    assert "SyntaxError" in syntax.reason and ", in build" not in syntax.reason  # none of the runner's frames


@pytest.mark.parametrize("program", [[], ("pass", 1), b"pass", None])
def test_a_program_that_is_no_source_or_pieces_is_refused(program) -> None:
    with pytest.raises(DistMatchConfigError, match="execute: program must be Python source") as err:
        sandbox.execute(program, 2.0, allow=True)
    assert "\n" not in str(err.value)


def test_the_code_tasks_timeout_range_is_one_the_sandbox_accepts() -> None:
    """``code_timeout`` (lm-eval's ``--metadata``) is checked before the model loads; its whole range runs."""
    option = TASK_OPTIONS["code_timeout"]
    for seconds in (option.minimum, option.maximum):
        check_task_options({"code_timeout": seconds})
        assert sandbox.check_timeout(seconds) == seconds
    with pytest.raises(DistMatchConfigError, match="code_timeout=0 is invalid"):
        check_task_options({"code_timeout": 0})
