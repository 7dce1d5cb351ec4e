"""lm-eval task class, loader and corpus-level aggregations of ``distmatch_open_ended`` (EMO Tables 1-2; the YAMLs
point here through ``utils.py``).

Each document is a kept test row of one corpus (:mod:`eval_tasks.open_ended`): the prefix is the request, the
human text P the reference. Five samples per prefix (``repeats``: the script's five sampling rounds), ancestral
(top-k 0, top-p 1, temperature 1) with the length forced (``min_new_tokens`` L, ``max_gen_toks`` L + 1). MAUVE
(x100) is computed per round over all documents (P against Q = prefix + " " + sample r) and averaged over the
rounds; ROUGE-1 / ROUGE-L are averaged per document; ``oracle_ppl`` (with ``oracle_model``) is the oracle's
perplexity of each round's model texts, averaged over the rounds. Training seeds are separate runs
(``distmatch-eval open-ended score`` averages several).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eval_tasks.lm_eval_tasks.task_base import DistMatchTask, dataset_dict
from eval_tasks.open_ended import open_ended as O
from eval_tasks.open_ended.open_ended import EMO_MAX_TEXT_LENGTH, ROUNDS, oracle_perplexity, rouge_f
from eval_tasks.samples import InputError
from eval_tasks.task_options import resolve

__all__ = ["OpenEndedTask", "load_open_ended_dataset", "mauve_rounds", "oracle_ppl_rounds"]

_EXTENSIONS = ("parquet", "jsonl", "json", "txt", "raw")
#: each generation backend's name for the minimum number of new tokens (task option generation_backend)
MIN_LENGTH_ARGUMENT = {"hf": "min_new_tokens", "vllm": "min_tokens"}


def corpus_file(key: str, data_dir: str | None) -> Path | None:
    """``<data_dir>/<corpus>/test.<parquet|jsonl|json|txt|raw>`` (None without a data folder: the Hub copy)."""
    if not data_dir:
        return None
    folder = Path(data_dir).expanduser() / key
    for ext in _EXTENSIONS:
        if (folder / f"test.{ext}").is_file():
            return folder / f"test.{ext}"
    raise InputError(
        f"data_dir: no {folder}/test.<{'|'.join(_EXTENSIONS)}> for the {O.corpus(key).title} task."
    )


def load_open_ended_dataset(distmatch_task: str, **options: Any) -> Any:
    spec = O.corpus(distmatch_task)
    data_dir = resolve("open_ended", options, f"distmatch_open_ended_{spec.key}")["data_dir"]
    examples = O.build_examples(O.read_corpus(spec.key, corpus_file(spec.key, data_dir)), spec)
    docs = [{"id": f"{spec.key}-{e.row}", "prefix": e.prefix, "reference": e.reference} for e in examples]
    return dataset_dict(docs)


def _by_round(items: Sequence[Sequence[Any]]) -> list[list[str]]:
    rounds = len(items[0][1])
    return [[str(item[1][r]) for item in items] for r in range(rounds)]


def mauve_rounds(items: Sequence[Sequence[Any]]) -> float:
    """Mean over rounds of MAUVE(all references, all round-r model texts); item = (P, [Q per round], featurizer)."""
    from eval_tasks.metrics.mauve import mauve_score, text_features

    featurizer = items[0][2]
    refs = [str(item[0]) for item in items]
    p_features = text_features(refs, featurizer, max_length=EMO_MAX_TEXT_LENGTH)
    scores = [
        mauve_score(
            None, texts, featurizer=featurizer, p_features=p_features, max_text_length=EMO_MAX_TEXT_LENGTH
        )["mauve"]
        for texts in _by_round(items)
    ]
    return statistics.fmean(scores)


def oracle_ppl_rounds(items: Sequence[Sequence[Any]]) -> float:
    """Mean over rounds of the oracle's perplexity of the round's model texts (``compute_ppl``, document order);
    item = (None, [Q per round], oracle model)."""
    oracle = items[0][2]
    return statistics.fmean(oracle_perplexity(texts, oracle) for texts in _by_round(items))


class OpenEndedTask(DistMatchTask):
    """One corpus of EMO's open-ended generation benchmark."""

    WANTS_CHAT_TEMPLATE = False
    FAMILY = "open_ended"

    def prepare_config(self, config: dict[str, Any]) -> None:
        self.spec = O.corpus(str((config.get("dataset_kwargs") or {}).get("distmatch_task")))
        gen = dict(config.get("generation_kwargs") or {})
        for name in MIN_LENGTH_ARGUMENT.values():
            gen.pop(name, None)
        # the backend's own name for the minimum: HF generate's min_new_tokens, vLLM SamplingParams' min_tokens
        gen[MIN_LENGTH_ARGUMENT[self.resolved["generation_backend"]]] = self.spec.new_tokens
        gen["max_gen_toks"] = self.spec.new_tokens + 1
        config["generation_kwargs"] = gen
        config["repeats"] = ROUNDS
        config["filter_list"] = [{"name": "none", "filter": [{"function": "take_first_k", "k": ROUNDS}]}]
        metrics = [
            {"metric": "mauve", "aggregation": mauve_rounds, "higher_is_better": True},
            {"metric": "rouge1", "aggregation": "mean", "higher_is_better": True},
            {"metric": "rougeL", "aggregation": "mean", "higher_is_better": True},
        ]
        if self.resolved.get("oracle_model"):
            metrics.append(
                {"metric": "oracle_ppl", "aggregation": oracle_ppl_rounds, "higher_is_better": False}
            )
        config["metric_list"] = metrics
        config["metadata"]["mauve_featurizer"] = str(self.resolved["mauve_featurizer"])

    def process_results(self, doc: Mapping[str, Any], results: list[list[str]]) -> dict[str, Any]:
        texts = [O.model_text(str(doc["prefix"]), str(s)) for s in results[0]]
        reference = str(doc["reference"])
        rouge = rouge_f(texts, [reference] * len(texts))
        out: dict[str, Any] = {
            "mauve": (reference, texts, str(self.resolved["mauve_featurizer"])),
            "rouge1": rouge["rouge1"],
            "rougeL": rouge["rougeL"],
        }
        if self.resolved.get("oracle_model"):
            out["oracle_ppl"] = (None, texts, str(self.resolved["oracle_model"]))
        return out
