"""The lm-eval glue of the distmatch tasks: where lm-eval finds them, the group member lists, the pre-flight check.

One package per benchmark family under ``eval_tasks/`` (``nlu/``, ``creative/``, ...: its task logic, lm-eval task
classes, YAMLs, the ``utils.py`` they reference and a README); this package is the lm-eval glue. ``TASK_DIR`` is the
folder lm-eval indexes, the ``eval_tasks`` package root (lm-eval recurses into every family package). It is found
without ``--include_path`` through the activation hook (``distmatch_hooks.lm_eval``, installed with the wheel) and,
in lm-eval releases that read it, through the ``lm_eval.tasks`` entry point; with the hook disabled
(``DISTMATCH_LM_EVAL_HOOK=0``) pass it explicitly::

    lm_eval run --include_path "$(python -m eval_tasks.lm_eval_tasks)" --tasks distmatch_nlu ...

Importing this package imports nothing heavy (no lm-eval): the task classes live in the family packages
(``eval_tasks/<family>/harness.py``), what they share in :mod:`eval_tasks.lm_eval_tasks.task_base`;
:mod:`eval_tasks.lm_eval_tasks.preflight` checks the ``--metadata`` options before the model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eval_tasks.nlu.nlu import NLU_TASK_NAMES

__all__ = ["CREATIVE_TASKS", "NLU_TASKS", "TASK_DIR", "task_manager"]

TASK_DIR = Path(__file__).resolve().parent.parent  # eval_tasks/: every family package's YAMLs

#: Members of the groups ``distmatch_nlu`` (the task table of :mod:`eval_tasks.nlu`) and ``distmatch_creative``.
NLU_TASKS = NLU_TASK_NAMES
CREATIVE_TASKS = ("distmatch_poem_diversity", "distmatch_story_diversity")


def task_manager(**kwargs: Any) -> Any:
    """An ``lm_eval.tasks.TaskManager`` that knows the distmatch tasks (for ``lm_eval.simple_evaluate``).

    Extra ``include_path`` entries given here come after ours (so they can override our tasks).
    """
    from eval_tasks import require_lm_eval

    require_lm_eval()
    from lm_eval.tasks import TaskManager

    extra = kwargs.pop("include_path", None)
    extra = [] if extra is None else list(extra) if isinstance(extra, (list, tuple)) else [extra]
    paths = [str(TASK_DIR)] + [p for p in map(str, extra) if Path(p).resolve() != TASK_DIR]
    return TaskManager(include_path=paths, **kwargs)
