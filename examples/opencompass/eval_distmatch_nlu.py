"""EMO in-context NLU suite (7 retrieval tasks + MMLU 5-shot) with OpenCompass 0.5.4.

    pip install "distmatch[opencompass]"   # own venv: opencompass pins numpy<2, datasets<4 (make .venv-opencompass)
    opencompass examples/opencompass/eval_distmatch_nlu.py -w outputs/distmatch_nlu

Edit `path` below (a base model: the prompts are scored as plain text, never chat-templated). The retriever
downloads sentence-transformers/all-mpnet-base-v2 and the gpt2-xl tokenizer (OpenICL's text round trip); offline,
set both to local folders as shown at the end. The same suite from the command line:
    opencompass --config-dir "$(python -m eval_tasks.opencompass_configs)" --datasets distmatch_nlu_topk_ppl \
        --summarizer distmatch_nlu --hf-type base --hf-path huggyllama/llama-7b
"""

from mmengine.config import read_base
from opencompass.models import HuggingFaceBaseModel

with read_base():
    from eval_tasks.opencompass_configs.datasets.distmatch.distmatch_nlu_topk_ppl import (
        distmatch_nlu_datasets,
    )
    from eval_tasks.opencompass_configs.summarizers.distmatch_nlu import summarizer  # noqa: F401

datasets = distmatch_nlu_datasets  # or distmatch_nlu_emo_code_datasets (the EMO repository's templates)

models = [
    dict(
        type=HuggingFaceBaseModel,
        abbr="llama-7b",
        path="huggyllama/llama-7b",
        max_seq_len=2048,
        batch_size=8,
        run_cfg=dict(num_gpus=1),
    )
]

# Offline retrieval: local copies of the encoder and of the tokenizer used for OpenICL's text round trip.
# for d in datasets:
#     if "sentence_transformers_model_name" in d["infer_cfg"]["retriever"]:
#         d["infer_cfg"]["retriever"]["sentence_transformers_model_name"] = "/models/all-mpnet-base-v2"
#         d["infer_cfg"]["retriever"]["tokenizer_name"] = "/models/gpt2-xl"
