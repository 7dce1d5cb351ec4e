"""The wheel installed with `pip install --no-deps` into a bare venv (as the framework venvs install it, docs/swift.md):
a command whose packages are missing stops with README's promised line naming what to install, not a traceback or a
bare `No module named ...`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import WheelVenv
from tests.helpers.env import OFFLINE_ENV

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bare_bin(wheel_venv: WheelVenv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("no_deps") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "--no-input",
        "--python",
        str(root / "bin/python"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "-q", str(wheel_venv.wheel)],
        check=True,
        timeout=300,
        env=env,
    )
    return root / "bin"


def _run(bare_bin: Path, cwd: Path, *command: str) -> str:
    """The command's one stderr line (exit status 2)."""
    env = {"PATH": f"{bare_bin}:/usr/bin:/bin", "HOME": str(cwd), **OFFLINE_ENV}
    done = subprocess.run(
        [str(bare_bin / command[0]), *command[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    return done.stderr.strip()


def test_missing_packages_are_named_with_what_to_install(bare_bin: Path, tmp_path: Path) -> None:
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"id": 0, "prompt": "p", "samples": ["a b", "c d"]}) + "\n")
    extra = "Install it with: pip install 'distmatch[eval]'"
    line = _run(bare_bin, tmp_path, "distmatch-eval", "diversity", str(samples), "--metrics", "ngram")
    assert line == (
        "distmatch-eval diversity: error: The diversity progress bar (--no-progress: none) needs tqdm, which is "
        f"not installed. {extra}"
    )
    line = _run(
        bare_bin, tmp_path, "distmatch-eval", "diversity", str(samples), "--metrics", "ngram", "--no-progress"
    )
    assert "needs nltk, which is not installed" in line and line.endswith(extra), line
    line = _run(
        bare_bin,
        tmp_path,
        "distmatch-eval",
        "reward",
        "--samples",
        str(samples),
        "--reward-model",
        "rm",
        "-o",
        "r.json",
    )
    assert "Reward-model scoring needs torch, which is not installed" in line and line.endswith(extra), line
    line = _run(bare_bin, tmp_path, "distmatch-trl", "sft", "--help")
    assert line == (
        "distmatch-trl: error: distmatch-trl needs torch, which is not installed. It is a dependency of distmatch "
        "itself (installed without --no-deps), or: pip install torch"
    )
