"""The mechanism the activation hooks share (`distmatch_hooks._common`) and the package's promise to `.pth` lines:
importing `distmatch_hooks` or any hook module imports nothing outside the standard library, the package itself and
the torch-free bottom layer `distmatch`.

Real imports: a module written to a temporary folder is imported through `PatchAfterImport`; the imports at
interpreter start are checked in fresh interpreters started without site-packages (`-S`).
"""

from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys

import pytest

import distmatch.errors
import distmatch_hooks
from distmatch_hooks import _common
from distmatch_hooks._common import PatchAfterImport, debug, switched_on
from distmatch_hooks.pth import PTH_FILES
from tests.helpers.env import REPO_ROOT

MODULES = ["distmatch_hooks", *(line.split()[1] for line in PTH_FILES.values())]


@pytest.mark.parametrize("module", MODULES)
def test_importing_a_hook_imports_only_the_standard_library(module):
    """What a `.pth` line costs: besides the standard library, only the package's own modules and `distmatch`."""
    probe = (
        "import json, sys; before = set(sys.modules); import importlib; importlib.import_module(sys.argv[1]); "
        "print(json.dumps(sorted(m for m in set(sys.modules) - before "
        "if m.split('.')[0] not in sys.stdlib_module_names)))"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", probe, module],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,  # `-c` puts the working directory first on sys.path: the package from the working tree
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    imported = json.loads(out.stdout)
    assert module in imported
    assert all(name.split(".")[0] in ("distmatch_hooks", "distmatch") for name in imported), imported


def test_package_exports_the_shared_names():
    assert (
        distmatch_hooks.DistMatchConfigError
        is distmatch.errors.DistMatchConfigError
        is distmatch.DistMatchConfigError
    )
    assert issubclass(distmatch_hooks.DistMatchConfigError, ValueError)
    assert distmatch_hooks.LOSS_OPTION_NAMES is _common.LOSS_OPTION_NAMES
    assert set(distmatch_hooks.__all__) == {
        "DistMatchConfigError",
        "LOSS_OPTION_NAMES",
        "LOSS_OPTION_PREFIXES",
    }


@pytest.fixture
def target(tmp_path, monkeypatch):
    """A module that is not imported yet, in a folder on sys.path."""
    name = f"_distmatch_target_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("VALUE = 41\nfrom importlib import resources as _r\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield name
    sys.modules.pop(name, None)


def test_patch_after_import_calls_back_once_then_leaves(target):
    seen = []
    finder = PatchAfterImport(target, lambda module: seen.append(module), source="test")
    finder.install()
    finder.install()  # once only
    assert sys.meta_path.count(finder) == 1 and sys.meta_path[0] is finder
    try:
        import json as _  # noqa: F401  (other imports pass through untouched)

        assert not seen and finder in sys.meta_path
        module = importlib.import_module(target)
    finally:
        finder.uninstall()
    assert seen == [module] and module.VALUE == 41
    assert finder not in sys.meta_path and finder.done
    # The module looks normally imported: the real loader, not the wrapper.
    assert type(module.__spec__.loader).__name__ == "SourceFileLoader"
    assert module.__loader__ is module.__spec__.loader


def test_patch_after_import_leaves_a_missing_module_to_the_other_finders():
    finder = PatchAfterImport("_distmatch_no_such_module", lambda module: None, source="test")
    finder.install()
    try:
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("_distmatch_no_such_module")
    finally:
        finder.uninstall()
    assert finder.done


@pytest.mark.parametrize(
    ("value", "on"), [(None, True), ("1", True), ("yes", True), ("0", False), (" Off ", False), ("NO", False)]
)
def test_switched_on(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("_DISTMATCH_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("_DISTMATCH_TEST_SWITCH", value)
    assert switched_on("_DISTMATCH_TEST_SWITCH") is on


@pytest.mark.parametrize(("value", "printed"), [(None, False), ("0", False), ("1", True), ("anything", True)])
def test_debug_prints_only_when_asked(monkeypatch, capsys, value, printed):
    if value is None:
        monkeypatch.delenv("DISTMATCH_DEBUG", raising=False)
    else:
        monkeypatch.setenv("DISTMATCH_DEBUG", value)
    debug("distmatch_hooks.test", "decided")
    err = capsys.readouterr().err
    assert (err.startswith("distmatch_hooks.test[") and err.endswith("]: decided\n")) is printed
    assert bool(err) is printed


def test_debug_writes_each_line_at_once(monkeypatch):
    """The ranks of `accelerate launch` share one stderr (unbuffered under PYTHONUNBUFFERED): a line written as text
    then newline, as `print` does there, can run into another rank's line, so each line is a single write."""

    class RecordingStream(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return super().write(text)

    stream = RecordingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setenv("DISTMATCH_DEBUG", "1")
    debug("distmatch_hooks.trl", "active in sft.py (options: --loss)")
    assert stream.writes == [f"distmatch_hooks.trl[{os.getpid()}]: active in sft.py (options: --loss)\n"]
