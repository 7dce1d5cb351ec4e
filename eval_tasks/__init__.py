"""Evaluation for distmatch models: lm-eval task YAMLs, OpenCompass configs and diversity metrics.

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
