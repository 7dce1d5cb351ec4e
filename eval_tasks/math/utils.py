"""What this folder's YAMLs reference (``!function utils.<name>``); the code lives in
:mod:`eval_tasks.math.harness`.

lm-eval imports this file by its path, as a module of its own; importing from the installed package keeps one
copy of the classes and caches (loaded encoders, Sentence-BERT models)."""

from eval_tasks.math.harness import (
    MathVotingTask,
    load_math_dataset,
    math_voting_process_results,
)

__all__ = [
    "MathVotingTask",
    "load_math_dataset",
    "math_voting_process_results",
]
