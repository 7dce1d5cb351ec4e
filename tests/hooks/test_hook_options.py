"""The activation hooks see every loss option at 0, at its bounds and unset: `trl sft --<option> 0` activates the `trl
sft` hook (so TRL's parser is distmatch's, which refuses or passes the value: tests/trl/test_option_values.py), and an
Axolotl config with `<option>: 0` gets the plugin (which validates it: tests/axolotl/test_option_values.py). A value
of 0 is a value the user wrote: dropping it as if unset would let TRL or Axolotl train their own loss without a word.
"""

from __future__ import annotations

from typing import Any

import pytest

import distmatch_hooks.axolotl as axolotl_hook
import distmatch_hooks.trl as trl_hook
from distmatch._loss_names import LOSS_NAMES, LOSS_OPTION_NAMES
from tests.helpers.option_cases import DEFAULT_PARAMS, INVALID, OPTION_PARAMS, PATH_FIELDS, VALID, case_id

#: Every option once at 0 (valid or not: a refusal also needs the hook), then the table's edge values.
VALUES: list[tuple[str, Any]] = [
    *((option, 0) for option in dict(VALID)),
    ("emo_cost_embedding", "live"),
    ("anchor_reference", "initial"),
    *VALID,
    *INVALID,
]


def test_the_option_table_covers_every_loss_and_option():
    """A new loss or option (the names generated from the specs) needs its rows in tests/helpers/option_cases.py."""
    assert set(DEFAULT_PARAMS) == set(LOSS_NAMES)
    # the cost embedding and the reference model: sources, no value; the paths' settings: no loss parameter
    assert {*OPTION_PARAMS, *PATH_FIELDS, "emo_cost_embedding", "anchor_reference"} == set(LOSS_OPTION_NAMES)
    assert {option for option, _ in VALID} == set(OPTION_PARAMS)


@pytest.mark.parametrize(("option", "value"), VALUES, ids=[case_id(*c) for c in VALUES])
def test_trl_hook_activates_for_the_option(option, value):
    for args in (
        [f"--{option}", str(value)],
        [f"--{option}={value}"],
        [f"--{option.replace('_', '-')}={value}"],
    ):
        found = trl_hook.should_activate(["/venv/bin/trl", "sft", "--model_name_or_path", "m", *args])
        assert found == [args[0].split("=")[0]], (args, found)


@pytest.mark.parametrize(("option", "value"), VALUES, ids=[case_id(*c) for c in VALUES])
def test_trl_hook_activates_for_the_option_in_a_config_file(tmp_path, option, value):
    config = tmp_path / "sft.yaml"
    config.write_text(f"model_name_or_path: m\n{option}: {value!r}\n")
    assert trl_hook.should_activate(["/venv/bin/trl", "sft", "--config", str(config)]) == [
        f"{option} (in {config})"
    ]


@pytest.mark.parametrize(("option", "value"), VALUES, ids=[case_id(*c) for c in VALUES])
def test_axolotl_hook_counts_the_option(option, value):
    assert axolotl_hook.distmatch_keys({"base_model": "m", option: value}) == [option]
    assert axolotl_hook.distmatch_keys({"base_model": "m", "loss": "ce", option: value}) == ["loss", option]


def test_unset_options_do_not_activate_the_hooks(tmp_path):
    """Unset (None / absent) options are not the user's: a plain config stays Axolotl's, plain `trl sft` TRL's."""
    options = [option for option, _ in VALUES]
    assert axolotl_hook.distmatch_keys({"base_model": "m", **dict.fromkeys(options)}) == []
    assert trl_hook.should_activate(["/venv/bin/trl", "sft", "--model_name_or_path", "m"]) == []
