"""What this folder's YAMLs reference (``!function utils.<name>``); the code lives in
:mod:`eval_tasks.creative.harness`.

lm-eval imports this file by its path, as a module of its own; importing from the installed package keeps one
copy of the classes and caches (loaded encoders, Sentence-BERT models)."""

from eval_tasks.creative.harness import (
    DiversityTask,
    diversity_process_results,
    load_creative_dataset,
)

__all__ = [
    "DiversityTask",
    "diversity_process_results",
    "load_creative_dataset",
]
