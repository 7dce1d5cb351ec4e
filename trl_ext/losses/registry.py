"""Every loss by name, and the parameter resolution every path shares.

`LOSSES` maps a name to its `LossSpec` (defined in `objectives/`, listed in `objectives.SPECS`); `OPTIONS` are
the user-facing options of all losses (one name may serve several losses, e.g. `gem_beta`). Checked at import:
a spec that names an unknown parameter or statistic, or two losses that define one option differently, fail here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .objectives import SPECS
from .objectives.emo import WEIGHTINGS as EMO_WEIGHTINGS
from .spec import BASE_STATS, REQUIRED, LossSpec, Option, Param, TokenStats
from .validation import (
    COST_NORM_EPS,
    IGNORE_INDEX,
    check_chunk_size,
    check_floating,
    check_labels,
    check_reference,
    checked_cost_embedding,
    compute_dtype,
    cost_inverse_norms,
    normalized_cost_embedding,
)

LOSSES: dict[str, LossSpec] = {spec.name: spec for spec in SPECS}
LOSS_NAMES: tuple[str, ...] = tuple(LOSSES)


def _check_spec(spec: LossSpec) -> None:
    problems = []
    params = {p.name: p for p in spec.params}
    stat_fields = {f.name for f in dataclasses.fields(TokenStats)} - set(BASE_STATS)
    problems += [f"statistic {s!r} is not a TokenStats field" for s in spec.stats if s not in stat_fields]
    problems += [
        f"option {o.name!r} sets unknown parameter {o.param!r}"
        for o in spec.options
        if o.param not in params
        and not (o.from_model and o.param == "reference_model" and spec.needs_reference)
    ]
    from_model = [o for o in spec.options if o.from_model]
    if spec.needs_cost_embedding != any(o.param == "cost_embedding" for o in from_model):
        problems.append("needs_cost_embedding must match an option with from_model=True for 'cost_embedding'")
    if problems:
        raise TypeError(f"loss spec {spec.name!r}: " + "; ".join(problems))


def _collect_options() -> tuple[dict[str, Option], dict[str, tuple[str, ...]]]:
    options: dict[str, Option] = {}
    users: dict[str, list[str]] = {}
    for spec in SPECS:
        _check_spec(spec)
        for opt in spec.options:
            if options.setdefault(opt.name, opt) != opt:
                raise TypeError(
                    f"option {opt.name!r} is defined differently by losses {users[opt.name]} and {spec.name!r}"
                )
            users.setdefault(opt.name, []).append(spec.name)
    return options, {name: tuple(losses) for name, losses in users.items()}


#: Every user-facing option, by name, and the losses that use it.
OPTIONS, OPTION_LOSSES = _collect_options()
TRITON_LOSSES: tuple[str, ...] = tuple(name for name, spec in LOSSES.items() if spec.triton)


def get(name: str) -> LossSpec:
    """The spec of loss `name`; an unknown name raises `ValueError` listing the valid ones."""
    if name not in LOSSES:
        raise ValueError(f"Unknown loss {name!r}. Valid losses: {', '.join(LOSS_NAMES)}.")
    return LOSSES[name]


def resolve(name: str, params: Mapping[str, Any]) -> tuple[LossSpec, dict[str, Any]]:
    """Return the loss spec and its full, validated parameter dict (defaults filled in)."""
    spec = get(name)
    unknown = sorted(set(params) - set(spec.param_names))
    if unknown:
        valid = ", ".join(spec.param_names) or "none"
        raise ValueError(
            f"Loss {name!r} got unknown parameter(s) {', '.join(unknown)}. Valid parameters: {valid}."
        )
    resolved: dict[str, Any] = {}
    for p in spec.params:
        value = params.get(p.name, p.default)
        if value is REQUIRED:
            raise ValueError(f"Loss {name!r} needs {p.name!r}: {p.doc}.")
        problem = p.check(value)
        if problem is not None:
            raise ValueError(f"Loss {name!r}: {p.name}={value!r} is invalid; expected {problem}.")
        resolved[p.name] = value
    problem = spec.check(resolved) if spec.check is not None else None
    if problem is not None:
        raise ValueError(f"Loss {name!r}: {problem}")
    return spec, resolved


__all__ = [
    "COST_NORM_EPS",
    "EMO_WEIGHTINGS",
    "IGNORE_INDEX",
    "LOSSES",
    "LOSS_NAMES",
    "OPTIONS",
    "OPTION_LOSSES",
    "TRITON_LOSSES",
    "LossSpec",
    "Option",
    "Param",
    "check_chunk_size",
    "check_floating",
    "check_labels",
    "check_reference",
    "checked_cost_embedding",
    "compute_dtype",
    "cost_inverse_norms",
    "get",
    "normalized_cost_embedding",
    "resolve",
]
