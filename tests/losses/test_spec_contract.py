"""The loss spec's contract (trl_ext/losses/spec.py), checked by building its objects at test time.

Every loss's `Option`s are built once, at import, by `spec.option` from the loss's `Param`s; these tests build them
again from the registered parameters, so that what `option` promises (the user-facing option takes its parameter's
default, check, type and choices: "defined once, in `param`") is checked on each call, not only on the objects the
import already made.
"""

from __future__ import annotations

import pytest

from trl_ext.losses.registry import LOSSES
from trl_ext.losses.spec import REQUIRED, LossSpec, Option, Param, option

PARAMS = [(name, p) for name, spec in sorted(LOSSES.items()) for p in spec.params]


@pytest.mark.parametrize(("loss", "param"), PARAMS, ids=[f"{n}-{p.name}" for n, p in PARAMS])
def test_option_takes_everything_but_its_name_and_help_from_its_parameter(loss: str, param: Param) -> None:
    built = option(param, f"{loss}_{param.name}", "the help text")
    assert built == Option(
        name=f"{loss}_{param.name}",
        param=param.name,
        default=param.default,
        help="the help text",
        check=param.check,
        type=param.type,
        choices=param.choices,
        from_model=False,
    )


def test_each_registered_option_of_a_parameter_is_what_option_builds_from_it() -> None:
    """An option that holds its parameter's value (not `from_model`) agrees with the parameter in everything:
    rebuilt by `option`, it is the registered one."""
    seen = 0
    for spec in LOSSES.values():
        params = {p.name: p for p in spec.params}
        for opt in spec.options:
            if opt.from_model:  # says where the value comes from (the model); checked by its own `check`
                continue
            assert option(params[opt.param], opt.name, opt.help) == opt, (spec.name, opt.name)
            seen += 1
    assert seen >= 5  # GEM's beta, EMO's weighting, ...


def test_param_names_are_the_parameters_in_their_order() -> None:
    def check(value: object) -> None:
        return None

    spec = LossSpec(
        name="x",
        summary="x",
        rows=lambda rows: None,
        reference=lambda full: None,
        params=(
            Param("beta", 0.7, check, "b"),
            Param("alpha", REQUIRED, check, "a"),
            Param("gamma", 1, check, "g"),
        ),
    )
    assert spec.param_names == ("beta", "alpha", "gamma")
    assert LossSpec(name="y", summary="y", rows=spec.rows, reference=spec.reference).param_names == ()
    assert LOSSES["gem_ls"].param_names == ("beta",)


def test_required_reads_as_its_name() -> None:
    """The default of a parameter the caller must give shows as REQUIRED in help and errors."""
    assert repr(REQUIRED) == "REQUIRED"
