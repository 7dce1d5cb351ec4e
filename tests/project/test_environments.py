"""The framework venvs hold the versions the project is built against (run inside those venvs).

``make test`` runs the ``axolotl_env`` tests in both Axolotl venvs (``.venv-axolotl``: Axolotl 0.19 on Python 3.11;
``.venv-axolotl-latest``: Axolotl 0.21 on Python >= 3.12), each checked against its own pins (picked by the installed
Axolotl), and the ``opencompass_env`` tests with ``.venv-opencompass/bin/python -m pytest -m opencompass_env``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from distmatch.optional import is_available


def _base(v: str) -> str:
    """Drop a local version label: "2.13.0+cpu" -> "2.13.0"."""
    return v.split("+", 1)[0]


def _pip_check(tolerated: str | None = None) -> None:
    """`pip check` is clean, apart from lines matching the regex ``tolerated``."""
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    lines = [
        line for line in out.stdout.splitlines() if line and not line.startswith("No broken requirements")
    ]
    broken = [line for line in lines if not (tolerated and re.fullmatch(tolerated, line))]
    assert not broken, out.stdout + out.stderr
    if not lines:
        assert out.returncode == 0, out.stdout + out.stderr


#: What each Axolotl venv pins (the Makefile's AXOLOTL_REQS / AXOLOTL_LATEST_REQS and what those resolve to).
AXOLOTL_VENV_PINS = {
    "0.19.0": {
        "python": (3, 11),
        "trl": "1.9.0",
        "transformers": "5.16.1",
        "torch": "2.13.0",
        "deepspeed": "0.19.8",
    },
    "0.21.0": {
        "python": (3, 12),
        "trl": "1.14.1",
        "transformers": "5.20.1",
        "torch": "2.14.1",
        "accelerate": "1.15.0",
        "peft": "0.21.2",
        "datasets": "5.0.1",
        "deepspeed": "0.19.8",
    },
}


def _axolotl_pins() -> dict:
    installed = _base(version("axolotl")) if is_available("axolotl") else None
    assert installed in AXOLOTL_VENV_PINS, f"axolotl {installed} is neither of the Axolotl venvs' versions"
    return AXOLOTL_VENV_PINS[installed]


@pytest.mark.axolotl_env
class TestAxolotlVenv:
    def test_pinned_versions(self) -> None:
        pins = dict(_axolotl_pins())
        assert sys.version_info[:2] >= pins.pop("python")
        assert {dist: _base(version(dist)) for dist in pins} == pins

    def test_our_packages_import_and_find_axolotl(self) -> None:
        import axolotl_distmatch
        import trl_ext
        from distmatch.optional import require

        assert trl_ext.__version__ == "0.1.0"
        axolotl = require("axolotl", extra="axolotl", feature="The distmatch Axolotl plugin")
        assert axolotl.__version__ in AXOLOTL_VENV_PINS
        from axolotl.integrations.base import BasePlugin

        assert issubclass(axolotl_distmatch.DistMatchPlugin, BasePlugin)

    def test_pip_check(self) -> None:
        _pip_check()


@pytest.mark.opencompass_env
class TestOpenCompassVenv:
    def test_cli_help(self) -> None:
        exe = Path(sys.executable).parent / "opencompass"
        assert exe.exists(), f"{exe} missing"
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
        assert "usage" in out.stdout.lower()

    def test_pins(self) -> None:
        from packaging.version import Version

        assert Version(version("opencompass")) == Version("0.5.4")
        assert Version(version("numpy")) < Version("2")
        assert Version(version("transformers")) < Version("5")
        assert Version(version("pyarrow")) < Version("26")

    def test_our_packages_import(self) -> None:
        import eval_tasks
        import trl_ext
        from distmatch.optional import require

        assert trl_ext.__version__ == "0.1.0"
        assert eval_tasks.__name__ == "eval_tasks"
        assert require("opencompass", extra="opencompass", feature="The OpenCompass configs").__name__ == (
            "opencompass"
        )

    def test_pip_check(self) -> None:
        # TRL >= 1.9 needs datasets >= 4.7, OpenCompass 0.5.4 pins datasets < 4: distmatch is installed with
        # --no-deps here and its TRL integration is unavailable (the losses are pure torch).
        _pip_check(tolerated=r"distmatch \S+ requires trl, which is not installed\.")
        assert not is_available("trl")


def test_the_torch_matrix_of_the_docs_is_what_the_venvs_install() -> None:
    """docs/development.md "torch versions tested": each venv's row names the torch its Makefile spec installs."""
    from tests.helpers.env import REPO_ROOT

    makefile = (REPO_ROOT / "Makefile").read_text()
    spec = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", makefile, re.M).group(1)
    latest = re.search(r"^TORCH_SPEC_LATEST \?= torch==(\S+)$", makefile, re.M).group(1)
    docs = (REPO_ROOT / "docs" / "development.md").read_text()
    table = docs[docs.index("### torch versions tested") :].split("\n\n")[1]
    rows = {row.split("|")[1].strip(): row.split("|")[3].strip() for row in table.splitlines()[2:]}
    assert rows == {
        "`.venv`": spec,
        "`.venv-axolotl`": AXOLOTL_VENV_PINS["0.19.0"]["torch"],
        "`.venv-axolotl-latest`": latest,
        "`.venv-opencompass`": spec,
        "`.venv-swift`": spec,
        "`make dist`'s clean venv": spec,
    }, rows
    assert AXOLOTL_VENV_PINS["0.21.0"]["torch"] == latest
