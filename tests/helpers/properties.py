"""The Hypothesis settings of the property tests (tests/losses/test_properties.py, tests/eval/test_metric_properties.py).

`bounded(n)` gives one property its settings: at most `n` examples, drawn from a fixed seed (`derandomize`: the same
examples every run, in CI and locally), no per-example deadline (the suite's 2 workers make times noisy), no example
database (nothing written into the checkout). The `n` of each property keeps the whole property run within the
budget docs/development.md ("Times") states.

A deeper search, run by hand (never by `make test`): `DISTMATCH_PROPERTY_SCALE=20` draws 20 times as many examples
from a fresh random seed each run. A counterexample it finds goes into the property as an `@example(...)` with a note
(or, for a bug of the library, an `xfail(strict=True)` test naming it), so the fixed run keeps it.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: The environment variable of the deeper, random search (a positive integer factor; unset or 1: the fixed run).
SCALE_ENV = "DISTMATCH_PROPERTY_SCALE"


def property_scale() -> int:
    text = os.environ.get(SCALE_ENV, "").strip() or "1"
    if not text.isdigit() or int(text) < 1:
        raise ValueError(
            f"{SCALE_ENV}={text!r}: expected a positive integer (the factor on each max_examples)."
        )
    return int(text)


#: What every property shares (the fixed run).
CI = settings(
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    # Building a case draws a handful of integers and floats; the tensors come from a drawn seed.
    suppress_health_check=(HealthCheck.too_slow,),
)


def bounded(max_examples: int) -> settings:
    """The settings of one property: `max_examples` fixed-seed examples, or the deeper random search of SCALE_ENV."""
    scale = property_scale()
    if scale == 1:
        return settings(CI, max_examples=max_examples)
    return settings(CI, max_examples=max_examples * scale, derandomize=False)
