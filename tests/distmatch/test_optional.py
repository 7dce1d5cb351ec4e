"""Guarded optional imports: clear errors naming the extra, and no eager import of Axolotl."""

from __future__ import annotations

import subprocess
import sys

import pytest

from distmatch.optional import is_available, require

MISSING = "distmatch_surely_missing_module_0xdeadbeef"


def test_require_returns_the_module() -> None:
    import json

    assert require("json", extra="dev", feature="This test") is json


def test_require_missing_module_names_extra_and_pip_command() -> None:
    with pytest.raises(ImportError) as info:
        require(MISSING, extra="eval", feature="The frobnicator")
    message = str(info.value)
    assert message.startswith("The frobnicator needs " + MISSING + ", which is not installed.")
    assert "pip install 'distmatch[eval]'" in message
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_require_missing_submodule_of_missing_package() -> None:
    with pytest.raises(ImportError, match=r"distmatch\[opencompass\]"):
        require(MISSING + ".sub", extra="opencompass", feature="X")


def test_require_broken_module_says_it_failed_to_import(tmp_path, monkeypatch) -> None:
    (tmp_path / "distmatch_broken_mod.py").write_text("import distmatch_surely_missing_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError) as info:
        require("distmatch_broken_mod", extra="demo", feature="X")
    message = str(info.value)
    assert "installed but failed to import" in message
    assert "distmatch_surely_missing_dependency_xyz" in message
    assert "pip install 'distmatch[demo]'" in message


def test_is_available() -> None:
    assert is_available("json")
    assert is_available("distmatch.optional")
    assert not is_available(MISSING)
    assert not is_available(MISSING + ".sub")


@pytest.mark.skipif(is_available("axolotl"), reason="checks the error raised when axolotl is absent")
def test_plugin_without_axolotl_names_the_extra() -> None:
    import axolotl_distmatch

    with pytest.raises(ImportError, match=r"pip install 'distmatch\[axolotl\]'") as info:
        axolotl_distmatch.DistMatchPlugin  # noqa: B018
    assert "The distmatch Axolotl plugin needs axolotl" in str(info.value)
    with pytest.raises(ImportError, match=r"pip install 'distmatch\[axolotl\]'"):
        axolotl_distmatch.DistMatchTrainer  # noqa: B018


def test_unknown_attribute_is_attribute_error() -> None:
    import axolotl_distmatch

    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        axolotl_distmatch.NoSuchThing  # noqa: B018
    assert not hasattr(axolotl_distmatch, "NoSuchThing")


def test_importing_packages_does_not_import_optional_frameworks() -> None:
    code = (
        "import sys, distmatch, distmatch.optional, trl_ext, axolotl_distmatch, eval_tasks\n"
        "heavy = sorted(m for m in ('axolotl', 'lm_eval', 'opencompass', 'deepspeed', 'flash_attn')"
        " if m in sys.modules)\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_require_lm_eval_in_core_venv() -> None:
    from eval_tasks import require_lm_eval

    if is_available("lm_eval"):
        assert require_lm_eval().__name__ == "lm_eval"
    else:
        with pytest.raises(ImportError, match=r"distmatch\[eval\]"):
            require_lm_eval()


def test_version() -> None:
    from importlib.metadata import version

    import trl_ext

    assert trl_ext.__version__ == version("distmatch") == "0.1.0"


def test_every_named_extra_is_declared() -> None:
    """Each guarded import names an extra of pyproject.toml (a misspelt extra would send users to a failing install),
    and the extras users combine are all there."""
    import re

    import tomllib

    from tests.helpers.env import REPO_ROOT

    declared = set(
        tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    assert declared >= {"eval", "vllm", "deepspeed", "flash-attn", "axolotl", "opencompass"}
    named: dict[str, set[str]] = {}
    for package in ("distmatch", "trl_ext", "axolotl_distmatch", "eval_tasks", "distmatch_hooks"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for extra in re.findall(r"""\bextra=["']([\w-]+)["']""", text):
                named.setdefault(extra, set()).add(str(path.relative_to(REPO_ROOT)))
            for extra in re.findall(r"distmatch\[([\w-]+)\]", text):
                named.setdefault(extra, set()).add(str(path.relative_to(REPO_ROOT)))
    assert {"eval", "vllm", "deepspeed", "axolotl", "gpu"} <= set(named), named
    undeclared = {extra: files for extra, files in named.items() if extra not in declared}
    assert not undeclared, f"extras named in the code but not in pyproject.toml: {undeclared}"
