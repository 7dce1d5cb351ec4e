"""The TRL activation hook's decision, in process (`distmatch_hooks/trl.py`): which `trl sft` command lines and config
files activate it, the on/off switch, and that it knows every distmatch option. The hook runs for real in
test_trl_sft.py.

Runs in `.venv` (TRL 1.16) and `.venv-axolotl` (TRL 1.9): the `trl_cli` marker (set on tests/trl/cli/) selects it in
both (see the Makefile).
"""

from __future__ import annotations

import sys

import pytest

from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module


def _load_hook_module():
    """The hook module from the working tree, under another name (importing it must stay inert here)."""
    return load_module("_hook_under_test", REPO_ROOT / "distmatch_hooks" / "trl.py", register=False)


hook = _load_hook_module()


# ---------------------------------------------------------------------------------------------------------------
# The hook's decision, in process (cheap)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/v/bin/trl", "sft", "--loss", "emo"], ["--loss"]),
        (
            ["/v/bin/trl", "sft", "--model_name_or_path", "m", "--loss=gem_ls", "--gem-beta", "0.5"],
            ["--loss", "--gem-beta"],
        ),
        (
            ["/v/bin/trl", "sft", "--gem_beta", "0.5", "--emo_weighting", "emo2", "--emo-anything", "x"],
            ["--gem_beta", "--emo_weighting", "--emo-anything"],
        ),
        (
            ["/v/bin/trl", "sft", "--ce_entropy_coef", "0.1", "--tailr_gamma", "0.2", "--mixce_gamma", "0.3"],
            ["--ce_entropy_coef", "--tailr_gamma", "--mixce_gamma"],
        ),
        (["C:\\v\\Scripts\\trl.exe", "sft", "--loss", "emo"], ["--loss"]),
        (["/site-packages/trl/scripts/sft.py", "--loss", "emo"], ["--loss"]),  # under accelerate launch
        (["/v/bin/trl", "sft", "--loss_type", "nll", "--lossy", "1"], []),  # TRL's own option, another name
        (["/v/bin/trl", "sft"], []),
        (["/v/bin/trl", "sft", "--help"], ["--help"]),  # the help lists our options too
        (["/v/bin/trl", "sft", "-h", "--loss", "emo"], ["--loss"]),
        (["/v/bin/trl", "sft", "--", "--help"], []),
        (["/v/bin/trl", "dpo", "--help"], []),
        (["/v/bin/trl", "sft", "--", "--loss", "emo"], []),
        (["/v/bin/trl", "dpo", "--loss", "emo"], []),  # another TRL command
        (["/v/bin/trl", "--loss", "emo", "sft"], []),
        (["/v/bin/python", "sft", "--loss", "emo"], []),
        (["/v/bin/notrl", "sft", "--loss", "emo"], []),
        (["/site-packages/trl/scripts/dpo.py", "--loss", "emo"], []),
        # distmatch-trl's own training script needs no hook
        (["/site-packages/trl_ext/scripts/distmatch_sft.py", "--loss", "emo"], []),
        (["-c", "--loss"], []),
        ([], []),
    ],
)
def test_hook_flags(argv, expected):
    assert hook.should_activate(argv) == expected


@pytest.mark.parametrize("with_yaml", [True, False])
def test_hook_config_keys(tmp_path, monkeypatch, with_yaml):
    if not with_yaml:  # at interpreter start PyYAML may not be importable yet: a plain scan of top-level keys
        monkeypatch.setitem(sys.modules, "yaml", None)

    def trl_sft_config(text: str) -> list[str]:
        path = tmp_path / "config.yaml"
        path.write_text(text)
        return hook.should_activate(["/v/bin/trl", "sft", "--config", str(path)])

    assert trl_sft_config("loss: emo\nlearning_rate: 1.0e-5\n") == [f"loss (in {tmp_path / 'config.yaml'})"]
    assert len(trl_sft_config("gem_beta: 0.7\n'emo_weighting': emo2\n")) == 2
    assert trl_sft_config("learning_rate: 1.0e-5\nloss_type: dft\n") == []
    assert trl_sft_config("model_init_kwargs:\n  loss: emo\n# loss: emo\n") == []  # top level only
    assert trl_sft_config("- loss\n") == []  # not a mapping
    if with_yaml:
        assert trl_sft_config("loss: [unclosed\n") == []  # unreadable: TRL reports it
    assert hook.should_activate(["/v/bin/trl", "sft", "--config", str(tmp_path / "missing.yaml")]) == []
    assert hook.should_activate(["/v/bin/trl", "sft", "--config"]) == []


@pytest.mark.parametrize("with_yaml", [True, False])
def test_hook_activates_for_a_resume_from_a_distmatch_checkpoint(tmp_path, monkeypatch, with_yaml):
    """Resuming a checkpoint with a run record (`distmatch.json`) without `--loss`: the hook must act, so that the
    recorded loss is continued (or another one refused); a checkpoint without the record changes nothing."""
    if not with_yaml:
        monkeypatch.setitem(sys.modules, "yaml", None)
    recorded, plain = tmp_path / "checkpoint-1", tmp_path / "checkpoint-2"
    recorded.mkdir()
    plain.mkdir()
    (recorded / "distmatch.json").write_text("{}")
    reason = f"--resume_from_checkpoint (a distmatch checkpoint: {recorded}/distmatch.json)"

    def decide(*args: str) -> list[str]:
        return hook.should_activate(["/v/bin/trl", "sft", *args])

    assert decide("--resume_from_checkpoint", str(recorded)) == [reason]
    assert decide(f"--resume-from-checkpoint={recorded}") == [reason]
    assert decide("--resume_from_checkpoint", str(plain)) == []
    assert decide("--loss", "emo", "--resume_from_checkpoint", str(recorded)) == ["--loss", reason]
    config = tmp_path / "c.yaml"
    config.write_text(f"resume_from_checkpoint: '{recorded}'\n")
    assert decide("--config", str(config)) == [reason]
    assert decide("--config", str(config), "--resume_from_checkpoint", str(plain)) == []  # the flag wins
    assert decide("--allow_loss_change") == ["--allow_loss_change"]


@pytest.mark.parametrize(
    ("value", "enabled"), [(None, True), ("1", True), ("0", False), ("off", False), ("False", False)]
)
def test_hook_switch(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv(hook.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(hook.ENV_SWITCH, value)
    assert hook.enabled() is enabled


def test_hook_knows_every_distmatch_option():
    """The hook lists our option names itself (it must not import torch); they must match the config's fields."""
    import dataclasses

    from trl import SFTConfig

    from distmatch_hooks._common import RUN_OPTION_NAMES
    from trl_ext.config import DistMatchSFTConfig
    from trl_ext.options import LOSS_OPTIONS

    ours = {f.name for f in dataclasses.fields(DistMatchSFTConfig)} - {
        f.name for f in dataclasses.fields(SFTConfig)
    }
    assert ours == {"loss", *RUN_OPTION_NAMES, *(o.name for o in LOSS_OPTIONS)}
    assert all(hook._is_our_key(name) for name in ours)
    assert not any(hook._is_our_key(f.name) for f in dataclasses.fields(SFTConfig))
