"""The test tree's layout: every folder is a package, and the folder markers name folders and markers that exist."""

from __future__ import annotations

import pytest

from tests.conftest import FOLDER_MARKERS, TESTS_DIR, folder_markers
from tests.helpers.env import REPO_ROOT


def test_every_test_folder_is_a_package() -> None:
    """Without `__init__.py`, pytest would put tests/ itself on sys.path and tests/trl, tests/axolotl would be
    importable as `trl` / `axolotl` (namespace packages) in a venv that lacks the real one."""
    folders = [
        path
        for path in TESTS_DIR.rglob("*")
        if path.is_dir() and path.name != "__pycache__" and any(path.glob("*.py"))
    ]
    assert len(folders) >= 10
    assert [f for f in folders if not (f / "__init__.py").is_file()] == []
    assert (TESTS_DIR / "__init__.py").is_file()


def test_folder_markers_name_existing_paths_and_registered_markers() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    registered = {
        line.split(":")[0]
        for line in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
            "ini_options"
        ]["markers"]
    }
    assert {"axolotl_env", "opencompass_env", "trl_trainer", "trl_cli", "multiprocess"} <= registered
    for key, names in FOLDER_MARKERS.items():
        assert (TESTS_DIR / key).exists(), key
        assert set(names) <= registered, (key, names)


def test_the_longest_matching_path_decides() -> None:
    assert folder_markers(TESTS_DIR / "trl" / "test_trainer.py") == ("trl_trainer",)
    assert folder_markers(TESTS_DIR / "trl" / "cli" / "test_trl_sft.py") == ("trl_cli",)
    assert folder_markers(TESTS_DIR / "trl" / "test_model_forward_scaling.py") == ()
    assert folder_markers(TESTS_DIR / "axolotl" / "test_plugin.py") == ("axolotl_env",)
    assert folder_markers(TESTS_DIR / "eval" / "opencompass" / "test_configs.py") == ("opencompass_env",)
    assert folder_markers(TESTS_DIR / "eval" / "test_metrics.py") == ()
    assert folder_markers(TESTS_DIR / "trlx" / "test_x.py") == ()  # a prefix of a name is not its folder
    assert folder_markers(REPO_ROOT / "benchmarks" / "bench_losses.py") == ()  # outside tests/
