"""Final-answer extraction and checking for GSM8K and MATH, as GEM's and MetaMath's evaluation scripts do it.

Written from the behaviour of the authors' scripts (liziniu/GEM ``evaluation/utils/gsm8k.py``, which is MetaMath's
``eval_gsm8k.py`` extractor with "the answer is" also accepted; MetaMath ``eval_math.py`` and ``util.py``, the
Hendrycks MATH normalisation), not copied from them.

* :func:`extract_gsm8k_answer` - the text after the last "The answer is" (either case of "the"), its first number
  (``[-+]?\\d*[.,/]?\\d+``: one separator at most, so "1,234,567" reads as 1234), a fraction evaluated, commas
  dropped, rounded to an int (Python's ``round``: halves to even); None when there is no answer, or when reading
  it raises (a number beyond float range, a zero denominator "00"), as GEM's voting script does. The gold answer is
  the dataset's ``answer`` with "####" replaced by "The answer is:", read by the same function.
* :func:`extract_math_answer` - MetaMath's MATH reading: the text after the last "The answer is: ", up to the first
  ".\\n", stripped, one trailing "." removed; None when the phrase is absent.
* :func:`math_gold_answer` - the content of the last ``\\boxed{...}`` of a MATH solution, else of its last
  ``\\fbox{...}`` (the scripts find an ``\\fbox`` the same way but then read it as None: a deviation, on purpose).
* :func:`strip_math_string` / :func:`is_equiv` - the Hendrycks normalisation and equality (when the normalisation
  fails on a string, as the original raises, the two raw strings are compared).
* ``checker="math_verify"`` in :func:`math_answer_correct`: the ``math-verify`` package (extra ``distmatch[math]``).
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction
from typing import Any

from distmatch.errors import DistMatchConfigError

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

_NUMBER = re.compile(r"[\-+]?\d*[\.,/]?\d+")
MATH_CHECKERS = ("hendrycks", "math_verify")


class _Unnormalisable(Exception):
    """The Hendrycks normalisation cannot handle the string (the original raises; `is_equiv` compares raw)."""


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        pass
    try:
        unicodedata.numeric(text)
        return True
    except (TypeError, ValueError):
        return False


def extract_gsm8k_answer(completion: str) -> int | None:
    """The integer answer of a GSM8K completion (GEM's reading of MetaMath's extractor), None when absent."""
    parts = completion.replace("the answer is", "The answer is").split("The answer is")
    if len(parts) < 2:
        return None
    match = _NUMBER.search(parts[-1].strip())
    if match is None:
        return None
    found = match.group()
    try:
        if "/" in found:
            numerator, denominator = found.split("/")
            if not (_is_number(numerator) and _is_number(denominator)):
                return None
            if denominator == "0":
                return round(float(numerator.replace(",", "")))
            value = Fraction(found.replace(",", ""))
            return round(float(value.numerator / value.denominator))
        return round(float(found.replace(",", "")))
    except (OverflowError, ZeroDivisionError, ValueError):
        # Beyond float range (round(inf), a quotient too large), "/00", a fraction of more than 4,300 digits: the
        # script's voting loop records no answer for such a sample, the evaluation goes on.
        return None


def gsm8k_gold_answer(answer: str) -> int | None:
    """The gold answer of a GSM8K row (``answer`` column, "#### <n>" at its end)."""
    return extract_gsm8k_answer(answer.replace("####", "The answer is:"))


def extract_math_answer(completion: str) -> str | None:
    """The answer string of a MATH completion (MetaMath's ``eval_math.py`` reading), None when absent."""
    parts = completion.split("The answer is: ")
    if len(parts) < 2:
        return None
    text = parts[-1].split(".\n")[0].strip()
    if text.endswith("."):
        text = text[:-1]
    return text.strip()


def math_gold_answer(solution: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of a MATH solution, or of its last ``\\fbox{...}`` when it has no
    ``\\boxed`` (the Hendrycks ``last_boxed_only_string`` search), as written (nested braces kept, spaces too: the
    normalisation drops them). None: no box, an unbalanced one, or a command not followed by ``{``. The scripts'
    ``remove_boxed`` strips only ``\\boxed{``, so they read an ``\\fbox{...}`` gold as None (the question can never
    be answered correctly); its content is read here."""
    command = "\\boxed"
    start = solution.rfind(command)
    if start < 0:
        command = "\\fbox"
        start = solution.rfind(command)
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(solution)):
        if solution[i] == "{":
            depth += 1
        elif solution[i] == "}":
            depth -= 1
            if depth == 0:
                boxed = solution[start : i + 1]
                prefix = command + "{"
                return boxed[len(prefix) : -1] if boxed.startswith(prefix) else None
    return None


def _fix_fracs(text: str) -> str:
    pieces = text.split("\\frac")
    out = pieces[0]
    for piece in pieces[1:]:
        out += "\\frac"
        if not piece:
            raise _Unnormalisable
        if piece[0] == "{":
            out += piece
            continue
        if len(piece) < 2:
            return text
        a, b, rest = piece[0], piece[1], piece[2:]
        out += "{" + a + "}{" + b + "}" + rest if b != "{" else "{" + a + "}" + b + rest
    return out


def _fix_a_slash_b(text: str) -> str:
    pieces = text.split("/")
    if len(pieces) != 2:
        return text
    try:
        a, b = int(pieces[0]), int(pieces[1])
    except ValueError:
        raise _Unnormalisable from None
    if text != f"{a}/{b}":
        return text
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def _remove_right_units(text: str) -> str:
    if "\\text{ " not in text:
        return text
    pieces = text.split("\\text{ ")
    if len(pieces) != 2:
        raise _Unnormalisable
    return pieces[0]


def _fix_sqrt(text: str) -> str:
    if "\\sqrt" not in text:
        return text
    pieces = text.split("\\sqrt")
    out = pieces[0]
    for piece in pieces[1:]:
        if not piece:
            raise _Unnormalisable
        out += "\\sqrt" + piece if piece[0] == "{" else "\\sqrt{" + piece[0] + "}" + piece[1:]
    return out


def strip_math_string(text: str) -> str:
    """The Hendrycks MATH normalisation of an answer string; raises ``ValueError`` where the original fails."""
    try:
        return _strip(text)
    except _Unnormalisable:
        raise ValueError(f"cannot normalise {text!r}") from None


def _strip(text: str) -> str:
    for old, new in (
        ("\n", ""),
        ("\\!", ""),
        ("\\\\", "\\"),
        ("tfrac", "frac"),
        ("dfrac", "frac"),
        ("\\left", ""),
        ("\\right", ""),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\$", ""),
    ):
        text = text.replace(old, new)
    text = _remove_right_units(text)
    text = text.replace("\\%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = _fix_sqrt(text)
    text = text.replace(" ", "")
    text = _fix_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _fix_a_slash_b(text)


def is_equiv(answer: str | None, gold: str | None) -> bool:
    """Hendrycks equality: both normalised strings equal (raw equality where normalisation fails)."""
    if answer is None and gold is None:
        return True
    if answer is None or gold is None:
        return False
    try:
        return _strip(answer) == _strip(gold)
    except _Unnormalisable:
        return answer == gold


def canonical_math_answer(answer: str | None) -> str | None:
    """The string a MATH answer votes with: its normalised form (raw where normalisation fails); None stays None."""
    if answer is None:
        return None
    try:
        return _strip(answer)
    except _Unnormalisable:
        return answer


def math_answer_correct(answer: str | None, gold: str | None, checker: str = "hendrycks") -> bool:
    """Whether a MATH answer equals the gold one: ``hendrycks`` (:func:`is_equiv`) or ``math_verify``."""
    if checker == "hendrycks":
        return is_equiv(answer, gold)
    if checker != "math_verify":
        raise DistMatchConfigError(
            f"math checker {checker!r} is not valid; valid: {', '.join(MATH_CHECKERS)}."
        )
    if answer is None or gold is None:
        return False
    try:
        import math_verify
    except ImportError:
        raise ImportError(
            "math_checker=math_verify needs the math-verify package: pip install 'distmatch[math]'."
        ) from None
    parsed_gold: Any = math_verify.parse("$" + gold + "$")
    parsed: Any = math_verify.parse("$" + answer + "$")
    return bool(math_verify.verify(parsed_gold, parsed))
