"""Guarded imports of optional dependencies (Axolotl, lm-eval, OpenCompass, flash-attn, deepspeed, ...).

Every import of an optional package goes through :func:`require`, so a missing one fails with a message
that names the extra to install instead of a bare ``ModuleNotFoundError`` deep inside a call.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["is_available", "require"]


def is_available(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (parents of dotted names are imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        # find_spec("a.b") imports "a" and raises if "a" is missing; ValueError if a __spec__ is None.
        return False


def require(module: str, *, extra: str | None, feature: str) -> ModuleType:
    """Import and return ``module``; if that fails, raise an ``ImportError`` saying how to install it.

    Args:
        module: dotted module name, e.g. ``"axolotl"`` or ``"lm_eval"``.
        extra: the ``distmatch`` extra that provides it, e.g. ``"axolotl"``; None for a dependency of distmatch
            itself (torch, transformers, trl, accelerate, datasets: missing after ``pip install --no-deps``).
        feature: what needs it, as the start of a sentence, e.g. ``"The distmatch Axolotl plugin"``.

    Raises:
        ImportError: chained to the original error, naming the extra and the pip command.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        missing = isinstance(err, ModuleNotFoundError) and (
            err.name is None or module == err.name or module.startswith(err.name + ".")
        )
        problem = "which is not installed" if missing else f"which is installed but failed to import ({err})"
        if extra is None:
            package = module.split(".")[0]
            how = f"It is a dependency of distmatch itself (installed without --no-deps), or: pip install {package}"
        else:
            how = f"Install it with: pip install 'distmatch[{extra}]'"
        raise ImportError(f"{feature} needs {module}, {problem}. {how}") from err
