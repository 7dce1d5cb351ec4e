"""The lm-eval task class, loader and metric of GEM's GSM8K / MATH voting and coverage (``distmatch_gsm8k``,
``distmatch_math``; the YAMLs beside this module reference them through ``utils.py``). The sampling settings are
:class:`eval_tasks.best_of_n.harness.SampledTask`'s, the per-question scores :mod:`eval_tasks.best_of_n`'s, the
answers :mod:`eval_tasks.math.math_answers`'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval_tasks.best_of_n import best_of_n
from eval_tasks.best_of_n.harness import SampledTask, metric_list
from eval_tasks.lm_eval_tasks.task_base import dataset_dict
from eval_tasks.task_options import resolve

__all__ = ["MathVotingTask", "load_math_dataset", "math_voting_process_results"]


def load_math_dataset(distmatch_task: str, **options: Any) -> Any:
    data_dir = resolve("math", options, f"distmatch_{distmatch_task}")["data_dir"]
    return dataset_dict(best_of_n.math_documents(distmatch_task, data_dir=data_dir))


def math_voting_process_results(doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
    """Default options (the task class passes its own); GSM8K scoring."""
    samples = [str(s) for s in results[0]]
    return best_of_n.math_question_scores("gsm8k", samples, str(doc["gold"]), best_of_n.ks_for(len(samples)))


class MathVotingTask(SampledTask):
    """GSM8K / MATH: MV@k and BON@k (coverage) over the first k samples; ``acc`` when ``greedy``."""

    FAMILY = "math"

    def prepare_config(self, config: dict[str, Any]) -> None:
        self.kind = str((config.get("dataset_kwargs") or {}).get("distmatch_task", "gsm8k"))
        self.greedy = bool(self.resolved["greedy"])
        self._sampling(config, greedy=self.greedy)
        names = ["acc"] if self.greedy else [f"{m}@{k}" for m in ("mv", "bon") for k in self.ks]
        config["metric_list"] = metric_list([*names, "no_answer"])

    def process_results(self, doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
        samples = [str(s) for s in results[0]]
        scores = best_of_n.math_question_scores(
            self.kind, samples, str(doc["gold"]), self.ks, checker=self.resolved["math_checker"]
        )
        if self.greedy:
            return {"acc": scores["bon@1"], "no_answer": scores["no_answer"]}
        return scores
