"""GSM8K / MATH answer handling against hand-worked cases of GEM's and MetaMath's scripts' behaviour."""

from __future__ import annotations

import os
import sys

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.math.math_answers import (
    canonical_math_answer,
    extract_gsm8k_answer,
    extract_math_answer,
    gsm8k_gold_answer,
    is_equiv,
    math_answer_correct,
    math_gold_answer,
    strip_math_string,
)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("So 3 + 4 = 7.\nThe answer is: 7", 7),
        ("... the answer is 12 apples", 12),  # lower-case "the" is accepted (GEM's reading)
        ("The answer is: 5. Wait, The answer is: 6", 6),  # the last occurrence
        ("The answer is: 1,234", 1234),  # thousands separator
        ("The answer is: 1,234,567", 1234),  # one separator at most: the regex stops at the second comma
        ("The answer is: -42", -42),
        ("The answer is: +8", 8),
        ("The answer is: 3/4", 1),  # fraction evaluated, then rounded
        ("The answer is: 5/2", 2),  # round() sends halves to the even neighbour
        ("The answer is: 7/2", 4),
        ("The answer is: 7/0", 7),  # zero denominator: the numerator
        ("The answer is: $18.50", 18),  # 18.5 rounds to even
        ("The answer is: 0.5", 0),
        ("The answer is: .75", 1),
        ("The answer is: x = 10 dollars", 10),  # the first number after the phrase
        ("The answer is: twelve", None),  # no number
        ("I think it is 12.", None),  # no phrase
        ("The answer is: /4", None),  # empty numerator is no number
        ("The Answer Is: 9", None),  # other capitalisations are not read
        # reading raises in GEM's script, whose voting loop then records no answer for the sample
        ("The answer is -" + "1" * 400, None),  # beyond float range: round(-inf)
        ("The answer is " + "1" * 400, None),
        ("The answer is " + "1" * 400 + "/3", None),  # a quotient too large for a float
        ("The answer is " + "1" * 400 + "/0", None),  # zero denominator: the numerator, beyond float range
        ("The answer is 1/00", None),  # Fraction(1, 0)
        ("The answer is " + "1" * 5000 + "/3", None),  # more digits than int() converts
    ],
)
def test_gsm8k_extractor(completion: str, expected: int | None) -> None:
    assert extract_gsm8k_answer(completion) == expected


def test_gsm8k_gold_from_the_dataset_answer() -> None:
    row = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72"
    assert gsm8k_gold_answer(row) == 72
    assert gsm8k_gold_answer("Total 1000+200=<<1000+200=1200>>1200\n#### 1,200") == 1200


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("We get x=2.\nThe answer is: \\frac{1}{2}", "\\frac{1}{2}"),
        ("The answer is: 5.\nSo done.", "5"),  # cut at ".\n"
        ("The answer is: 3.14.", "3.14"),  # one trailing period removed
        ("The answer is: 10 ", "10"),
        ("first The answer is: 1.\nthen The answer is: 2", "2"),  # last occurrence
        ("the answer is: 4", None),  # MetaMath's MATH reading needs the exact phrase with its colon
        ("The answer is 4", None),
    ],
)
def test_math_extractor(completion: str, expected: str | None) -> None:
    assert extract_math_answer(completion) == expected


