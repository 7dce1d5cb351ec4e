"""Axolotl plugin for the distmatch losses (EMO, GEM and baselines).

Importing this package does not import Axolotl: ``axolotl_distmatch.DistMatchPlugin`` is resolved
lazily, so the package (and its docs/config helpers) can be imported in environments without Axolotl.
The plugin reuses ``trl_ext.losses`` and never re-implements loss math.
"""

from __future__ import annotations

from typing import Any

from trl_ext._optional import require

__all__ = ["DistMatchPlugin"]


def __getattr__(name: str) -> Any:
    if name == "DistMatchPlugin":
        require("axolotl", extra="axolotl", feature="The distmatch Axolotl plugin")
        raise NotImplementedError(
            "axolotl_distmatch.DistMatchPlugin is not implemented yet: it lands with issue 4 "
            "(the Axolotl integration). Axolotl itself is installed."
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
