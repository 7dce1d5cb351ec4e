# Generated from eval_tasks/nlu/nlu.py by `python tools/generate.py`; do not edit (`--check` compares).
"""Summarizer for ``distmatch_nlu_topk_ppl``: per-task accuracy, MMLU (mean of its 57 subjects, OpenCompass's usual
MMLU number) and ``distmatch_nlu`` = the unweighted mean of the 8 task accuracies (the EMO paper's average)."""

from mmengine.config import read_base

with read_base():
    from ..datasets.distmatch.distmatch_mmlu_ppl import distmatch_mmlu_subjects as _subjects

_icl = [
    "distmatch_tweet_emotion",
    "distmatch_sst2",
    "distmatch_trec",
    "distmatch_subj",
    "distmatch_cr",
    "distmatch_rt",
    "distmatch_ag_news",
]

summarizer = dict(
    dataset_abbrs=["distmatch_nlu", *_icl, "distmatch_mmlu"],
    summary_groups=[
        dict(name="distmatch_mmlu", subsets=[f"distmatch_mmlu_{s}" for s in _subjects]),
        dict(name="distmatch_nlu", subsets=[*_icl, "distmatch_mmlu"]),
    ],
)
