"""The release checks of `make dist` (tools/dist.py) find what they look for: the wheel built from this tree passes
them, and a wheel with a `.pth` hook, an entry point or a package left out (or a stray folder added) fails them with
the name of what is wrong. `make test` runs the whole `make dist` (build, clean-venv install, smoke tests)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import distmatch
from tests.helpers.cli import wheel_sources
from tests.helpers.env import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools"))
import dist  # noqa: E402


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    base = tmp_path_factory.mktemp("dist")
    for name in wheel_sources():
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, base / "src" / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            (base / "src").mkdir(exist_ok=True)
            shutil.copy2(source, base / "src" / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation", "-q"]
        + ["-w", str(base / "out"), str(base / "src")],
        check=True,
        timeout=600,
    )
    (built,) = (base / "out").glob("distmatch-*.whl")
    return built


def _copy_without(wheel: Path, target: Path, drop: set[str], edit: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w") as copy:
        for item in source.infolist():
            if item.filename in drop:
                continue
            data = source.read(item.filename)
            for name, (old, new) in (edit or {}).items():
                if item.filename.endswith(name):
                    data = data.replace(old.encode(), new.encode())
            copy.writestr(item, data)
    return target


def test_the_wheel_of_this_tree_passes(wheel: Path) -> None:
    assert dist.wheel_problems(wheel, distmatch.__version__) == []


def test_a_wheel_missing_parts_fails_naming_them(wheel: Path, tmp_path: Path) -> None:
    broken = _copy_without(
        wheel,
        tmp_path / wheel.name,
        drop={"distmatch_hooks.trl.pth", "trl_ext/py.typed", "eval_tasks/nlu/_icl_template_yaml"},
        edit={"entry_points.txt": ("distmatch = axolotl_distmatch:DistMatchPlugin", "")},
    )
    with zipfile.ZipFile(broken, "a") as archive:
        archive.writestr("tests/__init__.py", "")
    problems = dist.wheel_problems(broken, distmatch.__version__)
    assert problems == [
        "distmatch_hooks.trl.pth is not at the wheel's root",
        "trl_ext/py.typed is missing",
        "eval_tasks/nlu/_icl_template_yaml is missing (an lm-eval task file)",
        "tests/__init__.py is shipped (not part of the release)",
        "entry point [axolotl.plugins] distmatch = axolotl_distmatch:DistMatchPlugin is missing",
    ], problems
    assert dist.wheel_problems(wheel, "9.9.9") == [
        "no distmatch-9.9.9.dist-info/METADATA: the wheel is not distmatch 9.9.9"
    ]
