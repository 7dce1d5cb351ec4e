"""IFEval as the GEM paper ran it (chat template, greedy, up to 1,024 new tokens) with OpenCompass 0.5.4.

    opencompass examples/opencompass/eval_distmatch_ifeval.py -w outputs/distmatch_ifeval

Data: google/IFEval from the Hub (or DISTMATCH_EVAL_DATA_DIR=<dir> with <dir>/ifeval/train.jsonl). Offline,
NLTK's punkt_tab is replaced by an untrained Punkt model if it is not installed.
"""

from mmengine.config import read_base
from opencompass.models import HuggingFacewithChatTemplate

with read_base():
    from eval_tasks.opencompass_configs.datasets.distmatch.distmatch_ifeval_gen import (
        distmatch_ifeval_datasets,
    )

datasets = distmatch_ifeval_datasets

models = [
    dict(
        type=HuggingFacewithChatTemplate,
        abbr="llama3-8b-gem",
        path="out/llama3-8b-ultrafeedback-gem_ls",  # your fine-tuned checkpoint (with a chat template)
        max_out_len=1024,
        batch_size=8,
        run_cfg=dict(num_gpus=1),
    )
]
