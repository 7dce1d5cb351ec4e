"""Which test modules a `-m` marker expression can select, decided before the module is imported.

Collecting every module imports torch, transformers, TRL, Axolotl, lm-eval, ... through the test modules: 26 s per
pytest-xdist worker in `.venv-axolotl`, paid again by each venv's run even where it selects a few folders. A module
is left uncollected only when no test in it can match the expression, whatever marks its tests carry:

* `certain`: the marks every test of the module gets from tests/conftest.py (its folder's markers; `launches` for a
  launching path);
* `possible`: the marks some of its tests may carry: every `mark.<name>` written in the module's source (module
  `pytestmark`, decorators, `pytest.param(marks=...)`), and the marks tests/conftest.py adds to single tests
  (`launches` for LAUNCHING_TESTS, `one_stack` for ONE_STACK_TESTS).

The expression is evaluated for `certain` plus every subset of `possible`; if none matches, the module is skipped.
A module that uses marks in another way (built at run time) is always collected: see `DYNAMIC_MARKS`.
"""

from __future__ import annotations

import re
from itertools import combinations
from pathlib import Path

from _pytest.mark.expression import Expression

# `mark.<name>` in the source: `pytest.mark.slow`, `@mark.launches`, `marks=pytest.mark.x`.
_MARK_NAME = re.compile(r"\bmark\s*\.\s*([A-Za-z_]\w*)")
# A module that builds or applies marks at run time cannot be judged from its text.
DYNAMIC_MARKS = re.compile(r"getattr\(\s*(pytest\.)?mark\b|applymarker|add_marker")
# More than this many possible marks: collect (2**n evaluations; no module comes near).
_MAX_POSSIBLE = 12


def marks_named_in(source: str) -> set[str] | None:
    """The mark names written in a module's source; None when the module applies marks at run time."""
    if DYNAMIC_MARKS.search(source):
        return None
    return set(_MARK_NAME.findall(source))


def could_match(markexpr: str, certain: set[str], possible: set[str]) -> bool:
    """Whether some test carrying all of `certain` and any subset of `possible` matches `markexpr`."""
    if "=" in markexpr:
        return True  # marker keyword arguments (`-m "slow(reason=...)"`): not judged here
    expression = Expression.compile(markexpr)
    optional = sorted(possible - certain)
    if len(optional) > _MAX_POSSIBLE:
        return True
    for size in range(len(optional) + 1):
        for extra in combinations(optional, size):
            marks = certain.union(extra)
            if expression.evaluate(lambda name, /, marks=marks, **kwargs: name in marks):
                return True
    return False


def module_could_match(path: Path, markexpr: str, certain: set[str], possible: set[str]) -> bool:
    """`could_match` for a test module, with the marks named in its source added to `possible`."""
    named = marks_named_in(path.read_text(encoding="utf-8"))
    if named is None:
        return True
    return could_match(markexpr, certain, possible | named)
