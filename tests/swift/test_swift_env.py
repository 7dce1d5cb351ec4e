""".venv-swift holds what docs/swift.md says: ms-swift 4.6.0 with its trl<1.0, distmatch beside it with --no-deps, and
a loss library that imports no framework (so the plugin works although distmatch's own trl requirement is unmet)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version

import pytest
from packaging.version import Version

pytest.importorskip("swift", reason="ms-swift is installed only in .venv-swift (make test-swift)")


def test_versions_and_the_one_expected_pip_conflict() -> None:
    assert version("ms-swift") == "4.6.0"
    assert Version(version("trl")) < Version("1.0")  # why distmatch goes in with --no-deps
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(
        r"distmatch \S+ has requirement trl>=\S+, but you have trl 0\.\S+\.", lines[0]
    ), done.stdout


def test_the_loss_library_and_the_plugin_package_import_no_framework() -> None:
    code = (
        "import sys, trl_ext.losses, trl_ext.options, trl_ext.checks, swift_distmatch\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'trl', 'transformers', 'swift', 'peft', 'datasets',"
        " 'accelerate'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
