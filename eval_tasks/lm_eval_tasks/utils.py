"""What the task YAMLs reference (``!function utils.<name>``); the code lives in :mod:`.harness`.

lm-eval imports this file by its path, as a module of its own; importing from the installed package keeps one
copy of the classes and caches (loaded encoders, Sentence-BERT models).
"""

from eval_tasks.lm_eval_tasks.best_of_n import (
    AlpacaEvalBONTask,
    MathVotingTask,
    load_alpacaeval_dataset,
    load_math_dataset,
    math_voting_process_results,
    reward_bon_process_results,
)
from eval_tasks.lm_eval_tasks.code_harness import CodeTask, load_code_dataset
from eval_tasks.lm_eval_tasks.harness import (
    DiversityTask,
    ICLTask,
    IFEvalTask,
    MMLUTask,
    agg_inst_level_acc,
    diversity_process_results,
    icl_process_results,
    ifeval_process_results,
    load_creative_dataset,
    load_icl_dataset,
    load_ifeval_dataset,
    load_mmlu_dataset,
    mmlu_process_results,
    subject_macro_mean,
)
from eval_tasks.lm_eval_tasks.open_ended import (
    OpenEndedTask,
    load_open_ended_dataset,
    mauve_rounds,
    oracle_ppl_rounds,
)

__all__ = [
    "CodeTask",
    "OpenEndedTask",
    "load_open_ended_dataset",
    "mauve_rounds",
    "oracle_ppl_rounds",
    "AlpacaEvalBONTask",
    "MathVotingTask",
    "load_alpacaeval_dataset",
    "load_math_dataset",
    "math_voting_process_results",
    "reward_bon_process_results",
    "DiversityTask",
    "ICLTask",
    "IFEvalTask",
    "MMLUTask",
    "agg_inst_level_acc",
    "diversity_process_results",
    "icl_process_results",
    "ifeval_process_results",
    "load_code_dataset",
    "load_creative_dataset",
    "load_icl_dataset",
    "load_ifeval_dataset",
    "load_mmlu_dataset",
    "mmlu_process_results",
    "subject_macro_mean",
]
