"""lm-eval task classes and dataset loaders of the distmatch tasks (the YAMLs in this folder point here).

Task options come from the task metadata, i.e. lm-eval's ``--metadata '{...}'`` JSON (which also receives the
``--model_args``); some also from environment variables. Every option, its default and valid values are in one
table, :data:`eval_tasks.task_options.TASK_OPTIONS` (the keys the pre-flight check of
:mod:`eval_tasks.lm_eval_tasks.preflight` accepts, unknown keys and out-of-range values refused there);
``protocol`` (``emo_official``, ``gem_official``) selects a paper's published protocol as a preset of several
options (:data:`eval_tasks.task_options.PROTOCOLS`). Each task class and loader reads its family's options through
:func:`eval_tasks.task_options.resolve` (explicit > environment variable > protocol > default); the task class
writes the protocol-relevant values back into its metadata, which lm-eval records in the results file.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from eval_tasks import require_lm_eval

require_lm_eval()

from lm_eval.api.task import ConfigurableTask  # noqa: E402

from eval_tasks import dataset_loading  # noqa: E402
from eval_tasks.creative import creative_documents, diversity_scores  # noqa: E402
from eval_tasks.task_options import (  # noqa: E402
    check_task_options,
    protocol_differences,
    recorded_options,
    resolve,
)

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
    task = f"distmatch_{distmatch_task}"
    resolved = resolve("icl", options, task)
    docs, info = dataset_loading.icl_documents(
        distmatch_task,
        template=resolved["template"],
        retriever_model=resolved["retriever_model"],
        ice_num=resolved["ice_num"],
        data_dir=resolved["data_dir"],
        cache_dir=resolved["cache_dir"],
        device=resolved["retriever_device"],
        batch_size=resolved["retriever_batch_size"],
        openicl_round_trip=resolved["openicl_round_trip"],
    )
    log.info(
        "%s: %d test docs, %d demonstrations each retrieved with %s (%s template%s); retrieval %s %s",
        task,
        len(docs),
        info["k"],
        info["encoder"],
        info["template"],
        ", OpenICL text round trip" if info["openicl_round_trip"] else "",
        "read from" if info["cached"] else "written to",
        info["cache_file"],
    )
    counts = _token_counts([p for doc in docs for p in doc["full_prompts"]], options, task)
    position = 0
    for doc in docs:
        n = len(doc["full_prompts"])
        doc["token_counts"] = counts["tokens"][position : position + n] if counts else []
        doc["token_counts_openicl"] = counts["openicl"][position : position + n] if counts else []
        doc["ppl_norm"] = resolved["ppl_norm"]
        position += n
    return _dataset_dict(docs)


_TOKENIZERS: dict[tuple[str, str | None], Any] = {}


def openicl_token_count(input_ids: list[int], eos_token_id: int | None) -> int:
    """The length OpenICL's PPL inferencer divides a prompt's summed token CE by.

    OpenICL tokenises the prompt with the tokenizer's special tokens (LLaMA: a BOS in front), pads with EOS and
    counts the non-padding positions, so the count is the special-token-encoded length without EOS tokens:
    n + 1 for LLaMA's n text tokens.
    """
    return sum(1 for token in input_ids if token != eos_token_id)


def _token_counts(texts: list[str], options: Mapping[str, Any], task: str) -> dict[str, list[int]] | None:
    """Token counts of each full prompt under the evaluated model's tokenizer (``tokenizer`` / ``pretrained``).

    ``tokens``: the tokens lm-eval scores for an empty context (the whole prompt after a BOS/EOS prefix), so
    log-likelihood / count is the mean token log-probability (``acc_ppl``, ``ppl_norm: tokens``). ``openicl``:
    the count OpenICL's PPL inferencer divides by (:func:`openicl_token_count`, ``ppl_norm: openicl``).
    """
    name = options.get("tokenizer") or options.get("pretrained")
    if not isinstance(name, str) or not name:
        log.warning("%s: no tokenizer name in the model args; acc_ppl will be NaN.", task)
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
        tokenizer = _TOKENIZERS[key]
        plain = tokenizer(texts, add_special_tokens=False)["input_ids"]
        special = tokenizer(texts, add_special_tokens=True)["input_ids"]
    except Exception as err:  # a non-HF model: no per-token metric, everything else unchanged
        log.warning("%s: cannot load tokenizer %r (%s); acc_ppl will be NaN.", task, name, err)
        return None
    return {
        "tokens": [len(ids) for ids in plain],
        "openicl": [openicl_token_count(ids, tokenizer.eos_token_id) for ids in special],
    }


def load_mmlu_dataset(**options: Any) -> Any:
    data_dir = resolve("mmlu", options, "distmatch_mmlu")["data_dir"]
    return _dataset_dict(dataset_loading.mmlu_documents(data_dir=data_dir))


def load_ifeval_dataset(**options: Any) -> Any:
    dataset_loading.ensure_punkt_tab()
    data_dir = resolve("ifeval", options, "distmatch_ifeval")["data_dir"]
    return _dataset_dict(dataset_loading.ifeval_documents(data_dir=data_dir))


def load_creative_dataset(distmatch_task: str, **options: Any) -> Any:
    prompts_file = resolve("creative", options, f"distmatch_{distmatch_task}_diversity")["prompts_file"]
    return _dataset_dict(creative_documents(distmatch_task, prompts_file))


# ---------------------------------------------------------------------------------------------------------
# Metrics


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def icl_process_results(doc: Mapping[str, Any], results: list[tuple[float, bool]]) -> dict[str, float]:
    """``acc``: the label whose whole prompt is most likely (total log-likelihood); ``acc_norm``: per character;
    ``acc_ppl``: per token, i.e. lowest perplexity (OpenICL / OpenCompass PPL inferencer; NaN without a tokenizer),
    dividing by the token count (``ppl_norm: tokens``) or by OpenICL's count with special tokens (``openicl``)."""
    lls = [ll for ll, _ in results]
    gold = int(doc["label"])
    prompts = doc["full_prompts"]
    norm = doc.get("ppl_norm") or "tokens"
    counts = (doc.get("token_counts_openicl") if norm == "openicl" else doc.get("token_counts")) or []
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
    whole-prompt perplexity is the most likely letter); ``acc_subject_macro``: mean of per-subject accuracies.
    (With ``mmlu_average: subject_macro`` the task class aggregates ``acc`` / ``acc_ppl`` per subject too.)"""
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
    dataset_loading.ensure_punkt_tab()  # before lm-eval's instructions_util tries nltk.download at import
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
    #: The task family (:data:`eval_tasks.task_options.FAMILIES`): which options and protocols apply.
    FAMILY: str = ""

    def __init__(self, config: Mapping[str, Any] | None = None, **_: Any) -> None:
        config = dict(config or {})
        config.pop("class", None)
        self.options: dict[str, Any] = dict(config.get("metadata") or {})
        check_task_options(self.options)  # again here for Python-API users (the hook checks before the model)
        task = str(config.get("task") or type(self).__name__)
        # Explicit options > environment variable > protocol preset > defaults; the protocol-relevant values go back
        # into the metadata, so the dataset loader sees them and lm-eval's results file (`configs`) records them.
        self.resolved: dict[str, Any] = resolve(self.FAMILY, self.options, task) if self.FAMILY else {}
        self.options.update(recorded_options(self.resolved))
        config["metadata"] = dict(self.options)
        self.prepare_config(config)
        super().__init__(config=config)
        protocol = self.resolved.get("protocol", "default")
        if protocol != "default":
            differences = protocol_differences(protocol, self.resolved)
            log.info(
                "%s: protocol %s%s",
                task,
                protocol,
                (" with overrides: " + "; ".join(differences)) if differences else "",
            )

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
    FAMILY = "icl"

    def prepare_config(self, config: dict[str, Any]) -> None:
        # Record the encoder (option, else its environment variable, else the protocol's) in the results file.
        encoder = self.resolved["retriever_model"]
        config["metadata"]["retriever_model"] = self.options["retriever_model"] = str(encoder)


class MMLUTask(DistMatchTask):
    """MMLU in one task. ``mmlu_average: subject_macro`` makes ``acc`` / ``acc_ppl`` the mean of the per-subject
    accuracies (OpenCompass's MMLU number), so the ``distmatch_nlu`` 8-task mean uses it."""

    WANTS_CHAT_TEMPLATE = False
    FAMILY = "mmlu"
    _MACRO = ("acc", "acc_ppl")

    @property
    def _subject_macro(self) -> bool:
        return self.resolved.get("mmlu_average") == "subject_macro"

    def process_results(self, doc: Mapping[str, Any], results: list[tuple[float, bool]]) -> dict[str, Any]:
        out = mmlu_process_results(doc, results)
        if self._subject_macro:
            for name in self._MACRO:
                out[name] = (doc["subject"], out[name])
        return out

    def aggregation(self) -> dict[str, Any]:
        aggregations = dict(super().aggregation())
        if self._subject_macro:
            for name in self._MACRO:
                aggregations[name] = subject_macro_mean
        return aggregations


class IFEvalTask(DistMatchTask):
    WANTS_CHAT_TEMPLATE = True
    FAMILY = "ifeval"


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
