"""Shared pytest set-up: offline everything, the repository root, and the markers each test folder sets.

Every folder under tests/ is a package (`__init__.py`), so a test module is imported as `tests.<folder>.<name>` with
the repository root on sys.path: folder names (`trl`, `axolotl`) never shadow the installed packages, and two folders
may hold files of the same name. Shared helpers: `from tests.helpers.tiny_model import build_tiny_llama`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.cli import WheelVenv, build_wheel_venv
from tests.helpers.env import OFFLINE_ENV, REPO_ROOT

# Set before any test module imports transformers / datasets / axolotl: no network in tests.
for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the folder holding pyproject.toml)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    """Our wheel installed in a fresh venv (built once per session; the TRL CLI and distributed tests use it)."""
    return build_wheel_venv(tmp_path_factory.mktemp("wheel"))
