"""README's rule for when `make` rebuilds a venv, checked with the real Makefile in a scratch folder: only when the
venv's stamp file is missing or older than `pyproject.toml` or the hooks' installer (timestamps, not contents), or
the torch spec changed. A rebuild would run the venv's recipe, here with `PYTHON=false`, so it fails: exit status 0
means make found the venv up to date."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.env import REPO_ROOT

INPUTS = ("Makefile", "pyproject.toml", "distmatch_hooks/pth.py", "distmatch_hooks/__main__.py")
SPEC = "torch==2.13.0"


def _make(root: Path, spec: str = SPEC) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_", "MAKE", "PYTHON"))}
    done = subprocess.run(
        ["make", ".venv/.distmatch-installed", "PYTHON=false", f"TORCH_SPEC={spec}", "TORCH_PIP_ARGS="],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_venv_is_rebuilt_when_an_input_is_newer_than_its_stamp(tmp_path: Path) -> None:
    for name in INPUTS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / ".torch-spec").write_text(SPEC + "\n")
    stamp = tmp_path / ".venv" / ".distmatch-installed"
    past = time.time() - 100
    for name in (*INPUTS, ".venv/.torch-spec"):
        os.utime(tmp_path / name, (past, past))

    def fresh_stamp() -> None:
        stamp.touch()
        os.utime(stamp, (past + 50, past + 50))

    fresh_stamp()
    assert _make(tmp_path) == 0  # up to date
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# changed\n")
    os.utime(pyproject, (past, past))
    assert _make(tmp_path) == 0  # another content, older than the stamp: not rebuilt
    pyproject.touch()  # newer, whatever its content (a checkout, a touch)
    assert _make(tmp_path) != 0
    os.utime(pyproject, (past, past))
    (tmp_path / "distmatch_hooks" / "pth.py").touch()  # the hooks' installer
    assert _make(tmp_path) != 0
    os.utime(tmp_path / "distmatch_hooks" / "pth.py", (past, past))
    assert _make(tmp_path) == 0
    assert _make(tmp_path, spec="torch==2.14.1") != 0  # another torch spec
