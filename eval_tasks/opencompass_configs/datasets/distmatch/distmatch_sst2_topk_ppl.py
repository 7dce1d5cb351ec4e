# Generated from eval_tasks/nlu/nlu.py by `python tools/generate.py`; do not edit (`--check` compares).
"""EMO in-context NLU: distmatch_sst2 - TopK retriever (8 demonstrations, most similar first) + PPL per label.

Data: SetFit/sst2 at revision 'main', test split 'test', demonstrations from 'train'
(eval_tasks.opencompass_ext.DistMatchICLDataset; $DISTMATCH_EVAL_DATA_DIR switches to local JSONL copies).
Templates: the EMO paper's Table 5 (eval_tasks.nlu, variant "paper"), keyed by the dataset's label ids.
"""

from opencompass.openicl.icl_evaluator import AccEvaluator
from opencompass.openicl.icl_inferencer import PPLInferencer
from opencompass.openicl.icl_prompt_template import PromptTemplate
from opencompass.openicl.icl_retriever import TopkRetriever

from eval_tasks.opencompass_ext import DistMatchICLDataset

distmatch_sst2_template = {
    0: '</E>Review: "{text}" It is negative.',  # negative
    1: '</E>Review: "{text}" It is positive.',  # positive
}

distmatch_sst2_datasets = [
    dict(
        abbr="distmatch_sst2",
        type=DistMatchICLDataset,
        task="sst2",
        reader_cfg=dict(
            input_columns=["text"], output_column="label", train_split="train", test_split="test"
        ),
        infer_cfg=dict(
            ice_template=dict(type=PromptTemplate, ice_token="</E>", template=distmatch_sst2_template),
            retriever=dict(
                type=TopkRetriever,
                ice_num=8,
                sentence_transformers_model_name="sentence-transformers/all-mpnet-base-v2",
                tokenizer_name="gpt2-xl",
            ),
            inferencer=dict(type=PPLInferencer),
        ),
        eval_cfg=dict(evaluator=dict(type=AccEvaluator)),
    )
]
