"""The shipped task YAMLs (`eval_tasks/<family>/*.yaml`, `_*_template_yaml`) and the packaged prompts they load."""

from __future__ import annotations

import pytest

from eval_tasks.creative.creative import creative_documents
from eval_tasks.nlu import nlu
from tests.helpers.env import REPO_ROOT

pytestmark = pytest.mark.slow


def test_creative_prompt_sets_shipped() -> None:
    poems, stories = creative_documents("poem"), creative_documents("story")
    assert (len(poems), len(stories)) == (573, 500)
    assert (
        poems[0]["prompt"] == "Write a poem titled 'The Phoenix and the Turtle' with no more than 200 words."
    )
    assert stories[-1]["title"] == "Grass Isn't Always Greener"
    assert all(
        d["prompt"] == f"Write a story titled '{d['title']}' with no more than 200 words." for d in stories
    )
    assert [d["id"] for d in poems] == list(range(573))


def test_task_yaml_protocol_values() -> None:
    """The shipped YAMLs carry the papers' settings (the CLI run below overrides some for speed)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    folder = REPO_ROOT / "eval_tasks"  # the family packages
    div = yaml.load((folder / "creative" / "_diversity_template_yaml").read_text(), Loader=Loader)
    assert div["repeats"] == 16 and div["filter_list"][0]["filter"][0] == {
        "function": "take_first_k",
        "k": 16,
    }
    assert div["generation_kwargs"] == {
        "until": [],
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 0.9,
        "max_gen_toks": 512,
    }
    ifeval = yaml.load((folder / "chat" / "distmatch_ifeval.yaml").read_text(), Loader=Loader)
    assert (
        ifeval["generation_kwargs"]["max_gen_toks"] == 1024
        and ifeval["generation_kwargs"]["do_sample"] is False
    )
    group = yaml.load((folder / "nlu" / "distmatch_nlu.yaml").read_text(), Loader=Loader)
    assert group["task"] == list(nlu.NLU_TASK_NAMES)
    assert group["aggregate_metric_list"] == [
        {"metric": "acc", "aggregation": "mean", "weight_by_size": False},
        {"metric": "acc_ppl", "aggregation": "mean", "weight_by_size": False},
    ]


def test_diversity_yaml_sample_count_is_the_option_default() -> None:
    """The YAML's repeats / filter (what `lm_eval validate` sees) are the option table's `num_samples` default, which
    the task class sets them from."""
    import yaml

    from eval_tasks.task_options import TASK_OPTIONS

    text = (REPO_ROOT / "eval_tasks" / "creative" / "_diversity_template_yaml").read_text()
    div = yaml.safe_load(text.replace("!function ", ""))
    k = TASK_OPTIONS["num_samples"].default
    assert div["repeats"] == k and div["filter_list"] == [
        {"name": "none", "filter": [{"function": "take_first_k", "k": k}]}
    ]
