"""Every loss option at 0, at its bounds and unset through the Axolotl plugin (0.19 in `.venv-axolotl`, the newest in
`.venv-axolotl-latest`): the YAML keys validated as `axolotl train` does (`tests.helpers.axolotl_cases.validate`),
then the trainer class the plugin hands to Axolotl (`get_trainer_cls`) and the loss parameters its options give
(`trl_ext.options.loss_params`, what `DistMatchTrainer` computes the loss with). Expected values:
tests/helpers/option_cases.py (from docs/losses.md). Cheap: no model is loaded, nothing is trained.
"""

from __future__ import annotations

import pytest

axolotl = pytest.importorskip("axolotl")

from axolotl.integrations.base import PluginManager  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from tests.helpers.axolotl_cases import PLUGIN, tiny_config, validate  # noqa: E402
from tests.helpers.option_cases import (  # noqa: E402
    DEFAULT_PARAMS,
    DEFAULT_SETTINGS,
    ENV_INVALID,
    INVALID,
    PATH_ACCEPTED,
    PATH_ENV,
    PATH_NEEDS_KERNEL,
    PATH_REFUSED_VALUES,
    VALID,
    case_id,
    expected_params,
    expected_settings,
    kernel_refusal,
    refusal,
)
from trl_ext.options import fused_settings, loss_params  # noqa: E402


def _trainer_options(assets, tmp_path, loss, **options):
    cfg = validate(tiny_config(assets, tmp_path, loss=loss, **options), gpu=False)
    trainer_cls = PluginManager.get_instance().plugins[PLUGIN].get_trainer_cls(cfg)
    assert trainer_cls.distmatch_loss == loss
    return trainer_cls.distmatch_options


def _assert_params(got, want):
    assert set(got) == set(want), (got, want)
    for key, value in want.items():
        assert got[key] == value and type(got[key]) is type(value), (key, got[key], value)


@pytest.mark.parametrize(("option", "value"), VALID, ids=[case_id(*c) for c in VALID])
def test_valid_value_reaches_the_loss(assets, tmp_path, option, value):
    loss, want = expected_params(option, value)
    options = _trainer_options(assets, tmp_path, loss, **{option: value})
    assert options[option] == value
    _assert_params(loss_params(loss, options), want)


@pytest.mark.parametrize("loss", list(DEFAULT_PARAMS))
def test_unset_options_are_the_documented_defaults(assets, tmp_path, loss):
    options = _trainer_options(assets, tmp_path, loss)
    _assert_params(loss_params(loss, options), DEFAULT_PARAMS[loss])
    if loss == "emo":
        assert options["emo_cost_embedding"] == "frozen"


@pytest.mark.parametrize(("option", "value"), INVALID, ids=[case_id(*c) for c in INVALID])
def test_value_outside_its_bounds_fails_validation(assets, tmp_path, option, value):
    loss, _ = expected_params(option, value)
    with pytest.raises(ValidationError) as info:
        validate(tiny_config(assets, tmp_path, loss=loss, **{option: value}), gpu=False)
    assert refusal(option, value) in str(info.value)


# ---- the memory-efficient paths' settings (options of every loss) ------------------------------------------------


def _settings(options) -> dict:
    settings = fused_settings(options)
    return {name: getattr(settings, name) for name in DEFAULT_SETTINGS}


@pytest.mark.parametrize(("option", "value"), PATH_ACCEPTED, ids=[case_id(*c) for c in PATH_ACCEPTED])
def test_a_path_setting_reaches_the_trainer(assets, tmp_path, monkeypatch, option, value):
    monkeypatch.delenv(PATH_ENV[option], raising=False)
    options = _trainer_options(assets, tmp_path, "gem_ls", **{option: value})
    assert options[option] == value and _settings(options) == expected_settings(option, value)


@pytest.mark.parametrize(("option", "value"), PATH_ACCEPTED, ids=[case_id(*c) for c in PATH_ACCEPTED])
def test_the_environment_fills_an_unset_path_setting(assets, tmp_path, monkeypatch, option, value):
    monkeypatch.setenv(PATH_ENV[option], str(value))
    options = _trainer_options(assets, tmp_path, "gem_ls")
    assert options[option] == value and _settings(options) == expected_settings(option, value)


@pytest.mark.parametrize(
    ("option", "value"), PATH_REFUSED_VALUES, ids=[case_id(*c) for c in PATH_REFUSED_VALUES]
)
def test_a_path_setting_out_of_range_fails_validation(assets, tmp_path, option, value):
    with pytest.raises(ValidationError) as info:
        validate(tiny_config(assets, tmp_path, loss="gem_ls", **{option: value}), gpu=False)
    assert option in str(info.value) and str(value) in str(info.value)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the kernel could run here")
@pytest.mark.parametrize(("option", "value"), PATH_NEEDS_KERNEL, ids=[case_id(*c) for c in PATH_NEEDS_KERNEL])
def test_a_setting_the_kernel_must_run_fails_validation_without_cuda(
    assets, tmp_path, monkeypatch, option, value
):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValidationError) as info:
        validate(tiny_config(assets, tmp_path, loss="gem_ls", **{option: value}), gpu=False)
    assert kernel_refusal(option, value) in str(info.value) and "no CUDA device" in str(info.value)


@pytest.mark.parametrize(("variable", "text"), ENV_INVALID, ids=[f"{v}={t!r}" for v, t in ENV_INVALID])
def test_a_bad_environment_value_fails_validation_naming_the_variable(
    assets, tmp_path, monkeypatch, variable, text
):
    monkeypatch.setenv(variable, text)
    with pytest.raises(ValidationError) as info:
        validate(tiny_config(assets, tmp_path, loss="gem_ls"), gpu=False)
    assert f"{variable}={text!r} is invalid; expected " in str(info.value)
