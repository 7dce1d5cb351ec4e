"""NoveltyBench (v1.0): NB-Curated (100 prompts) and NB-WildChat (1,000), 10 samples per prompt.

The same prompts as the lm-eval tasks (shipped in eval_tasks/novelty/data/), each repeated 10 times as the user turn;
the evaluator groups the generations by prompt and reports the means over prompts of NoveltyBench's distinct and
utility (its classifier and reward model, eval_tasks/novelty/), with GEM's n-gram / Self-BLEU diversity beside them.
Sampling is a model setting in OpenCompass: use a chat model with generation_kwargs=dict(do_sample=True,
temperature=1.0, top_k=50, top_p=0.9), as for the creative-writing configs; up to 512 new tokens. The evaluator takes
classifier, reward_model, scorer_device and reward_batch_size (other models: "not comparable" in its `setting`).
"""

from opencompass.openicl.icl_inferencer import GenInferencer
from opencompass.openicl.icl_prompt_template import PromptTemplate
from opencompass.openicl.icl_retriever import ZeroRetriever

from eval_tasks.opencompass_ext import DistMatchNoveltyDataset, DistMatchNoveltyEvaluator

distmatch_noveltybench_datasets = [
    dict(
        abbr=f"distmatch_noveltybench_{subset}",
        type=DistMatchNoveltyDataset,
        subset=subset,
        num_samples=10,
        reader_cfg=dict(input_columns=["prompt"], output_column="prompt"),
        infer_cfg=dict(
            prompt_template=dict(
                type=PromptTemplate, template=dict(round=[dict(role="HUMAN", prompt="{prompt}")])
            ),
            retriever=dict(type=ZeroRetriever),
            inferencer=dict(type=GenInferencer, max_out_len=512),
        ),
        eval_cfg=dict(evaluator=dict(type=DistMatchNoveltyEvaluator), pred_role="BOT"),
    )
    for subset in ("curated", "wildchat")
]
