"""`DistMatchSFTConfig` (`trl_ext/config.py`): fields built from the loss specs, loss choices, option values, the
parser and YAML configs, and settings refused with our loss.

Tiny random Llamas built in code (`models` / `data` fixtures: tests/trl/conftest.py), local JSONL, no mocks, offline.
Runs in `.venv` (TRL 1.16) and in `.venv-axolotl` (TRL 1.9): the `trl_trainer` marker (set on tests/trl/) selects it in
both (see the Makefile).
"""

from __future__ import annotations

import pytest

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")


from transformers import AutoTokenizer  # noqa: E402

from tests.helpers.sft import (  # noqa: E402
    OUR_LOSSES,
    TRL_VERSION,
    load_model,
    make_config,
    make_trainer,
)
from trl_ext.config import LOSS_CHOICES, DistMatchSFTConfig  # noqa: E402
from trl_ext.trainer import DistMatchSFTTrainer  # noqa: E402

# trl_trainer is set on tests/trl/ by tests/placement.py.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


# ---------------------------------------------------------------------------------------------------------
# Options and bad input


def test_trl_config_fields_are_built_from_the_specs():
    import dataclasses

    from distmatch_hooks._common import RUN_OPTION_NAMES
    from trl_ext.options import LOSS_OPTIONS

    fields = {f.name: f for f in dataclasses.fields(DistMatchSFTConfig)}
    assert set(RUN_OPTION_NAMES) <= set(fields)  # `allow_loss_change`: the same name as the Axolotl key
    for option in LOSS_OPTIONS:
        f = fields[option.name]
        assert f.metadata["help"].startswith(option.help)
        assert f.default == option.default or f.default is None
        if option.choices is not None:
            assert tuple(f.metadata["choices"]) == option.choices


def test_loss_choices_are_trl_types_plus_ours():
    assert all(isinstance(c, str) for c in LOSS_CHOICES), LOSS_CHOICES
    assert {"nll", "dft"} <= set(LOSS_CHOICES), (TRL_VERSION, LOSS_CHOICES)
    assert set(OUR_LOSSES) <= set(LOSS_CHOICES)


@pytest.mark.parametrize("trl_loss", ["nll"])
def test_trl_loss_names_are_forwarded_to_loss_type(tmp_path, trl_loss):
    config = make_config(tmp_path, loss=trl_loss)
    assert config.loss_type == trl_loss and config.distmatch_loss is None


def test_loss_dft_is_ours_and_loss_type_dft_stays_trls(tmp_path):
    """A name both define: `loss` selects ours (fused / chunked), `loss_type` keeps selecting TRL's."""
    ours = make_config(tmp_path, loss="dft")
    assert ours.distmatch_loss == "dft" and ours.loss_type == "nll"
    theirs = make_config(tmp_path, loss_type="dft")
    assert theirs.distmatch_loss is None and theirs.loss_type == "dft"


def test_unknown_loss_lists_the_choices(tmp_path):
    with pytest.raises(ValueError, match="gem_lsx") as err:
        make_config(tmp_path, loss="gem_lsx")
    assert all(name in str(err.value) for name in (*OUR_LOSSES, "nll"))


@pytest.mark.parametrize(
    ("overrides", "option"),
    [
        ({"loss": "gem_ls", "gem_beta": 0.0}, "gem_beta"),
        ({"loss": "gem_linear", "gem_beta": -1.0}, "gem_beta"),
        ({"loss": "emo", "emo_weighting": "x"}, "emo_weighting"),
        ({"loss": "tailr", "tailr_gamma": 2.0}, "tailr_gamma"),
        ({"loss": "mixce", "mixce_gamma": -0.5}, "mixce_gamma"),
        ({"loss": "emo", "emo_cost_embedding": ""}, "emo_cost_embedding"),
        ({"loss": "eaft", "eaft_alpha": -1.0}, "eaft_alpha"),
        ({"loss": "eaft", "eaft_k": 0}, "eaft_k"),
        ({"loss": "tailr", "tailr_min_weight": 1.5}, "tailr_min_weight"),
        ({"loss": "tailr", "tailr_variant": "tvd"}, "tailr_variant"),
        ({"loss": "emo", "emo_ratio_clamp": 0.0}, "emo_ratio_clamp"),
        ({"loss": "emo", "emo_target_mass": "kept"}, "emo_target_mass='kept' is invalid"),
        ({"loss": "gem_ls", "emo_target_mass": "included"}, "emo_target_mass"),
        (
            {"loss": "emo", "emo_weighting": "emo2", "emo_ratio_clamp": 3.0},
            "emo_ratio_clamp=3.0 bounds emo1's",
        ),
    ],
)
def test_bad_option_values_are_rejected_by_the_config(tmp_path, overrides, option):
    with pytest.raises(ValueError, match=option):
        make_config(tmp_path, **overrides)


