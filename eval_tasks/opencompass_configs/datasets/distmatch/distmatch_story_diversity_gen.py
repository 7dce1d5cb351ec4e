"""GEM creative writing, storys: the first 500 story prompts (ROCStories winter 2017 titles), 16 samples per prompt.

Each prompt ("Write a story titled '<title>' with no more than 200 words.", shipped with the package) is repeated
16 times; the evaluator groups the generations by prompt and reports the mean over prompts of n-gram, Self-BLEU
and Sentence-BERT diversity (eval_tasks.metrics, 0-100). Sampling is a model setting in OpenCompass: use a chat
model with generation_kwargs=dict(do_sample=True, temperature=1.0, top_k=50, top_p=0.9) (see
examples/opencompass/eval_distmatch_creative.py); up to 512 new tokens.
"""

from opencompass.openicl.icl_inferencer import GenInferencer
from opencompass.openicl.icl_prompt_template import PromptTemplate
from opencompass.openicl.icl_retriever import ZeroRetriever

from eval_tasks.opencompass_ext import DistMatchCreativeDataset, DistMatchDiversityEvaluator

distmatch_story_diversity_datasets = [
    dict(
        abbr="distmatch_story_diversity",
        type=DistMatchCreativeDataset,
        kind="story",
        num_samples=16,
        reader_cfg=dict(input_columns=["prompt"], output_column="prompt_id"),
        infer_cfg=dict(
            prompt_template=dict(
                type=PromptTemplate, template=dict(round=[dict(role="HUMAN", prompt="{prompt}")])
            ),
            retriever=dict(type=ZeroRetriever),
            inferencer=dict(type=GenInferencer, max_out_len=512),
        ),
        eval_cfg=dict(evaluator=dict(type=DistMatchDiversityEvaluator), pred_role="BOT"),
    )
]
