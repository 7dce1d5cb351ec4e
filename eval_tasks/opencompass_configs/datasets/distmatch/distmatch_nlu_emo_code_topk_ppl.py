# Generated from eval_tasks/nlu/nlu.py by `python tools/generate.py`; do not edit (`--check` compares).
"""The EMO paper's Table 3 protocol: the 7 retrieval tasks with the EMO repository's templates (``icl.py``), plus MMLU.

Same data and scoring as ``distmatch_nlu_topk_ppl``; dataset abbreviations end in ``_emo_code``. The strings are
eval_tasks.nlu's ``emo_code`` variant. The retriever is ``DistMatchTopkRetriever``:
OpenCompass's TopkRetriever with OpenICL's clean-up of tokenization spaces in its GPT-2 round trip (see
eval_tasks.opencompass_ext). With the summarizer ``distmatch_nlu_emo_code`` this is the counterpart of the lm-eval
``--metadata '{"protocol": "emo_official"}'``.
"""

from mmengine.config import read_base

from eval_tasks.opencompass_ext import DistMatchTopkRetriever

with read_base():
    from .distmatch_nlu_topk_ppl import distmatch_nlu_datasets as _paper

_emo_code_templates = {
    "distmatch_tweet_emotion": {
        0: "</E>{text} It is anger.",
        1: "</E>{text} It is joy.",
        2: "</E>{text} It is optimism.",
        3: "</E>{text} It is sadness.",
    },
    "distmatch_sst2": {0: '</E>Review: "{text}" It is negative.', 1: '</E>Review: "{text}" It is positive.'},
    "distmatch_trec": {
        0: '</E>"{text}" It is about abbreviation.',
        1: '</E>"{text}" It is about entity.',
        2: '</E>"{text}" It is about description and abstract concept.',
        3: '</E>"{text}" It is about human being.',
        4: '</E>"{text}" It is about location.',
        5: '</E>"{text}" It is about numeric value.',
    },
    "distmatch_subj": {0: "</E>{text} It is objective.", 1: "</E>{text} It is subjective."},
    "distmatch_cr": {0: "</E>Review: {text} It is negative.", 1: "</E>Review: {text} It is positive."},
    "distmatch_rt": {0: "</E>Review: {text} It is negative", 1: "</E>Review: {text} It is positive"},
    "distmatch_ag_news": {
        0: '</E>"{text}" It is about world.',
        1: '</E>"{text}" It is about sports.',
        2: '</E>"{text}" It is about business.',
        3: '</E>"{text}" It is about science and technology.',
    },
}

# (No `import copy`: mmengine turns imports in a read_base() config into lazy placeholders; plain dicts only.)
distmatch_nlu_emo_code_datasets = []
for _dataset in _paper:
    if _dataset["abbr"] in _emo_code_templates:
        _infer = _dataset["infer_cfg"]
        _dataset = dict(
            _dataset,
            abbr=_dataset["abbr"] + "_emo_code",
            infer_cfg=dict(
                _infer,
                ice_template=dict(_infer["ice_template"], template=_emo_code_templates[_dataset["abbr"]]),
                retriever=dict(_infer["retriever"], type=DistMatchTopkRetriever),
            ),
        )
    distmatch_nlu_emo_code_datasets.append(_dataset)

del _dataset
