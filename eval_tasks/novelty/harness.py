"""The lm-eval task class and loader of NoveltyBench (the YAMLs beside this module reference them through
``utils.py``). Options: ``num_samples`` (10), ``classifier``, ``reward_model``, ``scorer_device``,
``reward_batch_size``, ``prompts_file`` (:mod:`eval_tasks.task_options`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval_tasks.lm_eval_tasks.task_base import DistMatchTask, dataset_dict, log
from eval_tasks.novelty.noveltybench import comparability, gem_diversity, novelty_documents
from eval_tasks.task_options import resolve

__all__ = ["NoveltyTask", "load_novelty_dataset", "novelty_process_results"]


def load_novelty_dataset(distmatch_task: str, **options: Any) -> Any:
    """The prompts of ``curated`` / ``wildchat``: the packaged files, or ``prompts_file``."""
    prompts_file = resolve("novelty", options, f"distmatch_noveltybench_{distmatch_task}")["prompts_file"]
    return dataset_dict(novelty_documents(distmatch_task, prompts_file))


def novelty_process_results(doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
    """The published models' scores of one prompt's responses (the task class passes its options instead)."""
    from eval_tasks.novelty.scorers import load_scorer

    samples = [str(s) for s in results[0]]
    return _metrics(load_scorer().score(str(doc["prompt"]), samples), samples)


def _metrics(scored: Mapping[str, Any], samples: list[str]) -> dict[str, float]:
    """NoveltyBench's two numbers and, beside them, GEM's n-gram and Self-BLEU diversity of the same samples."""
    return {
        "distinct": float(scored["distinct"]),
        "utility": float(scored["utility"]),
        **gem_diversity(samples),
    }


class NoveltyTask(DistMatchTask):
    """K responses per prompt (``repeats``, all kept by ``take_first_k``), partitioned and scored together.

    The results file's ``configs.<task>.metadata`` records the models and K (``classifier``, ``reward_model``,
    ``num_samples``) and ``noveltybench_setting``: whether they are NoveltyBench's published setting (``comparable``)
    or, naming each change, not comparable with its leaderboard.
    """

    FAMILY = "novelty"

    def prepare_config(self, config: dict[str, Any]) -> None:
        k = self.resolved["num_samples"]
        config["repeats"] = k
        config["filter_list"] = [{"name": "none", "filter": [{"function": "take_first_k", "k": k}]}]
        own = self.resolved["prompts_file"]
        setting = comparability(
            self.resolved["classifier"],
            self.resolved["reward_model"],
            k,
            f"prompts_file {own} (not NoveltyBench's prompt set)" if own else None,
        )
        for key in ("classifier", "reward_model", "num_samples"):
            config["metadata"][key] = setting[key]
        config["metadata"]["noveltybench_setting"] = setting
        self.options.update(config["metadata"])
        self._scorer: Any = None

    def build_all_requests(self, **kwargs: Any) -> Any:
        if not kwargs.get("apply_chat_template"):
            log.warning(
                "%s: NoveltyBench sends each prompt as the user turn of a chat; pass --apply_chat_template for "
                "chat/instruction-tuned models.",
                self.config.task,
            )
        return super().build_all_requests(**kwargs)

    def scorer(self) -> Any:
        if self._scorer is None:
            from eval_tasks.novelty.scorers import load_scorer

            r = self.resolved
            self._scorer = load_scorer(
                r["classifier"],
                r["reward_model"],
                device=r["scorer_device"],
                batch_size=r["reward_batch_size"],
            )
        return self._scorer

    def process_results(self, doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
        samples = [str(s) for s in results[0]]
        return _metrics(self.scorer().score(str(doc["prompt"]), samples), samples)
