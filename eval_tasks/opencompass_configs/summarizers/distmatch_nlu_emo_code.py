# Generated from eval_tasks/nlu/nlu.py by `python tools/generate.py`; do not edit (`--check` compares).
"""Summarizer for ``distmatch_nlu_emo_code_topk_ppl`` (the EMO paper's Table 3 protocol in OpenCompass).

OpenCompass's ``TopkRetriever`` (OpenICL's, with its GPT-2 text round trip before embedding) and ``PPLInferencer``
(OpenICL's mean over the prompt's tokens counted with the tokenizer's special tokens) already are the EMO
protocol; with the EMO repository's templates (the ``_emo_code`` datasets) this summary is the counterpart of the
lm-eval group ``distmatch_nlu`` run with ``--metadata '{"protocol": "emo_official"}'``: per-task accuracy, MMLU as
the mean of its 57 subjects, and ``distmatch_nlu_emo_code`` = the unweighted mean of the 8 task accuracies.
"""

from mmengine.config import read_base

with read_base():
    from ..datasets.distmatch.distmatch_mmlu_ppl import distmatch_mmlu_subjects as _subjects

_icl = [
    "distmatch_tweet_emotion_emo_code",
    "distmatch_sst2_emo_code",
    "distmatch_trec_emo_code",
    "distmatch_subj_emo_code",
    "distmatch_cr_emo_code",
    "distmatch_rt_emo_code",
    "distmatch_ag_news_emo_code",
]

summarizer = dict(
    dataset_abbrs=["distmatch_nlu_emo_code", *_icl, "distmatch_mmlu"],
    summary_groups=[
        dict(name="distmatch_mmlu", subsets=[f"distmatch_mmlu_{s}" for s in _subjects]),
        dict(name="distmatch_nlu_emo_code", subsets=[*_icl, "distmatch_mmlu"]),
    ],
)
