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


# The markers each folder's tests carry (a path under tests/, folder or file; the longest match wins, so a file entry
# overrides its folder's). The Makefile picks each venv's tests by these markers (see pyproject.toml's marker list);
# `slow` and one-off marks stay on the modules and tests themselves.
FOLDER_MARKERS: dict[str, tuple[str, ...]] = {
    "axolotl": ("axolotl_env",),
    "distributed": ("multiprocess",),
    "eval/opencompass": ("opencompass_env",),
    "swift": ("swift_env",),
    "trl": ("trl_trainer",),
    "trl/cli": ("trl_cli",),
    # The patched forward on models built in code, no TRL trainer: not run again in .venv-axolotl.
    "trl/test_model_forward_scaling.py": (),
    "trl/test_model_forward_heads.py": (),
}
TESTS_DIR = Path(__file__).resolve().parent


def folder_markers(path: Path) -> tuple[str, ...]:
    """The FOLDER_MARKERS entry for a test file: its longest matching path under tests/ (none outside tests/)."""
    try:
        relative = path.resolve().relative_to(TESTS_DIR).as_posix()
    except ValueError:
        return ()
    matches = [key for key in FOLDER_MARKERS if relative == key or relative.startswith(key + "/")]
    return FOLDER_MARKERS[max(matches, key=len)] if matches else ()


def pytest_itemcollected(item: pytest.Item) -> None:
    for name in folder_markers(item.path):
        item.add_marker(name)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the folder holding pyproject.toml)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    """Our wheel installed in a fresh venv (built once per session; the TRL CLI and distributed tests use it)."""
    return build_wheel_venv(tmp_path_factory.mktemp("wheel"))
