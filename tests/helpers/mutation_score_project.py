"""A tiny git project for tests of `make mutation-score` (tools/mutation_score.py, run with `--root`): one package
`tiny` with one module, its tests, and the tool's list naming them; and the tool run on it as a program."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "mutation_score.py"


def tiny_project(root: Path, source: str, tests: str, config: str, ignored: str = "build/\n") -> Path:
    """`root` as a git working tree (files added, not committed): tiny/calc.py = `source`, tests/test_calc.py =
    `tests`, tools/mutation_score.toml = `config`; `.gitignore` = `ignored` (the scratch copies under build/)."""
    for rel, text in {
        "tiny/__init__.py": "",
        "tiny/calc.py": source,
        "tests/__init__.py": "",
        "tests/test_calc.py": tests,
        "pyproject.toml": '[project]\nname = "tiny"\nversion = "0"\n',
        ".gitignore": ignored,
        "tools/mutation_score.toml": config,
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for args in (["init", "-q"], ["add", "-A"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root


def run_tool(root: Path, *args: str, unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """tools/mutation_score.py --root `root` `args`, without this test run's pytest / mutmut variables (nor those
    starting with `unset`)."""
    drop = ("PYTEST_", "MUTANT_", *unset)
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return subprocess.run(
        [sys.executable, str(TOOL), "--root", str(root), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
