"""The lm-eval task class and loader of the code tasks (``distmatch_humaneval``, ``distmatch_mbpp_plus``).

``code_samples`` completions per problem (lm-eval's ``repeats``, all kept by the filter), each cut at the first code
fence, run with the problem's tests in the sandbox (:mod:`eval_tasks.sandbox`) as a program of separate pieces
(each parsed on its own, so a completion cannot reach into the tests);
``pass@k`` per problem by the unbiased estimator (:func:`eval_tasks.metrics.pass_at_k`), x100, averaged over the
problems by lm-eval. The YAMLs set ``unsafe_code: true``, so lm-eval refuses to run them without
``--confirm_run_unsafe_code``; that confirmation is the opt-in the sandbox requires.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from eval_tasks.code.code_tasks import code_documents, completion_program, prompt_text
from eval_tasks.lm_eval_tasks.task_base import DistMatchTask, dataset_dict
from eval_tasks.metrics.pass_at_k import PASS_AT_K, pass_at_k
from eval_tasks.sandbox import execute_many
from eval_tasks.task_options import resolve

__all__ = ["CodeTask", "load_code_dataset"]

log = logging.getLogger("lm_eval.distmatch")


def load_code_dataset(distmatch_task: str, **options: Any) -> Any:
    """``custom_dataset``: the problems, each with its request text (``distmatch_prompt``) and prefix."""
    task = f"distmatch_{distmatch_task}"
    resolved = resolve("code", options, task)
    docs = code_documents(task, tests=resolved["code_tests"], data_dir=resolved["data_dir"])
    for doc in docs:
        text, prefix = prompt_text(doc, task, resolved["code_prompt"])
        doc["distmatch_prompt"] = text
        doc["distmatch_prefix"] = prefix or ""
    return dataset_dict(docs)


class CodeTask(DistMatchTask):
    """pass@k of sampled programs, run in the sandbox. Options: ``code_samples``, ``code_prompt`` (raw / chat),
    ``code_tests`` (base / plus), ``code_timeout``, ``code_workers``; ``protocol: gem_official`` = 200 samples."""

    FAMILY = "code"

    def prepare_config(self, config: dict[str, Any]) -> None:
        n = self.resolved["code_samples"]
        config["repeats"] = n
        config["filter_list"] = [{"name": "none", "filter": [{"function": "take_first_k", "k": n}]}]
        config["metric_list"] = [
            {"metric": f"pass@{k}", "aggregation": "mean", "higher_is_better": True}
            for k in PASS_AT_K
            if k <= n
        ]
        if self.resolved["code_prompt"] == "chat":
            config["gen_prefix"] = "{{distmatch_prefix}}"
        self.WANTS_CHAT_TEMPLATE = self.resolved["code_prompt"] == "chat"

    def build_all_requests(self, **kwargs: Any) -> Any:
        chat = bool(kwargs.get("apply_chat_template"))
        if chat != self.WANTS_CHAT_TEMPLATE:
            log.warning(
                "%s: code_prompt=%s %s --apply_chat_template.",
                self.config.task,
                self.resolved["code_prompt"],
                "expects" if self.WANTS_CHAT_TEMPLATE else "is plain text; run without",
            )
        return super(DistMatchTask, self).build_all_requests(**kwargs)

    def process_results(self, doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
        completions = [str(c) for c in results[0]]
        programs = [
            completion_program(doc, self.config.task, c, self.resolved["code_tests"]) for c in completions
        ]
        outcomes = execute_many(
            programs,
            float(self.resolved["code_timeout"]),
            workers=self.resolved["code_workers"],
            allow=True,  # lm-eval refuses `unsafe_code` tasks unless --confirm_run_unsafe_code was given
        )
        n, c = len(outcomes), sum(r.passed for r in outcomes)
        return {f"pass@{k}": 100.0 * pass_at_k(n, c, k) for k in PASS_AT_K if k <= n}
