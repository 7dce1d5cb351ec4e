"""lm-eval task classes and loaders of GEM's best-of-n tasks: what the sampled tasks share (:class:`SampledTask`,
also the base of the math voting tasks ``distmatch_gsm8k`` / ``distmatch_math`` of :mod:`eval_tasks.math.harness`)
and ``distmatch_alpacaeval_bon`` (its YAML points here through ``utils.py``).

``bon_samples`` samples per question (lm-eval ``repeats``, all kept by a ``take_first_k`` filter); one score dict
per question with a key per depth k (1, 4, 8, 16, 32 up to ``bon_samples``), each averaged over questions. The
metric list is built from the sample count. ``protocol: gem_official`` sets 32 samples and the paper's new-token
limits (512 for GSM8K / MATH, 2,048 for AlpacaEval); the sampling (temperature 0.6, top-k 50, top-p 0.9) is the
YAMLs'. ``greedy: true`` (math tasks): one greedy answer per question, metric ``acc``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval_tasks.best_of_n import best_of_n
from eval_tasks.lm_eval_tasks.task_base import DistMatchTask, dataset_dict
from eval_tasks.task_options import TASK_OPTIONS, resolve

__all__ = [
    "AlpacaEvalBONTask",
    "SampledTask",
    "load_alpacaeval_dataset",
    "metric_list",
    "reward_bon_process_results",
]

#: (default, gem_official) new tokens per sample of each family.
MAX_NEW_TOKENS = {"math": (256, 512), "chat_bon": (512, 2048)}


def load_alpacaeval_dataset(**options: Any) -> Any:
    data_dir = resolve("chat_bon", options, "distmatch_alpacaeval_bon")["data_dir"]
    return dataset_dict(best_of_n.alpacaeval_documents(data_dir=data_dir))


def reward_bon_process_results(doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
    """Default options (the task class passes its own): the default reward model."""
    samples = [str(s) for s in results[0]]
    scorer = best_of_n.RewardScorer(str(TASK_OPTIONS["reward_model"].default))
    rewards = scorer.score([str(doc["prompt"])] * (len(samples) + 1), [*samples, str(doc["reference"])])
    scores = best_of_n.reward_question_scores(rewards[:-1], rewards[-1], best_of_n.ks_for(len(samples)))
    return {**scores, "reference_reward": rewards[-1]}


def metric_list(names: list[str]) -> list[dict[str, Any]]:
    """lm-eval's ``metric_list`` of per-question scores averaged over questions (``no_answer``: lower is better)."""
    return [{"metric": n, "aggregation": "mean", "higher_is_better": n != "no_answer"} for n in names]


class SampledTask(DistMatchTask):
    """A task of ``bon_samples`` samples per question, all kept, scored together (the math voting tasks of
    :mod:`eval_tasks.math.harness` and AlpacaEval best-of-n)."""

    WANTS_CHAT_TEMPLATE = True

    def _sampling(self, config: dict[str, Any], greedy: bool = False) -> int:
        """Set repeats, filter and new tokens from the options; returns the sample count."""
        n = 1 if greedy else int(self.resolved["bon_samples"])
        default, paper = MAX_NEW_TOKENS[self.FAMILY]
        tokens = self.resolved.get("max_new_tokens")
        if tokens is None:
            tokens = paper if self.resolved["protocol"] == "gem_official" else default
        gen = dict(config.get("generation_kwargs") or {})
        gen["max_gen_toks"] = int(tokens)
        if greedy:
            gen.update(do_sample=False, temperature=0.0)
            for key in ("top_k", "top_p"):
                gen.pop(key, None)
        config["generation_kwargs"] = gen
        config["repeats"] = n
        config["filter_list"] = [{"name": "none", "filter": [{"function": "take_first_k", "k": n}]}]
        config["metadata"]["max_new_tokens"] = int(tokens)
        config["metadata"]["bon_samples"] = n
        self.ks = best_of_n.ks_for(n)
        return n


class AlpacaEvalBONTask(SampledTask):
    """AlpacaEval best-of-n: each sample and the GPT-4 reference scored by ``reward_model``; Reward BON@k and the
    Bradley-Terry win rate over the first k samples (GEM Table 4)."""

    FAMILY = "chat_bon"

    def prepare_config(self, config: dict[str, Any]) -> None:
        self._sampling(config)
        names = [f"{m}@{k}" for m in ("reward_bon", "win_rate_bon") for k in self.ks]
        config["metric_list"] = metric_list([*names, "reference_reward"])
        config["metadata"]["reward_model"] = str(self.resolved["reward_model"])
        self._scorer: best_of_n.RewardScorer | None = None

    def scorer(self) -> best_of_n.RewardScorer:
        if self._scorer is None:
            self._scorer = best_of_n.RewardScorer(
                str(self.resolved["reward_model"]), batch_size=int(self.resolved["reward_batch_size"])
            )
        return self._scorer

    def process_results(self, doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
        samples = [str(s) for s in results[0]]
        prompt = str(doc["prompt"])
        rewards = self.scorer().score([prompt] * (len(samples) + 1), [*samples, str(doc["reference"])])
        scores = best_of_n.reward_question_scores(rewards[:-1], rewards[-1], self.ks)
        scores["reference_reward"] = rewards[-1]
        return scores
