"""IFEval as the GEM paper ran it: google/IFEval's 541 prompts as a chat turn, greedy, up to 1,024 new tokens.

Use a chat model (``--hf-type chat`` / ``HuggingFacewithChatTemplate``) without sampling ``generation_kwargs``.
Metrics: OpenCompass's IFEval scorer (prompt/instruction-level strict/loose accuracy, in %), with NLTK's
``punkt_tab`` replaced by an untrained Punkt model when it is not installed (offline). Data: google/IFEval through
eval_tasks.dataset_loading ($DISTMATCH_EVAL_DATA_DIR switches to a local JSONL copy).
"""

from opencompass.openicl.icl_inferencer import GenInferencer
from opencompass.openicl.icl_prompt_template import PromptTemplate
from opencompass.openicl.icl_retriever import ZeroRetriever

from eval_tasks.opencompass_ext import DistMatchIFEvalDataset, DistMatchIFEvaluator

distmatch_ifeval_datasets = [
    dict(
        abbr="distmatch_ifeval",
        type=DistMatchIFEvalDataset,
        reader_cfg=dict(input_columns=["prompt"], output_column="reference"),
        infer_cfg=dict(
            prompt_template=dict(
                type=PromptTemplate, template=dict(round=[dict(role="HUMAN", prompt="{prompt}")])
            ),
            retriever=dict(type=ZeroRetriever),
            inferencer=dict(type=GenInferencer, max_out_len=1024),
        ),
        eval_cfg=dict(evaluator=dict(type=DistMatchIFEvaluator), pred_role="BOT"),
    )
]
