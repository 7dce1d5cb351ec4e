"""`acc` / `acc_norm` of the distmatch lm-eval tasks, pinned to lm-eval's own definition.

Our tasks compute their metrics in `process_results` (eval_tasks/<family>/harness.py), so lm-eval's built-in
multiple-choice scoring never runs on them. Here lm-eval's own ``ConfigurableTask.process_results`` (built from our
YAMLs' choice / target fields, minus our `process_results`) scores the same log-likelihoods, and every metric name
our YAMLs report that lm-eval also defines must come out equal - including cases where dividing by the length changes
the argmax and where characters and UTF-8 bytes differ (lm-eval's `acc_norm` divides by characters).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import yaml

from tests.helpers.env import REPO_ROOT

pytest.importorskip("lm_eval")

TASKS = REPO_ROOT / "eval_tasks"  # the family packages hold the YAMLs
#: The multiple-choice metrics lm-eval's ConfigurableTask computes itself (lm_eval/api/task.py, 0.4.13).
LM_EVAL_MC_METRICS = ("acc", "acc_norm", "acc_bytes", "exact_match")


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


def _yaml(name: str) -> dict[str, Any]:
    return yaml.load((TASKS / name).read_text(), Loader=_Loader)


def _lm_eval_task(config: dict[str, Any], docs: list[dict[str, Any]], metrics: list[str]) -> Any:
    """lm-eval's ConfigurableTask with our YAML's scoring fields and lm-eval's own process_results."""
    import datasets
    from lm_eval.api.task import ConfigurableTask

    fields = ("output_type", "doc_to_text", "doc_to_choice", "doc_to_target", "target_delimiter")
    return ConfigurableTask(
        config={
            "task": "lm_eval_reference",
            "custom_dataset": lambda **_: datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)}),
            "test_split": "test",
            **{f: config[f] for f in fields if f in config},
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in metrics],
        }
    )


def _reported(config: dict[str, Any]) -> list[str]:
    return [m["metric"] for m in config["metric_list"] if m["metric"] in LM_EVAL_MC_METRICS]


def _icl_cases() -> list[tuple[dict[str, Any], list[tuple[float, bool]]]]:
    cases = [
        # The short prompt is more likely in total, the long one per character: acc and acc_norm disagree.
        ({"full_prompts": ["x" * 40, "x" * 10], "label": 0}, [(-20.0, False), (-10.0, False)]),
        ({"full_prompts": ["x" * 40, "x" * 10], "label": 1}, [(-20.0, False), (-10.0, False)]),
        # Same characters, more bytes (é = 2 bytes, 漢 = 3): per-character and per-byte argmax differ.
        ({"full_prompts": ["é" * 10, "a" * 12], "label": 0}, [(-10.0, False), (-11.5, False)]),
        (
            {"full_prompts": ["漢" * 6, "ab" * 4, "z"], "label": 1},
            [(-6.5, False), (-8.5, False), (-3.0, False)],
        ),
        # Ties: lm-eval (numpy's argmax) picks the first maximum.
        ({"full_prompts": ["ab", "cd", "ef", "gh"], "label": 0}, [(-2.0, False)] * 4),
        ({"full_prompts": ["ab", "cd", "ef", "gh"], "label": 3}, [(-2.0, False)] * 4),
        ({"full_prompts": ["abc", "d", "ef"], "label": 1}, [(-3.0, False), (-1.0, False), (-1.0, False)]),
    ]
    rng = random.Random(23)
    alphabet = "abc é漢 ,."
    for _ in range(200):
        k = rng.choice([2, 4, 6])
        prompts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(k)]
        lls = [(-rng.uniform(0.5, 40.0), False) for _ in range(k)]
        cases.append(({"full_prompts": prompts, "label": rng.randrange(k)}, lls))
    return cases


def test_icl_metrics_equal_lm_evals_definition() -> None:
    from eval_tasks.nlu import utils

    config = _yaml("nlu/_icl_template_yaml")
    reported = _reported(config)
    assert reported == ["acc", "acc_norm"]  # a new lm-eval metric name in the YAML must be checked here too
    assert config["process_results"].endswith("utils.icl_process_results")
    cases = _icl_cases()
    reference = _lm_eval_task(config, [doc for doc, _ in cases[:1]], reported)
    disagree = 0
    for doc, results in cases:
        ours = utils.icl_process_results(doc, results)
        theirs = reference.process_results(doc, results)
        assert {m: ours[m] for m in reported} == {m: float(theirs[m]) for m in reported}, (doc, results)
        disagree += ours["acc"] != ours["acc_norm"]
    assert disagree >= 10  # the cases exercise normalisation changing the prediction
    # The first two cases: acc follows the total, acc_norm the per-character log-likelihood.
    assert [utils.icl_process_results(*c)["acc"] for c in cases[:2]] == [0.0, 1.0]
    assert [utils.icl_process_results(*c)["acc_norm"] for c in cases[:2]] == [1.0, 0.0]


def test_mmlu_acc_equals_lm_evals_definition() -> None:
    from eval_tasks.nlu import utils

    config = _yaml("nlu/distmatch_mmlu.yaml")
    reported = _reported(config)
    assert reported == ["acc"]
    doc = {"context": "Q?\nAnswer:", "letters": ["A", "B", "C", "D"], "answer": 2, "subject": "virology"}
    reference = _lm_eval_task(config, [doc], reported)
    rng = random.Random(5)
    for _ in range(100):
        case = dict(doc, answer=rng.randrange(4))
        results = [(-rng.uniform(0.1, 5.0), False) for _ in range(4)]
        ours = utils.mmlu_process_results(case, results)
        assert ours["acc"] == float(reference.process_results(case, results)["acc"]), (case, results)
        assert ours["acc_subject_macro"] == ("virology", ours["acc"])
