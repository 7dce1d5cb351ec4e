"""The lm-eval task classes, loader and metric of GEM's creative-writing diversity (the YAMLs beside this module
reference them through ``utils.py``). Options: :mod:`eval_tasks.lm_eval_tasks.task_base`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval_tasks.creative.creative import creative_documents, diversity_scores
from eval_tasks.lm_eval_tasks.task_base import DistMatchTask, dataset_dict, log
from eval_tasks.task_options import resolve

__all__ = ["DiversityTask", "diversity_process_results", "load_creative_dataset"]


def load_creative_dataset(distmatch_task: str, **options: Any) -> Any:
    prompts_file = resolve("creative", options, f"distmatch_{distmatch_task}_diversity")["prompts_file"]
    return dataset_dict(creative_documents(distmatch_task, prompts_file))


def diversity_process_results(doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
    """Default options; the task class passes its metadata options (see :class:`DiversityTask`)."""
    return diversity_scores(list(results[0]))


class DiversityTask(DistMatchTask):
    """K samples per prompt (``repeats``), all kept (``take_first_k``), scored together per prompt.

    Options: ``num_samples`` (default 16: ``repeats`` and the filter follow it), ``sbert_model``, ``gem_compat``,
    ``scoring`` (``prompt+response``: each sample is scored after the prompt exactly as the model saw it, chat
    template included, as GEM's script did), and ``protocol: gem_official`` for all of GEM's settings. The paper's
    Sentence-BERT model (``sbert_model: paper``) is loaded when the task is built; if it cannot be loaded, the
    offline default is used with a warning and the metadata records it (``sbert_model`` = the model used).
    """

    WANTS_CHAT_TEMPLATE = True
    FAMILY = "creative"

    def prepare_config(self, config: dict[str, Any]) -> None:
        # The sample count (>= 2: check_task_options refused fewer) sets the repeats and the filter.
        k = self.resolved["num_samples"]
        config["repeats"] = k
        config["filter_list"] = [{"name": "none", "filter": [{"function": "take_first_k", "k": k}]}]
        self._contexts: dict[Any, str] = {}
        self._sbert = self.resolved["sbert_model"] or None
        if self._sbert is not None and str(self._sbert).lower() in (
            "paper",
            "gem",
            "bert-large-nli-stsb-mean-tokens",
        ):
            from eval_tasks.metrics import GEM_SBERT_MODEL, load_sbert

            try:
                load_sbert(GEM_SBERT_MODEL)
                self._sbert = GEM_SBERT_MODEL
            except (ValueError, ImportError) as err:
                log.warning(
                    "%s: the GEM paper's Sentence-BERT model cannot be loaded, so sbert_diversity uses the offline "
                    "default (not comparable with GEM's Table 2). %s",
                    config.get("task"),
                    err,
                )
                self._sbert = None
            # Record the model actually used (None = the offline default) in the results file.
            config["metadata"]["sbert_model"] = self._sbert or "default"
            self.options["sbert_model"] = config["metadata"]["sbert_model"]

    def _context(self, doc: Mapping[str, Any]) -> str:
        """The prompt of `doc` as the model saw it (chat template included when lm-eval applied one): the context
        of its request (also when lm-eval restored the requests from its cache)."""
        if not self._contexts:
            for instance in self.instances:
                self._contexts[instance.doc.get("id")] = str(instance.arguments[0])
        try:
            return self._contexts[doc.get("id")]
        except KeyError:
            raise RuntimeError(f"{self.config.task}: no request for prompt {doc.get('id')!r}.") from None

    def process_results(self, doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
        samples = [str(s) for s in results[0]]
        return diversity_scores(
            samples,
            prefix=self._context(doc) if self.resolved.get("scoring") == "prompt+response" else "",
            sbert_model=None if self._sbert in (None, "default") else self._sbert,
            gem_compat=bool(self.resolved.get("gem_compat")),
        )
