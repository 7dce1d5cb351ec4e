"""eval_tasks.math.math_answers against the reference scripts' behaviour, for what the other math tests leave open:
Hendrycks' ``_fix_fracs`` (hendrycks/math ``modeling/math_equivalence.py``: every ``\\frac`` piece is kept, in order,
with the text before the first), ``last_boxed_only_string`` + ``remove_boxed`` (a box command not followed by ``{``
is no box: None), and the ``math_verify`` checker's contract (docs/evaluation.md: an answer that could not be read
is wrong; without the package, an ImportError that says what to install)."""

from __future__ import annotations

import sys

import pytest

from eval_tasks.math.math_answers import is_equiv, math_answer_correct, math_gold_answer, strip_math_string


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        # _fix_fracs: new_str starts as the text before the first \frac, and "\frac" + each piece is appended
        ("2\\frac12", "2\\frac{1}{2}"),
        ("3\\frac{1}{2}", "3\\frac{1}{2}"),
        # every piece after a braced one is still read (the reference's loop goes on)
        ("\\frac{1}{2}+\\frac13", "\\frac{1}{2}+\\frac{1}{3}"),
        ("\\frac{1}{2}+\\frac{1}{3}", "\\frac{1}{2}+\\frac{1}{3}"),
    ],
)
def test_fix_fracs_keeps_every_piece(raw: str, normalised: str) -> None:
    assert strip_math_string(raw) == normalised


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("3\\frac{1}{2}", "\\frac{1}{2}"),  # a mixed number is not its fraction part
        ("\\frac{1}{2}+\\frac{1}{3}", "\\frac{1}{2}+\\frac{1}{4}"),  # answers differing in a later fraction
    ],
)
def test_answers_that_differ_after_a_fraction_are_not_equal(answer: str, gold: str) -> None:
    assert not is_equiv(answer, gold)


@pytest.mark.parametrize("solution", ["so \\boxed 5, {x}", "\\boxed {5}", "the area is \\fbox 7 {cm}"])
def test_a_box_command_not_followed_by_a_brace_is_no_box(solution: str) -> None:
    # last_boxed_only_string finds "\boxed ... }"; remove_boxed asserts the "\boxed{" prefix and gives None
    assert math_gold_answer(solution) is None


@pytest.mark.parametrize(("answer", "gold"), [(None, "1"), ("1", None), (None, None)])
def test_math_verify_an_unread_answer_is_wrong(answer: str | None, gold: str | None) -> None:
    assert math_answer_correct(answer, gold, checker="math_verify") is False


def test_math_verify_missing_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # `import math_verify` raises ImportError
    with pytest.raises(ImportError) as err:
        math_answer_correct("1", "1", checker="math_verify")
    assert (
        str(err.value)
        == "math_checker=math_verify needs the math-verify package: pip install 'distmatch[math]'."
    )
