"""The lm-eval task classes, loaders and metrics of EMO's in-context NLU suite and MMLU (the YAMLs beside this
module reference them through ``utils.py``). Options: :mod:`eval_tasks.lm_eval_tasks.task_base`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eval_tasks import dataset_loading
from eval_tasks.lm_eval_tasks.task_base import DistMatchTask, dataset_dict, log
from eval_tasks.task_options import resolve

__all__ = [
    "ICLTask",
    "MMLUTask",
    "icl_process_results",
    "load_icl_dataset",
    "load_mmlu_dataset",
    "mmlu_process_results",
    "openicl_token_count",
    "subject_macro_mean",
]

_OFF = ("0", "false", "no", "off")


def _flag(value: Any) -> bool:
    return str(value).strip().lower() not in ("", *_OFF, "none")


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
    return dataset_dict(docs)


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
    return dataset_dict(dataset_loading.mmlu_documents(data_dir=data_dir))


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


# ---------------------------------------------------------------------------------------------------------
# Task classes (`class: !function utils.X` in the YAMLs; lm-eval calls X(config=<YAML as dict>))


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
