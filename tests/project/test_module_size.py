"""No module of the packages is over 600 lines: trl_ext, axolotl_distmatch, eval_tasks and the activation hooks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.env import REPO_ROOT

MAX_LINES = 600
REPO = REPO_ROOT
PACKAGES = ("trl_ext", "axolotl_distmatch", "eval_tasks")


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


def test_the_packages_and_hooks_are_found() -> None:
    files = _modules()
    for package in PACKAGES:
        assert any(p.is_relative_to(REPO / package) for p in files), package
    assert any("hook" in p.name or "hook" in p.parent.name for p in _hook_modules())


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_module_is_at_most_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, (
        f"{path.relative_to(REPO)} has {lines} lines (at most {MAX_LINES}): split it by concern"
    )
