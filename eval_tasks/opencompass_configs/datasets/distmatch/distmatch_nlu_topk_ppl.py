# Generated from eval_tasks/nlu/nlu.py by `python tools/generate.py`; do not edit (`--check` compares).
"""The EMO paper's language-understanding suite (Table 3) for OpenCompass: 7 retrieval tasks + MMLU (5-shot PPL).

``opencompass --datasets distmatch_nlu_topk_ppl --config-dir "$(python -m eval_tasks.opencompass_configs)" ...``
or, in a config, ``from eval_tasks.opencompass_configs.datasets.distmatch.distmatch_nlu_topk_ppl import
distmatch_nlu_datasets`` inside ``read_base()``. Use a base model (``--hf-type base``): the prompts are scored as
plain text. The summarizer ``eval_tasks.opencompass_configs.summarizers.distmatch_nlu`` adds the MMLU subject
average and the 8-task average.
"""

from mmengine.config import read_base

with read_base():
    # Aliases without the `_datasets` suffix: OpenCompass collects every `*_datasets` variable of this file.
    from .distmatch_ag_news_topk_ppl import distmatch_ag_news_datasets as _ag_news
    from .distmatch_cr_topk_ppl import distmatch_cr_datasets as _cr
    from .distmatch_mmlu_ppl import distmatch_mmlu_datasets as _mmlu
    from .distmatch_rt_topk_ppl import distmatch_rt_datasets as _rt
    from .distmatch_sst2_topk_ppl import distmatch_sst2_datasets as _sst2
    from .distmatch_subj_topk_ppl import distmatch_subj_datasets as _subj
    from .distmatch_trec_topk_ppl import distmatch_trec_datasets as _trec
    from .distmatch_tweet_emotion_topk_ppl import distmatch_tweet_emotion_datasets as _tweet_emotion

distmatch_nlu_datasets = [*_tweet_emotion, *_sst2, *_trec, *_subj, *_cr, *_rt, *_ag_news, *_mmlu]
