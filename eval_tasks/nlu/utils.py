"""What this folder's YAMLs reference (``!function utils.<name>``); the code lives in
:mod:`eval_tasks.nlu.harness`.

lm-eval imports this file by its path, as a module of its own; importing from the installed package keeps one
copy of the classes and caches (loaded encoders, Sentence-BERT models)."""

from eval_tasks.nlu.harness import (
    ICLTask,
    MMLUTask,
    icl_process_results,
    load_icl_dataset,
    load_mmlu_dataset,
    mmlu_process_results,
    subject_macro_mean,
)

__all__ = [
    "ICLTask",
    "MMLUTask",
    "icl_process_results",
    "load_icl_dataset",
    "load_mmlu_dataset",
    "mmlu_process_results",
    "subject_macro_mean",
]
