"""OpenCompass dataset classes and evaluators of the distmatch suite (used by ``eval_tasks/opencompass_configs``).

The datasets load exactly what the lm-eval tasks load (:mod:`eval_tasks.dataset_loading`: the same Hub ids, revisions and
splits, or the same local files when ``$DISTMATCH_EVAL_DATA_DIR`` is set); OpenCompass's own ``TopkRetriever``,
``FixKRetriever``, ``PPLInferencer`` and ``GenInferencer`` then build and score the prompts. Their arguments named
like a task option (``data_dir``, ``num_samples``, ``prompts_file``, ``sbert_model``, ``gem_compat``) are resolved
as the lm-eval tasks resolve them (:func:`eval_tasks.task_options.resolve`: the same defaults and variables).

Needs ``opencompass`` (its own venv: ``make .venv-opencompass``); importing this module imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distmatch.optional import require

require("opencompass", extra="opencompass", feature="The distmatch OpenCompass configs")

from datasets import Dataset, DatasetDict  # noqa: E402
from opencompass.datasets.base import BaseDataset  # noqa: E402
from opencompass.datasets.IFEval.ifeval import IFEvaluator  # noqa: E402
from opencompass.openicl.icl_evaluator import BaseEvaluator  # noqa: E402
from opencompass.openicl.icl_retriever import TopkRetriever  # noqa: E402
from opencompass.registry import ICL_EVALUATORS, ICL_RETRIEVERS, LOAD_DATASET  # noqa: E402

from eval_tasks import dataset_loading  # noqa: E402
from eval_tasks.creative.creative import DIVERSITY_METRICS, creative_documents, diversity_scores  # noqa: E402
from eval_tasks.nlu import nlu  # noqa: E402
from eval_tasks.novelty import noveltybench  # noqa: E402
from eval_tasks.task_options import resolve  # noqa: E402

__all__ = [
    "DistMatchCreativeDataset",
    "DistMatchDiversityEvaluator",
    "DistMatchICLDataset",
    "DistMatchIFEvalDataset",
    "DistMatchIFEvaluator",
    "DistMatchMMLUDataset",
    "DistMatchNoveltyDataset",
    "DistMatchNoveltyEvaluator",
    "DistMatchTopkRetriever",
]


def _data_dir(family: str, data_dir: str | None) -> str | None:
    return resolve(family, {"data_dir": data_dir}, "OpenCompass dataset")["data_dir"]


@LOAD_DATASET.register_module()
class DistMatchICLDataset(BaseDataset):
    """``train`` = the demonstration pool (AG News: its first 36,000 rows), ``test`` = the evaluated split."""

    @staticmethod
    def load(task: str, data_dir: str | None = None, **_: Any) -> DatasetDict:
        spec = nlu.get_spec(task)
        if not isinstance(spec, nlu.ClassificationSpec):
            raise ValueError(f"{spec.task} is not a retrieval task; use DistMatchMMLUDataset.")
        where = _data_dir("icl", data_dir)
        columns = [spec.text_field, spec.label_field]
        splits = {"train": spec.pool_split, "test": spec.test_split}
        return DatasetDict(
            {
                name: dataset_loading.load_split(
                    spec.key, spec.path, spec.name, spec.revision, split, where
                ).select_columns(columns)
                for name, split in splits.items()
            }
        )


@ICL_RETRIEVERS.register_module()
class DistMatchTopkRetriever(TopkRetriever):
    """OpenCompass's ``TopkRetriever`` whose GPT-2 decode round trip cleans up tokenization spaces, as OpenICL's did.

    The retriever embeds ``tokenizer.batch_decode(tokenizer(text))``. Under the transformers of the EMO code (4.30)
    that decode cleaned up tokenization spaces (``"is n't"`` -> ``"isn't"``, ``" ,"`` -> ``","``); transformers >= 4.45
    no longer does by default for tokenizers whose config does not say so (``gpt2-xl``'s does not), so the plain
    ``TopkRetriever`` embeds the raw text there. ``clean_up_tokenization_spaces=True`` restores OpenICL's behaviour
    (the lm-eval option ``openicl_round_trip``).
    """

    def __init__(self, *args: Any, clean_up_tokenization_spaces: bool = True, **kwargs: Any) -> None:
        self._clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        super().__init__(*args, **kwargs)

    def create_index(self) -> Any:  # called by __init__ right after the tokenizer is loaded
        self.tokenizer.clean_up_tokenization_spaces = self._clean_up_tokenization_spaces
        return super().create_index()


@LOAD_DATASET.register_module()
class DistMatchMMLUDataset(BaseDataset):
    """One MMLU subject in OpenCompass's MMLU columns: ``input``, ``A``-``D``, ``target`` (a letter); dev = train."""

    @staticmethod
    def load(name: str, data_dir: str | None = None, **_: Any) -> DatasetDict:
        spec, where = nlu.MMLU, _data_dir("mmlu", data_dir)
        out = {}
        for split_name, split in (("dev", spec.shot_split), ("test", spec.test_split)):
            rows = dataset_loading.load_split(spec.key, spec.path, spec.name, spec.revision, split, where)
            rows = rows.filter(lambda row: row["subject"] == name)
            out[split_name] = Dataset.from_list(
                [
                    {
                        "input": row["question"],
                        **{letter: choice for letter, choice in zip(spec.letters, row["choices"])},
                        "target": spec.letters[int(row["answer"])],
                    }
                    for row in rows
                ]
            )
        return DatasetDict(out)


@LOAD_DATASET.register_module()
class DistMatchIFEvalDataset(BaseDataset):
    """google/IFEval (or its local copy) as OpenCompass's IFEval reader expects: ``prompt`` + ``reference``."""

    @staticmethod
    def load(data_dir: str | None = None, **_: Any) -> Dataset:
        rows = dataset_loading.ifeval_documents(data_dir=_data_dir("ifeval", data_dir))
        return Dataset.from_list(
            [
                {
                    "prompt": row["prompt"],
                    "reference": {
                        "key": row["key"],
                        "prompt": row["prompt"],
                        "instruction_id_list": list(row["instruction_id_list"]),
                        "kwargs": [dict(kw or {}) for kw in row["kwargs"]],
                    },
                }
                for row in rows
            ]
        )


@LOAD_DATASET.register_module()
class DistMatchCreativeDataset(BaseDataset):
    """The GEM creative-writing prompts, each repeated `num_samples` times (``prompt_id`` groups the samples)."""

    @staticmethod
    def load(
        kind: str,
        num_samples: int | None = None,
        num_prompts: int | None = None,
        prompts_file: str | None = None,
        **_: Any,
    ) -> Dataset:
        options = {"num_samples": num_samples, "prompts_file": prompts_file}
        resolved = resolve("creative", options, f"distmatch_{kind}_diversity")
        docs = creative_documents(kind, resolved["prompts_file"])
        if num_prompts is not None:
            docs = docs[: int(num_prompts)]
        return Dataset.from_list(
            [
                {"prompt_id": doc["id"], "sample": j, "prompt": doc["prompt"]}
                for doc in docs
                for j in range(resolved["num_samples"])
            ]
        )


@ICL_EVALUATORS.register_module()
class DistMatchDiversityEvaluator(BaseEvaluator):
    """Groups the generations by ``prompt_id`` (the reference column) and scores each group with the three GEM
    diversity metrics of :mod:`eval_tasks.metrics` (0-100); reports the mean over prompts."""

    def __init__(self, sbert_model: str | None = None, gem_compat: bool | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        options = {"sbert_model": sbert_model, "gem_compat": gem_compat}
        resolved = resolve("creative", options, "DistMatchDiversityEvaluator")
        self.sbert_model = resolved["sbert_model"]
        self.gem_compat = resolved["gem_compat"]

    def score(self, predictions: Sequence[str], references: Sequence[Any]) -> dict[str, Any]:
        groups: dict[Any, list[str]] = {}
        for prediction, prompt_id in zip(predictions, references, strict=True):
            groups.setdefault(prompt_id, []).append(str(prediction))
        per_prompt = [
            diversity_scores(samples, sbert_model=self.sbert_model, gem_compat=self.gem_compat)
            for samples in groups.values()
        ]
        result: dict[str, Any] = {
            key: sum(s[key] for s in per_prompt) / len(per_prompt) for key in DIVERSITY_METRICS
        }
        result["num_prompts"] = len(per_prompt)
        result["samples_per_prompt"] = min(len(g) for g in groups.values())
        return result


@LOAD_DATASET.register_module()
class DistMatchNoveltyDataset(BaseDataset):
    """NoveltyBench's prompts (``curated`` / ``wildchat``), each repeated `num_samples` times (10); the reference
    column is the prompt itself, which the evaluator groups by and gives the reward model."""

    @staticmethod
    def load(
        subset: str, num_samples: int | None = None, prompts_file: str | None = None, **_: Any
    ) -> Dataset:
        options = {"num_samples": num_samples, "prompts_file": prompts_file}
        resolved = resolve("novelty", options, f"distmatch_noveltybench_{subset}")
        docs = noveltybench.novelty_documents(subset, resolved["prompts_file"])
        return Dataset.from_list(
            [
                {"prompt_id": doc["id"], "sample": j, "prompt": doc["prompt"]}
                for doc in docs
                for j in range(resolved["num_samples"])
            ]
        )


@ICL_EVALUATORS.register_module()
class DistMatchNoveltyEvaluator(BaseEvaluator):
    """Groups the generations by prompt (in generation order) and reports NoveltyBench's ``distinct`` and
    ``utility`` (:mod:`eval_tasks.novelty`), GEM's n-gram / Self-BLEU diversity beside them, and the setting
    (``comparable`` with the published numbers or not)."""

    def __init__(
        self,
        classifier: str | None = None,
        reward_model: str | None = None,
        scorer_device: str | None = None,
        reward_batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        options = {"classifier": classifier, "reward_model": reward_model, "scorer_device": scorer_device}
        self.resolved = resolve(
            "novelty", {**options, "reward_batch_size": reward_batch_size}, "NoveltyBench"
        )

    def score(self, predictions: Sequence[str], references: Sequence[Any]) -> dict[str, Any]:
        from eval_tasks.novelty.scorers import load_scorer

        r = self.resolved
        scorer = load_scorer(
            r["classifier"], r["reward_model"], device=r["scorer_device"], batch_size=r["reward_batch_size"]
        )
        groups: dict[str, list[str]] = {}
        for prediction, prompt in zip(predictions, references, strict=True):
            groups.setdefault(str(prompt), []).append(str(prediction))
        per_prompt = [
            {**scorer.score(prompt, samples), **noveltybench.gem_diversity(samples)}
            for prompt, samples in groups.items()
        ]
        keys = (*noveltybench.NOVELTY_METRICS, *noveltybench.GEM_METRICS)
        result: dict[str, Any] = {k: sum(p[k] for p in per_prompt) / len(per_prompt) for k in keys}
        k = min(len(g) for g in groups.values())
        result.update(num_prompts=len(per_prompt), samples_per_prompt=k)
        # a partial range of the prompts (OpenCompass's `test_range`) or a prompts file of others: not comparable
        _, prompts = noveltybench.prompt_set_note(list(groups))
        result["setting"] = noveltybench.comparability(r["classifier"], r["reward_model"], k, prompts)
        return result


@ICL_EVALUATORS.register_module()
class DistMatchIFEvaluator(IFEvaluator):
    """OpenCompass's IFEval scorer, with NLTK's ``punkt_tab`` made available offline first."""

    def score(
        self, predictions: Sequence[str], references: Sequence[Any], origin_prompt: Sequence[Any]
    ) -> dict:
        dataset_loading.ensure_punkt_tab()
        return super().score(predictions, references, origin_prompt)
