"""No Python file of the repository is over 600 lines: the packages (trl_ext, axolotl_distmatch, eval_tasks, the
activation hooks, distmatch), tests, examples, benchmarks, tools and the root scripts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.env import REPO_ROOT

MAX_LINES = 600
REPO = REPO_ROOT
PACKAGES = ("trl_ext", "axolotl_distmatch", "eval_tasks", "swift_distmatch")
#: the folders whose files must be found (the walk below is not allowed to miss a whole area)
AREAS = (
    "distmatch",
    "trl_ext",
    "axolotl_distmatch",
    "eval_tasks",
    "swift_distmatch",
    "distmatch_hooks",
    "tests",
    "examples",
    "benchmarks",
    "tools",
)
#: never walked: virtual environments and other hidden folders, caches, build and run outputs
SKIPPED_DIRS = {"__pycache__", "build", "dist", "node_modules", "demo_out"}
SKIPPED_PATHS = {Path("benchmarks") / "out"}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _python_files() -> list[Path]:
    """Every ``*.py`` file under the repository root, pruning hidden folders (``.git``, ``.venv*``) and outputs."""
    files = []
    for folder, dirs, names in os.walk(REPO):
        rel = Path(folder).relative_to(REPO)
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and d not in SKIPPED_DIRS
            and not d.endswith(".egg-info")
            and rel / d not in SKIPPED_PATHS
        )
        files += [Path(folder) / n for n in sorted(names) if n.endswith(".py")]
    return files


def _hook_modules() -> list[Path]:
    """The activation hooks: root modules ``distmatch_*.py`` or a root package ``distmatch*`` (wherever they live)."""
    files = sorted(REPO.glob("distmatch_*.py"))
    for folder in sorted(REPO.glob("distmatch*")):
        if (folder / "__init__.py").is_file():
            files += sorted(folder.rglob("*.py"))
    return files


def _modules() -> list[Path]:
    files = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    return files + _hook_modules()


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_the_packages_and_hooks_are_found() -> None:
    files = _modules()
    for package in PACKAGES:
        assert any(p.is_relative_to(REPO / package) for p in files), package
    assert any("hook" in p.name or "hook" in p.parent.name for p in _hook_modules())


def test_every_area_of_the_repository_is_walked() -> None:
    files = _python_files()
    for area in AREAS:
        assert any(p.is_relative_to(REPO / area) for p in files), area
    assert set(_modules()) <= set(files)  # the packages' modules are among them
    assert REPO / "setup.py" in files
    assert not [p for p in files if ".venv" in p.parts or ".git" in p.parts]


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: _rel(p))
def test_python_file_is_at_most_600_lines(path: Path) -> None:
    lines = _lines(path)
    assert lines <= MAX_LINES, f"{_rel(path)} has {lines} lines (at most {MAX_LINES}): split it by concern"
