"""`python -m distmatch_hooks install-pth`: writes exactly the hooks' `.pth` files, removes the ones of earlier
versions, keeps `.dist-info/RECORD` true; a fresh interpreter then imports the hooks and nothing heavy.

Real files and real interpreters: a throw-away venv set up like the project's (`project_venv.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from distmatch_hooks.pth import PTH_FILES, STALE_PTH_FILES, install_pth_files, remove_stale_pth_files
from tests.helpers.env import OFFLINE_ENV, REPO_ROOT
from tests.helpers.project_venv import make_project_like_venv

#: Top-level modules a hook must not import at interpreter start (they are what the hooks wait for, or import torch).
HEAVY = (
    "trl",
    "torch",
    "transformers",
    "lm_eval",
    "axolotl",
    "yaml",
    "trl_ext",
    "eval_tasks",
    "axolotl_distmatch",
)
OLD_LINES = {name: f"import {name.removesuffix('.pth')}\n" for name in STALE_PTH_FILES}


def _ours(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.pth") if p.name.startswith("distmatch")}


def test_pth_files_name_the_package_and_differ_from_the_old_ones():
    assert set(PTH_FILES).isdisjoint(STALE_PTH_FILES)
    for name, line in PTH_FILES.items():
        module = name.removesuffix(".pth")
        assert line == f"import {module}\n" and module.startswith("distmatch_hooks.")
    for name in STALE_PTH_FILES:  # the old top-level modules are gone
        assert not (REPO_ROOT / f"{name.removesuffix('.pth')}.py").exists()


def test_stale_files_and_rows_are_removed_and_the_record_keeps_its_line_ends(tmp_path):
    for name, line in OLD_LINES.items():
        (tmp_path / name).write_text(line)
    (tmp_path / "other.pth").write_text("import other\n")  # not ours: left alone
    record = tmp_path / "RECORD"
    record.write_bytes(
        b"".join(f"{name},,\r\n".encode() for name in STALE_PTH_FILES) + b"other.py,sha256=x,1\r\n"
    )

    removed = remove_stale_pth_files(str(tmp_path), str(record))
    written = install_pth_files(str(tmp_path), str(record))

    assert sorted(Path(p).name for p in removed) == sorted(STALE_PTH_FILES)
    assert sorted(Path(p).name for p in written) == sorted(PTH_FILES)
    assert _ours(tmp_path) == set(PTH_FILES) and (tmp_path / "other.pth").is_file()
    assert {name: (tmp_path / name).read_text() for name in PTH_FILES} == PTH_FILES
    rows = record.read_bytes().split(b"\r\n")
    assert rows[-1] == b"" and sorted(row.split(b",")[0].decode() for row in rows[:-1]) == sorted(
        [*PTH_FILES, "other.py"]
    )
    assert remove_stale_pth_files(str(tmp_path), str(record)) == []  # nothing left to remove


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    return make_project_like_venv(tmp_path_factory.mktemp("hooks_venv"), REPO_ROOT)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTMATCH_", "PYTHON"))}
    env.update(OFFLINE_ENV)
    return env


def _start(venv, tmp_path: Path) -> subprocess.CompletedProcess:
    probe = (
        "import json, sys; print(json.dumps({"
        "'hooks': sorted(m for m in sys.modules if m.split('.')[0] == 'distmatch_hooks'), "
        f"'heavy': [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}], "
        "'waiting': sorted(f.target for f in sys.meta_path if hasattr(f, 'target'))}))"
    )
    return subprocess.run(
        [str(venv.python), "-c", probe], capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120
    )


def test_install_pth_replaces_old_files_and_a_fresh_interpreter_imports_only_the_hooks(venv, tmp_path):
    for name, line in OLD_LINES.items():  # what an install of an earlier version left behind
        (venv.site_packages / name).write_text(line)
    before = _start(venv, tmp_path)
    assert all(f"No module named '{name.removesuffix('.pth')}'" in before.stderr for name in STALE_PTH_FILES)

    out = subprocess.run(
        [str(venv.python), "-m", "distmatch_hooks", "install-pth"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == sorted(
        [*(f"removed {venv.site_packages / n}" for n in STALE_PTH_FILES)]
        + [f"installed {venv.site_packages / n}" for n in PTH_FILES]
    )
    assert _ours(venv.site_packages) == set(PTH_FILES)

    after = _start(venv, tmp_path)
    assert after.returncode == 0 and after.stderr == "", after.stderr
    state = json.loads(after.stdout)
    assert state["hooks"] == sorted(
        ["distmatch_hooks", "distmatch_hooks._common", *(n.removesuffix(".pth") for n in PTH_FILES)]
    )
    assert state["heavy"] == []
    # Not `trl sft`: the TRL hook stays out; lm-eval's and Axolotl's hooks wait for their modules.
    assert state["waiting"] == sorted(
        ["lm_eval.tasks.manager", "lm_eval.evaluator", "lm_eval.config.evaluate_config"]
        + ["axolotl.cli.config", "axolotl.utils.config"]
    )


def test_install_pth_usage(venv, tmp_path):
    out = subprocess.run(
        [str(venv.python), "-m", "distmatch_hooks"], capture_output=True, text=True, env=_env(), cwd=tmp_path
    )
    assert out.returncode == 2 and out.stderr == "usage: python -m distmatch_hooks install-pth\n"
    assert out.stdout == ""
