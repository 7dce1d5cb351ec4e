"""lm-eval task classes and dataset loaders of the distmatch tasks (the YAMLs in this folder point here).

Task options come from the task metadata, i.e. lm-eval's ``--metadata '{...}'`` JSON (which also receives the
``--model_args``); some also from environment variables. Unset options take the protocol's values. The valid keys
and their ranges are the table ``options.TASK_OPTIONS``: unknown keys and out-of-range values are refused there.

| option | env | default | tasks |
|---|---|---|---|
| ``retriever_model`` | ``DISTMATCH_RETRIEVER_MODEL`` | ``sentence-transformers/all-mpnet-base-v2`` | NLU (retrieval) |
| ``template`` | | ``paper`` (or ``emo_code``) | NLU (retrieval) |
| ``ice_num`` | | 8 | NLU (retrieval) |
| ``retriever_device`` / ``retriever_batch_size`` | | auto / 64 | NLU (retrieval) |
| ``cache_dir`` (``false`` = no cache) | ``DISTMATCH_EVAL_CACHE`` | ``~/.cache/distmatch/retrieval`` | NLU (retrieval) |
| ``data_dir`` | ``DISTMATCH_EVAL_DATA_DIR`` | Hub datasets | NLU, MMLU, IFEval |
| ``num_samples`` | | 16 | creative writing |
| ``prompts_file`` | | the packaged GEM prompts | creative writing |
| ``sbert_model`` | | ``eval_tasks.metrics`` default | creative writing |
| ``gem_compat`` | | false | creative writing (Self-BLEU as GEM computed it) |
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from eval_tasks import require_lm_eval

require_lm_eval()

from lm_eval.api.task import ConfigurableTask  # noqa: E402

from eval_tasks import data  # noqa: E402
from eval_tasks.creative import creative_documents, diversity_scores  # noqa: E402
from eval_tasks.lm_eval_tasks.options import check_task_options  # noqa: E402
from eval_tasks.retrieval import RETRIEVER_ENV  # noqa: E402

__all__ = [
    "DistMatchTask",
    "DiversityTask",
    "ICLTask",
    "IFEvalTask",
    "MMLUTask",
    "load_creative_dataset",
    "load_icl_dataset",
    "load_ifeval_dataset",
    "load_mmlu_dataset",
]

log = logging.getLogger("lm_eval.distmatch")
_OFF = ("0", "false", "no", "off")


def _flag(value: Any) -> bool:
    return str(value).strip().lower() not in ("", *_OFF, "none")


def _dataset_dict(docs: list[dict[str, Any]] | Any) -> Any:
    import datasets

    test = docs if isinstance(docs, datasets.Dataset) else datasets.Dataset.from_list(docs)
    return datasets.DatasetDict({"test": test})


# ---------------------------------------------------------------------------------------------------------
# Dataset loaders (`custom_dataset`: called as fn(**metadata, **dataset_kwargs))


def load_icl_dataset(distmatch_task: str, **options: Any) -> Any:
    """Test documents of one retrieval task with demonstrations and per-label full prompts baked in."""
    cache = data.option(options, "cache_dir")
    docs, info = data.icl_documents(
        distmatch_task,
        template=str(data.option(options, "template", default="paper")),
        retriever_model=data.option(options, "retriever_model", RETRIEVER_ENV),
        ice_num=int(data.option(options, "ice_num", default=8)),
        data_dir=data.option(options, "data_dir", data.DATA_DIR_ENV),
        cache_dir=False if cache is not None and not _flag(cache) else cache,
        device=data.option(options, "retriever_device"),
        batch_size=int(data.option(options, "retriever_batch_size", default=64)),
    )
    log.info(
        "distmatch_%s: %d test docs, %d demonstrations each retrieved with %s (%s template); retrieval %s %s",
        distmatch_task,
        len(docs),
        info["k"],
        info["encoder"],
        info["template"],
        "read from" if info["cached"] else "written to",
        info["cache_file"],
    )
    counts = _token_counts([p for doc in docs for p in doc["full_prompts"]], options, distmatch_task)
    position = 0
    for doc in docs:
        n = len(doc["full_prompts"])
        doc["token_counts"] = counts[position : position + n] if counts else []
        position += n
    return _dataset_dict(docs)


_TOKENIZERS: dict[tuple[str, str | None], Any] = {}


def _token_counts(texts: list[str], options: Mapping[str, Any], task: str) -> list[int] | None:
    """Tokens of each full prompt under the evaluated model's tokenizer (``tokenizer`` / ``pretrained`` model arg).

    These are the tokens lm-eval scores for an empty context (the whole prompt after a BOS/EOS prefix), so
    log-likelihood / count is the mean token log-probability that OpenICL's PPL inferencer ranks by (``acc_ppl``).
    """
    name = options.get("tokenizer") or options.get("pretrained")
    if not isinstance(name, str) or not name:
        log.warning("distmatch_%s: no tokenizer name in the model args; acc_ppl will be NaN.", task)
        return None
    key = (name, options.get("revision"))
    try:
        if key not in _TOKENIZERS:
            from transformers import AutoTokenizer

            _TOKENIZERS[key] = AutoTokenizer.from_pretrained(
                name,
                revision=options.get("revision") or None,
                trust_remote_code=_flag(options.get("trust_remote_code")),
            )
        encoded = _TOKENIZERS[key](texts, add_special_tokens=False)["input_ids"]
    except Exception as err:  # a non-HF model: no per-token metric, everything else unchanged
        log.warning("distmatch_%s: cannot load tokenizer %r (%s); acc_ppl will be NaN.", task, name, err)
        return None
    return [len(ids) for ids in encoded]


def load_mmlu_dataset(**options: Any) -> Any:
    return _dataset_dict(data.mmlu_documents(data_dir=data.option(options, "data_dir", data.DATA_DIR_ENV)))


def load_ifeval_dataset(**options: Any) -> Any:
    data.ensure_punkt_tab()
    return _dataset_dict(data.ifeval_documents(data_dir=data.option(options, "data_dir", data.DATA_DIR_ENV)))


def load_creative_dataset(distmatch_task: str, **options: Any) -> Any:
    return _dataset_dict(creative_documents(distmatch_task, data.option(options, "prompts_file")))


# ---------------------------------------------------------------------------------------------------------
# Metrics


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def icl_process_results(doc: Mapping[str, Any], results: list[tuple[float, bool]]) -> dict[str, float]:
    """``acc``: the label whose whole prompt is most likely (total log-likelihood); ``acc_norm``: per character;
    ``acc_ppl``: per token, i.e. lowest perplexity (OpenICL / OpenCompass PPL inferencer; NaN without a tokenizer)."""
    lls = [ll for ll, _ in results]
    gold = int(doc["label"])
    prompts, counts = doc["full_prompts"], doc.get("token_counts") or []
    per_token = (
        float(_argmax([ll / max(n, 1) for ll, n in zip(lls, counts)]) == gold) if counts else float("nan")
    )
    return {
        "acc": float(_argmax(lls) == gold),
        "acc_norm": float(_argmax([ll / len(p) for ll, p in zip(lls, prompts)]) == gold),
        "acc_ppl": per_token,
    }


def mmlu_process_results(doc: Mapping[str, Any], results: list[tuple[float, bool]]) -> dict[str, Any]:
    """``acc``; ``acc_ppl`` equals it (the candidates share the context and are one token each, so the lowest
    whole-prompt perplexity is the most likely letter); ``acc_subject_macro``: mean of per-subject accuracies."""
    lls = [ll for ll, _ in results]
    correct = float(_argmax(lls) == int(doc["answer"]))
    return {"acc": correct, "acc_ppl": correct, "acc_subject_macro": (doc["subject"], correct)}


def subject_macro_mean(items: list[tuple[str, float]]) -> float:
    """Mean over subjects of the per-subject accuracy (OpenCompass's naive average of the 57 MMLU subsets)."""
    per_subject: dict[str, list[float]] = {}
    for subject, value in items:
        per_subject.setdefault(subject, []).append(value)
    return sum(sum(v) / len(v) for v in per_subject.values()) / len(per_subject)


def _ifeval_utils() -> Any:
    data.ensure_punkt_tab()  # before lm-eval's instructions_util tries nltk.download at import
    from lm_eval.tasks.ifeval import utils

    return utils


def ifeval_process_results(doc: Mapping[str, Any], results: list[str]) -> dict[str, Any]:
    return _ifeval_utils().process_results(doc, results)


def agg_inst_level_acc(items: list[list[bool]]) -> float:
    return _ifeval_utils().agg_inst_level_acc(items)


def diversity_process_results(doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
    """Default options; the task class passes its metadata options (see :class:`DiversityTask`)."""
    return diversity_scores(list(results[0]))


# ---------------------------------------------------------------------------------------------------------
# Task classes (`class: !function utils.X` in the YAMLs; lm-eval calls X(config=<YAML as dict>))


class DistMatchTask(ConfigurableTask):
    """``ConfigurableTask`` built from our YAML, plus metadata-driven overrides and chat-template advice."""

    #: True: the papers ran this task with the model's chat template; False: they did not; None: no advice.
    WANTS_CHAT_TEMPLATE: bool | None = None

    def __init__(self, config: Mapping[str, Any] | None = None, **_: Any) -> None:
        config = dict(config or {})
        config.pop("class", None)
        self.options: dict[str, Any] = dict(config.get("metadata") or {})
        check_task_options(self.options)  # again here for Python-API users (the hook checks before the model)
        self.prepare_config(config)
        super().__init__(config=config)

    def prepare_config(self, config: dict[str, Any]) -> None:
        """Adjust the YAML config from the options before lm-eval builds the task."""

    def build_all_requests(self, **kwargs: Any) -> Any:
        chat = bool(kwargs.get("apply_chat_template"))
        if self.WANTS_CHAT_TEMPLATE is True and not chat:
            log.warning(
                "%s: the GEM paper ran this task with the model's chat template; pass --apply_chat_template "
                "for chat/instruction-tuned models.",
                self.config.task,
            )
        elif self.WANTS_CHAT_TEMPLATE is False and chat:
            log.warning(
                "%s: --apply_chat_template wraps the demonstrations in a chat turn; the EMO protocol scores the "
                "plain prompt (run these tasks without it).",
                self.config.task,
            )
        return super().build_all_requests(**kwargs)


class ICLTask(DistMatchTask):
    """A retrieval task: empty context, one full prompt per label, scored by its total log-likelihood."""

    WANTS_CHAT_TEMPLATE = False


class MMLUTask(DistMatchTask):
    WANTS_CHAT_TEMPLATE = False


class IFEvalTask(DistMatchTask):
    WANTS_CHAT_TEMPLATE = True


class DiversityTask(DistMatchTask):
    """K samples per prompt (``repeats``), all kept (``take_first_k``), scored together per prompt.

    Options: ``num_samples`` (default 16: ``repeats`` and the filter follow it), ``sbert_model``, ``gem_compat``.
    """

    WANTS_CHAT_TEMPLATE = True

    def prepare_config(self, config: dict[str, Any]) -> None:
        samples = self.options.get("num_samples")
        if samples is not None:
            k = int(samples)
            if k < 2:
                raise ValueError(
                    f"{config.get('task')}: num_samples must be >= 2 (diversity compares samples), got {k}."
                )
            config["repeats"] = k
            config["filter_list"] = [{"name": "none", "filter": [{"function": "take_first_k", "k": k}]}]

    def process_results(self, doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, float]:
        return diversity_scores(
            list(results[0]),
            sbert_model=self.options.get("sbert_model") or None,
            gem_compat=_flag(self.options.get("gem_compat", False)),
        )