def test_paper_variant_options_reach_the_loss_parameters(tmp_path):
    """TaiLr's min_weight / the EMO code's tvd variant, EMO's ratio clamp and target mass: flags -> functional
    parameters."""
    from trl_ext.options import loss_params

    parser = trl.TrlParser((DistMatchSFTConfig,))
    (config,) = parser.parse_args_and_config(
        [
            "--output_dir",
            str(tmp_path),
            "--loss",
            "tailr",
            "--tailr_min_weight",
            "0.3",
            "--tailr_variant",
            "emo_code",
            "--tailr_gamma",
            "0.9",
            "--use_cpu",
            "true",
        ]
    )
    options = {k: getattr(config, k) for k in ("tailr_gamma", "tailr_min_weight", "tailr_variant")}
    assert loss_params("tailr", options) == {"gamma": 0.9, "min_weight": 0.3, "variant": "emo_code"}
    (config,) = parser.parse_args_and_config(
        ["--output_dir", str(tmp_path), "--loss", "emo", "--emo_ratio_clamp", "3.0", "--use_cpu", "true"]
    )
    assert config.emo_ratio_clamp == 3.0
    (config,) = parser.parse_args_and_config(
        ["--output_dir", str(tmp_path), "--loss", "emo", "--emo_target_mass", "included", "--use_cpu", "true"]
    )
    assert config.emo_target_mass == "included"
    assert loss_params("emo", config.loss_options())["target_mass"] == "included"
    defaults = make_config(tmp_path, loss="tailr")
    # Unset options stay None in the config (so a default is never taken for the user's choice); the loss gets the
    # spec's defaults: TaiLr's own criterion with min_weight 0.2.
    assert (defaults.tailr_min_weight, defaults.tailr_variant) == (None, None)
    assert loss_params("tailr", defaults.loss_options()) == {
        "gamma": 0.5,
        "min_weight": 0.2,
        "variant": "tailr",
    }
    assert defaults.emo_ratio_clamp is None
    assert loss_params("emo", {"emo_ratio_clamp": 3.0})["ratio_clamp"] == 3.0
    assert loss_params("emo", {})["ratio_clamp"] is None
    assert defaults.emo_target_mass is None and loss_params("emo", {})["target_mass"] == "excluded"


def test_parser_rejects_unknown_loss_with_the_choices(tmp_path, capsys):
    parser = trl.TrlParser((DistMatchSFTConfig,))
    with pytest.raises(SystemExit) as exc:
        parser.parse_args_and_config(["--output_dir", str(tmp_path), "--loss", "bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "invalid choice" in err
    assert all(name in err for name in OUR_LOSSES), err


def test_parser_and_yaml_config_accept_our_options(tmp_path):
    parser = trl.TrlParser((DistMatchSFTConfig,))
    (config,) = parser.parse_args_and_config(
        ["--output_dir", str(tmp_path), "--loss", "gem_ls", "--gem_beta", "0.5", "--use_cpu", "true"]
    )
    assert config.loss == "gem_ls" and config.gem_beta == 0.5 and config.distmatch_loss == "gem_ls"
    yaml_file = tmp_path / "config.yaml"
    yaml_file.write_text(f"output_dir: {tmp_path}\nloss: emo\nemo_weighting: emo2\nuse_cpu: true\n")
    (config,) = parser.parse_args_and_config(["--config", str(yaml_file)])
    assert config.loss == "emo" and config.emo_weighting == "emo2" and config.gem_beta is None
    assert config.loss_options()["gem_beta"] == 0.7  # unset: the default
    parser = trl.TrlParser((DistMatchSFTConfig,))  # `--config` set the YAML values as this parser's defaults
    (config,) = parser.parse_args_and_config(
        ["--output_dir", str(tmp_path), "--loss", "nll", "--use_cpu", "true"]
    )
    assert config.loss_type == "nll" and config.distmatch_loss is None


def test_yaml_config_with_unknown_loss_is_rejected(tmp_path, capsys):
    yaml_file = tmp_path / "config.yaml"
    yaml_file.write_text(f"output_dir: {tmp_path}\nloss: gem_lsx\nuse_cpu: true\n")
    with pytest.raises((ValueError, SystemExit)) as exc:
        trl.TrlParser((DistMatchSFTConfig,)).parse_args_and_config(["--config", str(yaml_file)])
    message = str(exc.value) + capsys.readouterr().err
    assert "gem_lsx" in message and "gem_ls" in message.replace("gem_lsx", "")


def test_label_smoothing_with_our_loss_is_rejected(models, data, tmp_path):
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        make_trainer(models["plain"], data, tmp_path, loss="emo", label_smoothing_factor=0.1)


def test_label_smoothing_set_after_the_config_is_rejected_by_the_trainer(models, data, tmp_path):
    """The trainer checks again: a config changed after its own validation (here the attribute set directly) or a
    plain TrainingArguments-like object must not reach training with label smoothing."""
    args = make_config(tmp_path, loss="emo")
    args.label_smoothing_factor = 0.1
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        DistMatchSFTTrainer(
            model=load_model(models["plain"]),
            args=args,
            train_dataset=data["train"],
            processing_class=AutoTokenizer.from_pretrained(models["plain"]),
        )


def test_compute_loss_func_with_our_loss_is_rejected(models, data, tmp_path):
    def custom(outputs, labels, num_items_in_batch=None):
        return outputs.logits.sum() * 0

    with pytest.raises(ValueError, match="compute_loss_func"):
        make_trainer(
            models["plain"], data, tmp_path, loss="gem_ls", trainer_kwargs={"compute_loss_func": custom}
        )
