"""Every venv holds, of a package shipped per Python version (`multiprocess`'s `py310` / `py311` / ... wheels), the
wheel of its own interpreter. A partial local mirror listing only an older version's wheel once gave the venvs
built by uv the Python 3.10 code of `multiprocess` under Python 3.11 (`datasets.save_to_disk` then failed in
`fork_exec`); pip picks the best wheel of all indexes, and tools/installer.py puts the full index first for uv."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.env import REPO_ROOT

VENVS = (".venv", ".venv-axolotl", ".venv-axolotl-latest", ".venv-opencompass", ".venv-swift")
PURE_VERSION_TAG = re.compile(r"^py3(\d+)-none-any$")


def wheel_tags(site_packages: Path) -> dict[str, list[str]]:
    """distribution folder -> the tags of the wheel it was installed from."""
    tags = {}
    for wheel in site_packages.glob("*.dist-info/WHEEL"):
        tags[wheel.parent.name] = [
            line.split(":", 1)[1].strip()
            for line in wheel.read_text().splitlines()
            if line.startswith("Tag:")
        ]
    return tags


def wrong_python(tags: dict[str, list[str]], minor: int) -> list[str]:
    """Distributions whose every tag names one Python 3 minor version, none of them `minor`."""
    wrong = []
    for name, listed in sorted(tags.items()):
        versions = [PURE_VERSION_TAG.match(tag) for tag in listed]
        if listed and all(versions) and minor not in {int(v[1]) for v in versions if v}:
            wrong.append(f"{name} ({', '.join(listed)})")
    return wrong


def test_the_check_finds_a_wheel_of_another_python(tmp_path):
    for name, tag in (("multiprocess-0.70.19", "py310-none-any"), ("six-1.17.0", "py3-none-any")):
        (tmp_path / f"{name}.dist-info").mkdir()
        (tmp_path / f"{name}.dist-info" / "WHEEL").write_text(f"Wheel-Version: 1.0\nTag: {tag}\n")
    assert wrong_python(wheel_tags(tmp_path), 11) == ["multiprocess-0.70.19.dist-info (py310-none-any)"]
    assert wrong_python(wheel_tags(tmp_path), 10) == []


@pytest.mark.parametrize("venv", VENVS)
def test_each_venv_has_its_own_pythons_wheels(venv):
    found = sorted((REPO_ROOT / venv / "lib").glob("python3.*/site-packages"))
    if not found:
        pytest.skip(f"{venv} is not built here")
    (site_packages,) = found
    minor = int(site_packages.parent.name.split(".")[1])
    tags = wheel_tags(site_packages)
    assert tags, site_packages
    assert wrong_python(tags, minor) == [], f"{venv}: wheels of another Python"
