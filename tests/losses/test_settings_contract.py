"""trl_ext.losses.settings against its documented contract (docs/losses.md "Memory-efficient paths: settings", the
module's docstrings): the defaults per device, the bounds of the chunk budget, the environment fallback (unset and
empty variables, a bad value named with its variable, a given mapping read instead of the process's), the one-line
refusal of a bad `FusedSettings`, the user-facing options and the Triton interpreter switch."""

from __future__ import annotations

import pytest

from trl_ext.losses import settings as settings_module
from trl_ext.losses.settings import ENV, FusedSettings, env_values, triton_interpreter

MIB = 2**20


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for variable in (*ENV.values(), "TRITON_INTERPRET"):
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


# --- the chunk budget: "unset (128 MiB on a CPU, 512 on CUDA), or MiB above 0 and at most 1,048,576" ------------


def test_the_default_budget_depends_on_the_device() -> None:
    unset = FusedSettings()
    assert unset.budget_bytes("cuda") == 512 * MIB
    assert unset.budget_bytes("cpu") == 128 * MIB
    assert unset.budget_bytes(None) == 128 * MIB
    assert unset.budget_bytes("mps") == 128 * MIB  # "on a CPU" means: anything but CUDA
    given = FusedSettings(chunk_memory_mb=64)
    assert given.budget_bytes("cuda") == given.budget_bytes("cpu") == 64 * MIB  # a given budget is the budget


@pytest.mark.parametrize("mb", [2**20, 1, 0.5, 1e-3])
def test_budgets_within_the_bounds_are_accepted(mb: float) -> None:
    assert FusedSettings(chunk_memory_mb=mb).chunk_memory_mb == mb  # "at most 1,048,576" includes the bound


@pytest.mark.parametrize("mb", [0, -1, 2**20 + 1, float("inf"), float("nan"), True, "128", [128]])
def test_budgets_outside_the_bounds_or_not_numbers_are_refused(mb: object) -> None:
    with pytest.raises(
        ValueError, match=r"^FusedSettings: chunk_memory_mb=.* is invalid; expected a number of MiB"
    ):
        FusedSettings(chunk_memory_mb=mb)  # type: ignore[arg-type]


# --- the refusal: one line naming each bad field, its value and what is accepted ---------------------------------


def test_a_bad_setting_is_refused_in_one_line_naming_it() -> None:
    with pytest.raises(ValueError) as err:
        FusedSettings(kernels="cuda")
    assert (
        str(err.value)
        == "FusedSettings: kernels='cuda' is invalid; expected one of 'auto', 'torch', 'triton'."
    )


def test_every_bad_setting_is_named_at_once() -> None:
    with pytest.raises(ValueError) as err:
        FusedSettings(chunk_logits="bf16", grad_weight_accum="half")
    assert str(err.value) == (
        "FusedSettings: chunk_logits='bf16' is invalid; expected one of 'float32', 'input'; "
        "grad_weight_accum='half' is invalid; expected one of 'float32', 'weight', 'tiles'."
    )


# --- the environment fallback --------------------------------------------------------------------------------


def test_from_env_reads_the_mapping_it_is_given(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DISTMATCH_KERNELS", "triton")
    assert FusedSettings.from_env({"DISTMATCH_KERNELS": "torch"}).kernels == "torch"
    assert FusedSettings.from_env({}) == FusedSettings()
    assert FusedSettings.from_env().kernels == "triton"  # no mapping: the process's environment


def test_an_empty_variable_is_unset() -> None:
    assert env_values({variable: "" for variable in ENV.values()}) == {}
    assert FusedSettings.from_env({"DISTMATCH_CHUNK_MEMORY_MB": ""}) == FusedSettings()


@pytest.mark.parametrize("text", ["lots", "0", "-5", "inf"])
def test_a_bad_budget_variable_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(
        ValueError, match=rf"^DISTMATCH_CHUNK_MEMORY_MB='{text}' is invalid; expected a number"
    ):
        FusedSettings.from_env({"DISTMATCH_CHUNK_MEMORY_MB": text})


def test_env_values_reads_only_the_names_asked_for() -> None:
    environ = {
        "DISTMATCH_CHUNK_MEMORY_MB": "64",
        "DISTMATCH_CHUNK_LOGITS": "input",
        "DISTMATCH_GRAD_WEIGHT_ACCUM": "weight",
        "DISTMATCH_KERNELS": "torch",
    }
    everything = {
        "chunk_memory_mb": 64.0,
        "chunk_logits": "input",
        "grad_weight_accum": "weight",
        "kernels": "torch",
    }
    assert env_values(environ) == everything
    for name in everything:
        assert env_values(environ, names=[name]) == {name: everything[name]}
    assert env_values(environ, names=["kernels", "chunk_memory_mb"]) == {
        "kernels": "torch",
        "chunk_memory_mb": 64.0,
    }
    assert env_values(environ, names=[]) == {}


# --- the user-facing options (docs/losses.md's table) --------------------------------------------------------

DOCUMENTED = {
    # option: (field, default, choices)
    "loss_chunk_memory_mb": ("chunk_memory_mb", None, None),
    "loss_chunk_logits": ("chunk_logits", "float32", ("float32", "input")),
    "loss_grad_weight_accum": ("grad_weight_accum", "float32", ("float32", "weight", "tiles")),
    "loss_kernels": ("kernels", "auto", ("auto", "torch", "triton")),
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_an_option_built_for_a_setting_checks_what_the_setting_checks(name: str) -> None:
    # built now (the module's OPTIONS are built at import), from the documented table alone
    field, default, choices = DOCUMENTED[name]
    type_ = float if field == "chunk_memory_mb" else str
    option = settings_module._option(name, field, default, "the help", type_)
    assert (option.name, option.param, option.default, option.help) == (name, field, default, "the help")
    assert option.type is type_
    assert option.choices == choices
    assert not option.from_model
    good = 64.0 if choices is None else choices[-1]
    assert option.check(good) is None
    assert option.check(default) is None
    why = option.check("nonsense")
    assert why is not None
    if choices is not None:
        assert why == "one of " + ", ".join(repr(c) for c in choices)


# --- Triton's CPU interpreter switch: TRITON_INTERPRET, read as Triton reads it (knobs.env_bool) -----------------


def test_the_interpreter_is_on_for_the_values_triton_reads_as_true(clean_env: pytest.MonkeyPatch) -> None:
    for on in ("1", "true", "True", "ON", "on"):
        assert triton_interpreter({"TRITON_INTERPRET": on}) is True, on
    for off in ({}, {"TRITON_INTERPRET": "0"}, {"TRITON_INTERPRET": ""}, {"TRITON_INTERPRET": "no"}):
        assert triton_interpreter(off) is False
    assert triton_interpreter() is False  # no mapping: the process's environment
    clean_env.setenv("TRITON_INTERPRET", "1")
    assert triton_interpreter() is True
    assert triton_interpreter({}) is False  # a given mapping is read instead of the process's
