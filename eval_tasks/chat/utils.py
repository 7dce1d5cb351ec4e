"""What this folder's YAMLs reference (``!function utils.<name>``); the code lives in
:mod:`eval_tasks.chat.harness`.

lm-eval imports this file by its path, as a module of its own; importing from the installed package keeps one
copy of the classes and caches (loaded encoders, Sentence-BERT models)."""

from eval_tasks.chat.harness import (
    IFEvalTask,
    agg_inst_level_acc,
    ifeval_process_results,
    load_ifeval_dataset,
)

__all__ = [
    "IFEvalTask",
    "agg_inst_level_acc",
    "ifeval_process_results",
    "load_ifeval_dataset",
]
