"""The lm-eval task class, loader and metrics of GEM's IFEval (the YAML beside this module references them through
``utils.py``; the metrics are lm-eval's own IFEval ones). Options: :mod:`eval_tasks.lm_eval_tasks.task_base`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval_tasks import dataset_loading
from eval_tasks.lm_eval_tasks.task_base import DistMatchTask, dataset_dict
from eval_tasks.task_options import resolve

__all__ = ["IFEvalTask", "agg_inst_level_acc", "ifeval_process_results", "load_ifeval_dataset"]


def load_ifeval_dataset(**options: Any) -> Any:
    dataset_loading.ensure_punkt_tab()
    data_dir = resolve("ifeval", options, "distmatch_ifeval")["data_dir"]
    return dataset_dict(dataset_loading.ifeval_documents(data_dir=data_dir))


def _ifeval_utils() -> Any:
    dataset_loading.ensure_punkt_tab()  # before lm-eval's instructions_util tries nltk.download at import
    from lm_eval.tasks.ifeval import utils

    return utils


def ifeval_process_results(doc: Mapping[str, Any], results: list[str]) -> dict[str, Any]:
    return _ifeval_utils().process_results(doc, results)


def agg_inst_level_acc(items: list[list[bool]]) -> float:
    return _ifeval_utils().agg_inst_level_acc(items)


class IFEvalTask(DistMatchTask):
    WANTS_CHAT_TEMPLATE = True
    FAMILY = "ifeval"
