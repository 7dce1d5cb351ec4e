"""Loading a file of the repository (a script, a tool, a module under another name) as a Python module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_module(name: str, path: Path, *, register: bool = True) -> ModuleType:
    """The module `name` executed from `path`. `register`: put it in `sys.modules` first (dataclasses and pickling
    look a module up by name while its classes are created); a registered module is loaded once per process."""
    if register and name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
