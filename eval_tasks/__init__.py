"""Evaluation for distmatch models: one package per benchmark family, over the layers every family uses.

* The families, each with its task logic, its lm-eval task classes (``harness``), its lm-eval YAMLs and a
  README (paper, tasks, options, published numbers): :mod:`eval_tasks.nlu` (EMO's in-context NLU and MMLU),
  :mod:`eval_tasks.creative`, :mod:`eval_tasks.open_ended`, :mod:`eval_tasks.code` (run in
  :mod:`eval_tasks.sandbox`), :mod:`eval_tasks.math`, :mod:`eval_tasks.chat` (IFEval, AlpacaEval) and
  :mod:`eval_tasks.best_of_n`.
* The shared layers: ``generation``, ``samples``, ``results``, ``dataset_loading``, ``task_options`` (the one
  option table), ``protocols``, :mod:`eval_tasks.metrics`, :mod:`eval_tasks.report`; the lm-eval glue
  (:mod:`eval_tasks.lm_eval_tasks`: lm-eval indexes this whole folder), the OpenCompass configs
  (``opencompass_configs``, ``opencompass_ext``), the published numbers and ``distmatch-eval``
  (:mod:`eval_tasks.cli`).

lm-eval and OpenCompass are optional (extras ``eval`` and ``opencompass``); import them through
:func:`require_lm_eval` / :func:`distmatch.optional.require` so a missing one names the extra to install.
"""

from __future__ import annotations

from types import ModuleType

from distmatch.optional import require

__all__ = ["require_lm_eval"]


def require_lm_eval() -> ModuleType:
    """Return the ``lm_eval`` module, or raise ``ImportError`` naming ``distmatch[eval]``."""
    return require("lm_eval", extra="eval", feature="The distmatch lm-eval tasks")
