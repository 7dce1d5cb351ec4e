"""What this folder's YAMLs reference (``!function utils.<name>``); the code lives in
:mod:`eval_tasks.code.harness`.

lm-eval imports this file by its path, as a module of its own; importing from the installed package keeps one
copy of the classes and caches (loaded encoders, Sentence-BERT models)."""

from eval_tasks.code.harness import (
    CodeTask,
    load_code_dataset,
)

__all__ = [
    "CodeTask",
    "load_code_dataset",
]
