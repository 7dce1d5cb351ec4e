"""The project's own venvs behave like a user's install: the activation hooks a wheel ships are installed there too.

`make venvs` installs distmatch editable (no `.pth` hooks in that kind of install) and then runs
`python -m distmatch_hooks install-pth`, which writes the same `.pth` files a wheel has. Checked here in a
throw-away venv set up the same way (`tests/helpers/project_venv.py`), and in the venv running the tests.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import distmatch_hooks
from distmatch_hooks.pth import PTH_FILES, install_pth_files
from tests.helpers.env import OFFLINE_ENV, REPO_ROOT
from tests.helpers.project_venv import make_project_like_venv


def _env(tmp: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTMATCH_", "PYTHON"))}
    env.update(OFFLINE_ENV, HF_HOME=str(tmp / "hf_home"))
    return env


def test_install_pth_files_is_idempotent_and_recorded(tmp_path):
    record = tmp_path / "RECORD"
    record.write_text(f"{next(iter(PTH_FILES))},,\nother.py,sha256=x,1\n")  # one listed already
    for _ in range(2):
        written = install_pth_files(str(tmp_path), str(record))
    assert sorted(Path(p).name for p in written) == sorted(PTH_FILES)
    assert {name: (tmp_path / name).read_text() for name in PTH_FILES} == PTH_FILES
    rows = [row.split(",")[0] for row in record.read_text().splitlines()]
    assert sorted(rows) == sorted([*PTH_FILES, "other.py"])  # each once: `pip uninstall` removes them


def test_every_pth_file_imports_a_shipped_hook_module():
    import tomllib

    packages = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for name, line in PTH_FILES.items():
        module = name.removesuffix(".pth")
        package, _, submodule = module.partition(".")
        assert line == f"import {module}\n" and package in packages["find"]["include"]
        assert (REPO_ROOT / package / f"{submodule}.py").is_file()
    assert distmatch_hooks.__name__ in packages["find"]["include"]


@pytest.fixture(scope="module")
def project_venv(tmp_path_factory):
    return make_project_like_venv(tmp_path_factory.mktemp("project_venv"), REPO_ROOT)


def test_install_step_writes_the_hooks_into_the_venv(project_venv):
    for name, line in PTH_FILES.items():
        assert (project_venv.site_packages / name).read_text() == line
        assert f"installed {project_venv.site_packages / name}" in project_venv.install_output


@pytest.mark.slow
def test_readme_commands_work_in_a_venv_set_up_like_the_project(project_venv, tmp_path):
    """`trl sft --help` lists `--loss` and `lm_eval validate --tasks distmatch_nlu` finds the tasks."""
    trl = subprocess.run(
        [str(project_venv.bin / "trl"), "sft", "--help"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert trl.returncode == 0, trl.stderr[-3000:]
    assert "--loss {" in trl.stdout and "--gem_beta" in trl.stdout
    if not (project_venv.bin / "lm_eval").exists():
        pytest.skip("lm-eval is not installed in this venv")
    lm_eval = subprocess.run(
        [str(project_venv.bin / "lm_eval"), "validate", "--tasks", "distmatch_nlu"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert lm_eval.returncode == 0, (lm_eval.stdout + lm_eval.stderr)[-3000:]
    assert "All tasks found and valid" in lm_eval.stdout + lm_eval.stderr


def test_the_venv_running_the_tests_has_the_hooks():
    """`make venvs` ran the install step for this venv (re-run `make venvs` if this fails after an update)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running in a virtual environment")
    site_packages = Path(sysconfig.get_paths()["purelib"])
    missing = [name for name in PTH_FILES if not (site_packages / name).is_file()]
    assert not missing, f"{site_packages} lacks {missing}: run `make venvs`"
    trl = Path(sys.prefix) / "bin" / "trl"
    if not trl.exists():
        pytest.skip("TRL is not installed in this venv")
    out = subprocess.run(
        [str(trl), "sft", "--help"], capture_output=True, text=True, timeout=300, env={**_env(Path("/tmp"))}
    )
    assert out.returncode == 0 and "--loss {" in out.stdout, out.stderr[-3000:]
