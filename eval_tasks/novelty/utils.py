"""What this folder's YAMLs reference (``!function utils.<name>``); the code lives in
:mod:`eval_tasks.novelty.harness`.

lm-eval imports this file by its path, as a module of its own; importing from the installed package keeps one copy
of the classes and of the loaded classifier and reward model."""

from eval_tasks.novelty.harness import NoveltyTask, load_novelty_dataset, novelty_process_results

__all__ = ["NoveltyTask", "load_novelty_dataset", "novelty_process_results"]
