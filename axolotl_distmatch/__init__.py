"""Axolotl plugin for the distmatch losses (EMO, GEM and baselines).

    plugins:
      - axolotl_distmatch.DistMatchPlugin   # Axolotl 0.19 / 0.20; auto-loaded on >= 0.21 (entry point)
    loss: gem_ls
    gem_beta: 0.7

Importing this package does not import Axolotl: `DistMatchPlugin` and `DistMatchTrainer` are resolved lazily
(with an error naming `distmatch[axolotl]` when Axolotl is missing), so the package can be imported anywhere.
The plugin reuses `trl_ext` and never re-implements loss math.
"""

from __future__ import annotations

import importlib
from typing import Any

from distmatch.optional import require

__all__ = ["DistMatchArgs", "DistMatchPlugin", "DistMatchTrainer"]

_LAZY = {"DistMatchPlugin": "plugin", "DistMatchTrainer": "trainer", "DistMatchArgs": "args"}
_NEEDS_AXOLOTL = {"DistMatchPlugin", "DistMatchTrainer"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        if name in _NEEDS_AXOLOTL:
            require("axolotl", extra="axolotl", feature="The distmatch Axolotl plugin")
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
