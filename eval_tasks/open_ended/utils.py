"""What this folder's YAMLs reference (``!function utils.<name>``); the code lives in
:mod:`eval_tasks.open_ended.harness`.

lm-eval imports this file by its path, as a module of its own; importing from the installed package keeps one
copy of the classes and caches (loaded encoders, Sentence-BERT models)."""

from eval_tasks.open_ended.harness import (
    OpenEndedTask,
    load_open_ended_dataset,
)

__all__ = [
    "OpenEndedTask",
    "load_open_ended_dataset",
]
