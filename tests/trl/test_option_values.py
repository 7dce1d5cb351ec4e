"""Every loss option at 0, at its bounds and unset, through the TRL integration: `DistMatchSFTConfig` built in Python
and parsed from the `trl sft` / `distmatch-trl sft` command line (TRL's own parser, `trl_ext.cli.make_sft_parser`),
then handed to a real `DistMatchSFTTrainer`. What is asserted is the trainer's `distmatch_request.params`: the values
the loss is computed with. The expected values are tests/helpers/option_cases.py's table (from docs/losses.md).

Cheap: trainers are built on the tiny model, never trained. Marker `trl_trainer` (.venv and .venv-axolotl).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

from transformers import AutoTokenizer  # noqa: E402

from tests.helpers.option_cases import (  # noqa: E402
    CHOICE_OPTIONS,
    DEFAULT_PARAMS,
    DEFAULT_SETTINGS,
    ENV_INVALID,
    INVALID,
    OPTION_PARAMS,
    PATH_ACCEPTED,
    PATH_ENV,
    PATH_FIELDS,
    PATH_NEEDS_KERNEL,
    PATH_REFUSED_VALUES,
    VALID,
    case_id,
    expected_params,
    expected_settings,
    kernel_refusal,
    refusal,
)
from tests.helpers.sft import load_model, make_config, make_trainer  # noqa: E402
from trl_ext.checks import DistMatchConfigError  # noqa: E402
from trl_ext.cli import make_sft_parser  # noqa: E402
from trl_ext.options import LOSS_OPTIONS  # noqa: E402
from trl_ext.trainer import DistMatchSFTTrainer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CLI_BASE = ["--use_cpu", "--report_to", "none", "--bf16", "false", "--max_length", "64"]


def test_the_table_covers_every_option():
    """A new option must be added to the table (and so to every integration's test)."""
    options = {o.name for o in LOSS_OPTIONS if not o.from_model and not o.path}
    assert set(OPTION_PARAMS) == options
    assert {o for o, _ in VALID} == options and {o for o, _ in INVALID} == options
    paths = {o.name for o in LOSS_OPTIONS if o.path}
    assert set(PATH_FIELDS) == set(PATH_ENV) == paths
    assert {o for o, _ in PATH_ACCEPTED} == {o for o, _ in PATH_REFUSED_VALUES} == paths


def _parse(tmp_path: Path, argv: list[str]) -> Any:
    parser = make_sft_parser()
    parsed = parser.parse_args_and_config(["--output_dir", str(tmp_path / "out"), *CLI_BASE, *argv])
    return next(p for p in parsed if hasattr(p, "distmatch_loss"))


def _trainer_from(args: Any, models, data) -> DistMatchSFTTrainer:
    return DistMatchSFTTrainer(
        model=load_model(models["plain"]),
        args=args,
        train_dataset=data["train"],
        processing_class=AutoTokenizer.from_pretrained(models["plain"]),
    )


def _build(how: str, tmp_path: Path, loss: str, options: dict[str, Any], models, data) -> DistMatchSFTTrainer:
    if how == "config":
        return make_trainer(models["plain"], data, tmp_path, loss=loss, **options)
    argv = ["--loss", loss]
    for name, value in options.items():
        argv.append(f"--{name}={value}")  # `=`: a negative value is not taken for a flag
    return _trainer_from(_parse(tmp_path, argv), models, data)


def _assert_params(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert set(got) == set(want), (got, want)
    for key, value in want.items():  # exact: the value given, not a default or a rounded one
        assert got[key] == value and type(got[key]) is type(value), (key, got[key], value)


@pytest.mark.parametrize("how", ["config", "cli"])
@pytest.mark.parametrize(("option", "value"), VALID, ids=[case_id(*c) for c in VALID])
def test_valid_value_reaches_the_loss(models, data, tmp_path, how, option, value):
    loss, want = expected_params(option, value)
    trainer = _build(how, tmp_path, loss, {option: value}, models, data)
    assert trainer.distmatch_request.name == loss
    _assert_params(trainer.distmatch_request.params, want)
    assert trainer.args.loss_options()[option] == value


@pytest.mark.parametrize("how", ["config", "cli"])
@pytest.mark.parametrize("loss", list(DEFAULT_PARAMS))
def test_unset_options_are_the_documented_defaults(models, data, tmp_path, how, loss):
    trainer = _build(how, tmp_path, loss, {}, models, data)
    _assert_params(trainer.distmatch_request.params, DEFAULT_PARAMS[loss])
    if loss == "emo":  # emo_cost_embedding unset: 'frozen', the pre-trained head, fixed
        head = trainer.model.get_output_embeddings().weight
        assert not trainer.distmatch_request.live_cost
        assert torch.equal(trainer.distmatch_request.cost_embedding, head.detach())


@pytest.mark.parametrize("how", ["config", "cli"])
def test_live_cost_embedding_reaches_the_loss(models, data, tmp_path, how):
    trainer = _build(how, tmp_path, "emo", {"emo_cost_embedding": "live"}, models, data)
    assert trainer.distmatch_request.live_cost and trainer.distmatch_request.cost_embedding is None


@pytest.mark.parametrize(("option", "value"), INVALID, ids=[case_id(*c) for c in INVALID])
def test_value_outside_its_bounds_is_refused_by_the_config(tmp_path, option, value):
    loss, _ = expected_params(option, value)
    with pytest.raises(DistMatchConfigError) as info:
        make_config(tmp_path, loss=loss, **{option: value})
    message = str(info.value)
    assert refusal(option, value) in message and "\n" not in message


@pytest.mark.parametrize(("option", "value"), INVALID, ids=[case_id(*c) for c in INVALID])
def test_value_outside_its_bounds_is_refused_by_the_command_line(tmp_path, capsys, option, value):
    loss, _ = expected_params(option, value)
    argv = ["--loss", loss, f"--{option}={value}"]
    if option in CHOICE_OPTIONS:  # argparse's own `choices`: exit status 2, the valid values listed
        with pytest.raises(SystemExit) as exit_info:
            _parse(tmp_path, argv)
        assert exit_info.value.code == 2
        assert f"invalid choice: {value!r}" in capsys.readouterr().err
        return
    with pytest.raises(DistMatchConfigError) as info:
        _parse(tmp_path, argv)
    parsed = float(value) if not isinstance(value, int) else value
    assert refusal(option, parsed) in str(info.value) and "\n" not in str(info.value)


def test_nan_and_inf_are_refused(tmp_path):
    for option in ("gem_beta", "ce_entropy_coef", "eaft_alpha", "emo_ratio_clamp"):
        loss, _ = OPTION_PARAMS[option]
        for value in (math.nan, math.inf):
            with pytest.raises(DistMatchConfigError, match=f"{option}={value!r} is invalid"):
                make_config(tmp_path, loss=loss, **{option: value})


# ---- the memory-efficient paths' settings: `loss_chunk_memory_mb`, ... (options of every loss) ---------------------


def _settings(trainer: DistMatchSFTTrainer) -> dict[str, Any]:
    settings = trainer.distmatch_request.settings
    return {name: getattr(settings, name) for name in DEFAULT_SETTINGS}


@pytest.mark.parametrize("how", ["config", "cli"])
@pytest.mark.parametrize(("option", "value"), PATH_ACCEPTED, ids=[case_id(*c) for c in PATH_ACCEPTED])
def test_a_path_setting_reaches_the_loss_and_the_record(
    models, data, tmp_path, monkeypatch, how, option, value
):
    monkeypatch.delenv(PATH_ENV[option], raising=False)
    trainer = _build(how, tmp_path, "gem_ls", {option: value}, models, data)
    assert _settings(trainer) == expected_settings(option, value)
    _assert_params(trainer.distmatch_request.params, DEFAULT_PARAMS["gem_ls"])  # not a parameter of the math
    assert trainer.args.loss_options()[option] == value


def test_unset_path_settings_are_the_documented_defaults(models, data, tmp_path, monkeypatch):
    for variable in PATH_ENV.values():
        monkeypatch.delenv(variable, raising=False)
    trainer = _build("config", tmp_path, "emo", {}, models, data)
    assert _settings(trainer) == DEFAULT_SETTINGS


@pytest.mark.parametrize(
    ("option", "value"), PATH_REFUSED_VALUES, ids=[case_id(*c) for c in PATH_REFUSED_VALUES]
)
def test_a_path_setting_out_of_range_is_refused_by_the_config_and_the_command_line(
    tmp_path, capsys, option, value
):
    with pytest.raises(DistMatchConfigError) as info:
        make_config(tmp_path, loss="gem_ls", **{option: value})
    assert refusal(option, value) in str(info.value) and "\n" not in str(info.value)
    argv = ["--loss", "gem_ls", f"--{option}={value}"]
    if isinstance(value, str):  # argparse's own `choices`: exit status 2, the valid values listed
        with pytest.raises(SystemExit) as exit_info:
            _parse(tmp_path, argv)
        assert exit_info.value.code == 2 and f"invalid choice: {value!r}" in capsys.readouterr().err
        return
    with pytest.raises(DistMatchConfigError, match=refusal(option, value)):
        _parse(tmp_path, argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernel could run here")
@pytest.mark.parametrize(("option", "value"), PATH_NEEDS_KERNEL, ids=[case_id(*c) for c in PATH_NEEDS_KERNEL])
def test_a_setting_the_kernel_must_run_is_refused_without_cuda(tmp_path, monkeypatch, option, value):
    """Before any model loads, not at the first step: the kernel cannot run on a CPU."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for build in (
        lambda: make_config(tmp_path, loss="gem_ls", **{option: value}),
        lambda: _parse(tmp_path, ["--loss", "gem_ls", f"--{option}={value}"]),
    ):
        with pytest.raises(DistMatchConfigError) as info:
            build()
        message = str(info.value)
        assert (
            kernel_refusal(option, value) in message and "no CUDA device" in message and "\n" not in message
        )


@pytest.mark.parametrize(("option", "value"), PATH_ACCEPTED, ids=[case_id(*c) for c in PATH_ACCEPTED])
def test_the_environment_is_the_fallback_of_an_unset_setting(
    models, data, tmp_path, monkeypatch, option, value
):
    """`DISTMATCH_...` fills a setting the run leaves unset, read once where the run starts and recorded with the
    options; a setting given in the config wins over it."""
    monkeypatch.setenv(PATH_ENV[option], str(value))
    trainer = _build("config", tmp_path, "gem_ls", {}, models, data)
    assert _settings(trainer) == expected_settings(option, value)
    assert trainer.args.loss_options()[option] == value
    other = 7.0 if option == "loss_chunk_memory_mb" else "float32" if option != "loss_kernels" else "auto"
    if other != value:
        assert make_config(tmp_path, loss="gem_ls", **{option: other}).loss_options()[option] == other


@pytest.mark.parametrize(("variable", "text"), ENV_INVALID, ids=[f"{v}={t!r}" for v, t in ENV_INVALID])
def test_a_bad_environment_value_is_refused_naming_the_variable(tmp_path, monkeypatch, variable, text):
    monkeypatch.setenv(variable, text)
    with pytest.raises(DistMatchConfigError) as info:
        make_config(tmp_path, loss="gem_ls")
    assert str(info.value).startswith(f"{variable}={text!r} is invalid; expected ") and "\n" not in str(
        info.value
    )
    make_config(tmp_path)  # without a distmatch loss the variables are not read: TRL's own loss is unaffected
