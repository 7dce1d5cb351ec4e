"""`is_equiv` against Hendrycks' MATH checker (hendrycks/math ``modeling/math_equivalence.py``): one pair per
normalisation step of its ``_strip_string``, each expected value worked out by hand from that file's steps, and a
near miss for each (the step does only what it says). Only behaviour the reference and MetaMath's copy of it share
is pinned here."""

from __future__ import annotations

import pytest

from eval_tasks.math.math_answers import is_equiv, strip_math_string


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("10\\text{ cm}", "10"),  # _remove_right_units: the text before "\text{ "
        ("10\\text{ cm}", "10\\text{ inches}"),  # ... so the unit itself is never compared
        ("\\left(1,2\\right)", "(1,2)"),  # \left and \right removed
        ("\\left[ 0, 1 \\right)", "[0,1)"),
        ("\\dfrac{3}{4}", "\\frac{3}{4}"),  # dfrac -> frac
        ("\\tfrac{3}{4}", "\\frac34"),  # tfrac -> frac, then \frac34 -> \frac{3}{4}
        ("0.5", "\\frac{1}{2}"),  # the one decimal the checker rewrites
        ("0.5", "1/2"),
        ("1/2", "\\frac{1}{2}"),  # _fix_a_slash_b: integer a/b
        ("3/4", "\\frac34"),
        ("\\sqrt3", "\\sqrt{3}"),  # _fix_sqrt: one character braced
        ("2\\sqrt2+\\sqrt5", "2\\sqrt{2}+\\sqrt{5}"),
        ("\\frac12", "\\frac{1}{2}"),  # _fix_fracs
        ("\\frac1{72}", "\\frac{1}{72}"),
        ("\\frac{\\sqrt3}2", "\\frac{\\sqrt{3}}2"),  # braced numerator kept as it is
        ("x = 5", "5"),  # a left side of at most two characters dropped
        ("xy=5", "5"),
        ("k=\\frac12", "\\frac{1}{2}"),
        (".5", "\\frac{1}{2}"),  # a leading "." gets its 0, then 0.5 -> \frac{1}{2}
        (".25", "0.25"),
        ("\\{.5\\}", "\\{0.5\\}"),  # "{." -> "{0."
        ("1, .5", "1,0.5"),  # " ." -> " 0."
        ("90^\\circ", "90"),  # degrees
        ("90^{\\circ}", "90"),
        ("50\\%", "50"),  # percent
        ("\\$5", "5"),  # dollars
        ("1\\!000", "1000"),  # inverse spaces
        ("1 000", "1000"),  # spaces
        ("\\frac{1}\n{2}", "\\frac{1}{2}"),  # line breaks
        ("\\\\frac{1}{2}", "\\frac{1}{2}"),  # "\\" -> "\"
    ],
)
def test_each_hendrycks_normalisation_makes_the_pair_equal(answer: str, gold: str) -> None:
    assert is_equiv(answer, gold) and is_equiv(gold, answer)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("10\\text{ cm}", "cm"),  # the number is kept, not the unit
        ("\\frac12", "\\frac{2}{1}"),  # numerator first
        ("\\frac12", "\\frac21"),
        ("1/2", "2/1"),
        ("01/2", "\\frac{1}{2}"),  # "01/2" is not "1/2" written back: left as it is
        ("\\sqrt34", "\\sqrt{34}"),  # only the first character goes under the root
        ("abc=5", "5"),  # a left side of three characters stays
        ("x=5=5", "5"),  # two "=": nothing dropped
        ("0.50", "\\frac{1}{2}"),  # only the exact string 0.5
        ("0.25", "\\frac{1}{4}"),
        ("\\frac{2}{4}", "\\frac{1}{2}"),  # string-level: no arithmetic
    ],
)
def test_what_the_normalisation_does_not_make_equal(answer: str, gold: str) -> None:
    assert not is_equiv(answer, gold)


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("x = \\dfrac12", "\\frac{1}{2}"),
        ("\\left( 2\\sqrt3, .5 \\right)", "(2\\sqrt{3},0.5)"),
        ("5\\text{ cm}^2", "5"),
        ("k = 3/4", "\\frac{3}{4}"),
        ("\\$1\\!000.5", "1000.5"),
        ("12^{\\circ}\\%", "12"),
    ],
)
def test_the_steps_compose_as_in_the_reference(raw: str, normalised: str) -> None:
    assert strip_math_string(raw) == normalised