def test_math_gold_is_the_last_boxed_content() -> None:
    assert math_gold_answer("So $x = \\boxed{2}$ or $\\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert math_gold_answer("Nested \\boxed{\\sqrt{2}+{1}} end") == "\\sqrt{2}+{1}"
    assert math_gold_answer("no box") is None
    assert math_gold_answer("\\boxed{unclosed") is None
    assert math_gold_answer("\\fbox{3}") == "3"


# \fbox: the Hendrycks MATH search (`last_boxed_only_string`, used by MetaMath's and GEM's scripts) takes the last
# "\boxed" and, only when there is none, the last "\fbox", then its braces up to the matching close. The module's
# docstring promises the box's content for both commands (the scripts' `remove_boxed` strips only "\boxed{" and reads
# an \fbox gold as None: such a question could never be answered correctly). The content is kept as written (the
# Hendrycks normalisation drops the spaces later).
@pytest.mark.parametrize(
    ("solution", "gold"),
    [
        ("The area is $\\fbox{4}$.", "4"),
        ("$\\fbox{ 4 }$", " 4 "),
        ("so $x = \\fbox{\\frac{1}{2}}$", "\\frac{1}{2}"),  # nested braces
        ("$\\fbox{\\sqrt{2}+{1}}$ end", "\\sqrt{2}+{1}"),
        ("first \\fbox{3}, finally \\fbox{4}", "4"),  # the last one
        ("\\boxed{3} and then \\fbox{4}", "3"),  # a \boxed anywhere is taken before any \fbox
        ("\\fbox{4} and then \\boxed{3}", "3"),
        ("\\boxed{\\fbox{4}}", "\\fbox{4}"),  # the \boxed's content, as written
        ("\\fbox{4", None),  # unbalanced
        ("\\fbox 4", None),  # no brace after the command
    ],
)
def test_math_gold_reads_an_fbox_like_a_boxed(solution: str, gold: str | None) -> None:
    assert math_gold_answer(solution) == gold


@pytest.mark.parametrize(
    ("completion", "correct"),
    [
        ("Boxed: $\\fbox{4}$.\nThe answer is: 4", True),
        ("The answer is: 4.\n", True),
        ("The answer is:  4 ", True),
        ("The answer is: 5", False),
        ("I box it: \\fbox{4}", False),  # no "The answer is: ": no answer
        # MetaMath's reading takes the text after the phrase as it is: a box there is not opened
        ("The answer is: \\fbox{4}", False),
        ("The answer is: \\boxed{4}", False),
    ],
)
def test_an_fbox_gold_against_the_predictions_reading(completion: str, correct: bool) -> None:
    for solution in ("$\\fbox{4}$", "$\\fbox{ 4 }$", "\\fbox{3} then \\fbox{4}", "\\fbox{3} then \\boxed{4}"):
        gold = math_gold_answer(solution)
        assert math_answer_correct(extract_math_answer(completion), gold) is correct, (completion, solution)
    assert extract_math_answer("The answer is: \\fbox{ 4 }.") == "\\fbox{ 4 }"  # the reading itself
    half = math_gold_answer("$\\fbox{\\frac{1}{2}}$")
    assert math_answer_correct(extract_math_answer("The answer is: 0.5"), half)
    assert math_answer_correct(extract_math_answer("The answer is: \\dfrac12"), half)


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("0.5", "\\frac{1}{2}"),
        ("1/2", "\\frac{1}{2}"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\frac1{72}", "\\frac{1}{72}"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("x = 5", "5"),  # short left-hand side dropped
        ("\\left( 3, 4 \\right)", "(3,4)"),
        ("90^\\circ", "90"),
        ("50\\%", "50"),
        ("\\$5", "5"),
        (".25", "0.25"),
        ("10 \\text{ cm}", "10"),  # units on the right
        ("", ""),
    ],
)
def test_hendrycks_normalisation(raw: str, normalised: str) -> None:
    assert strip_math_string(raw) == normalised


def test_is_equiv_and_its_raw_fallback() -> None:
    assert is_equiv("\\dfrac{1}{2}", "\\frac12")
    assert is_equiv("0.5", "1/2")
    assert not is_equiv("2", "3")
    assert is_equiv(None, None) and not is_equiv(None, "1")
    # "a/b" that is not two integers makes the original normalisation raise: raw strings are compared.
    with pytest.raises(ValueError, match="cannot normalise"):
        strip_math_string("x/y")
    assert is_equiv("x/y", "x/y") and not is_equiv("x/y", "x / y")
    # Two "\text{ " pieces: the original's assertion fails, raw comparison again.
    assert not is_equiv("1\\text{ a}\\text{ b}", "1")
    assert canonical_math_answer("x/y") == "x/y" and canonical_math_answer(" 1/2") == "\\frac{1}{2}"
    assert canonical_math_answer(None) is None


def test_math_checker_choice_is_checked() -> None:
    assert math_answer_correct("\\frac{1}{2}", "0.5", checker="hendrycks")
    with pytest.raises(
        DistMatchConfigError, match="math checker 'sympy' is not valid; valid: hendrycks, math_verify"
    ):
        math_answer_correct("1", "1", checker="sympy")


def _math_verify_importable() -> bool:
    """math-verify (the `math` extra, which `make` installs into .venv); $DISTMATCH_MATH_VERIFY_LIB: a folder that
    holds it (a `pip install --target` copy) for a venv without it."""
    extra = os.environ.get("DISTMATCH_MATH_VERIFY_LIB")
    if extra and extra not in sys.path:
        sys.path.insert(0, extra)
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _math_verify_importable(), reason="needs math-verify: pip install 'distmatch[math]'")
def test_math_verify_checker() -> None:
    assert math_answer_correct("\\frac{2}{4}", "\\frac{1}{2}", checker="math_verify")
    assert not is_equiv("\\frac{2}{4}", "\\frac{1}{2}")  # the Hendrycks check is string-level
    assert not math_answer_correct("3", "\\frac{1}{2}", checker="math_verify")
