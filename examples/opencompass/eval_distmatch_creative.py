"""GEM creative-writing diversity (573 poem + 500 story prompts, 16 samples each) with OpenCompass 0.5.4.

    opencompass examples/opencompass/eval_distmatch_creative.py -w outputs/distmatch_creative

Sampling is a model setting in OpenCompass: temperature 1.0, top-k 50, top-p 0.9 (GEM section 5.1); the dataset
configs cap generations at 512 new tokens and repeat each prompt 16 times; the evaluator groups the samples by
prompt and reports n-gram, Self-BLEU and Sentence-BERT diversity (eval_tasks.metrics, 0-100).
"""

from mmengine.config import read_base
from opencompass.models import HuggingFacewithChatTemplate

with read_base():
    from eval_tasks.opencompass_configs.datasets.distmatch.distmatch_creative_gen import (
        distmatch_creative_datasets,
    )

datasets = distmatch_creative_datasets

models = [
    dict(
        type=HuggingFacewithChatTemplate,
        abbr="llama3-8b-gem",
        path="out/llama3-8b-ultrafeedback-gem_ls",  # your fine-tuned checkpoint (with a chat template)
        max_out_len=512,
        batch_size=16,
        generation_kwargs=dict(do_sample=True, temperature=1.0, top_k=50, top_p=0.9),
        run_cfg=dict(num_gpus=1),
    )
]
