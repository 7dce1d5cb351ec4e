"""`make test`'s machinery: the step runner's time table and budget warnings (tools/test_steps.py), the `launches`
guard that keeps `make test-quick` free of subprocesses (tests/helpers/launches.py), and the build-once fixtures the
pytest-xdist workers share (tests/helpers/once.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.env import REPO_ROOT

pytestmark = pytest.mark.launches

STEPS = REPO_ROOT / "tools" / "test_steps.py"


def _steps(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "Makefile").write_text(
        textwrap.dedent(
            """\
            fast:
            \t@echo fast ran
            slow:
            \t@sleep 1.2; echo slow ran
            broken:
            \t@echo broken ran; exit 3
            """
        )
    )
    return subprocess.run(
        [sys.executable, str(STEPS), *args], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


def test_steps_table_and_budget_warning(tmp_path: Path) -> None:
    done = _steps(tmp_path, "fast=30", "slow=1")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.index("fast ran") < out.index("slow ran") < out.index("| step | wall time | budget | result |")
    assert "| fast | 0:00 | 0:30 | passed |" in out
    assert "| slow | 0:01 (over budget) | 0:01 | passed |" in out
    warnings = [line for line in out.splitlines() if line.startswith("==> WARNING")]
    assert warnings == ["==> WARNING: slow took 0:01, over its budget of 0:01"], out
    assert out.rstrip().endswith("==> make test: lint and all test runs passed")


def test_steps_every_step_runs_after_a_failure_and_the_run_fails(tmp_path: Path) -> None:
    done = _steps(tmp_path, "broken=30", "fast=30")
    assert done.returncode == 1
    assert "broken ran" in done.stdout and "fast ran" in done.stdout
    assert "| broken | 0:00 | 0:30 | FAILED |" in done.stdout
    assert "==> make test FAILED: broken" in done.stdout


def test_steps_a_failed_first_step_stops_the_run(tmp_path: Path) -> None:
    done = _steps(tmp_path, "--first", "broken=30", "fast=30")
    assert done.returncode == 1
    assert "fast ran" not in done.stdout
    assert "==> make test FAILED: broken" in done.stdout


def test_steps_side_by_side(tmp_path: Path) -> None:
    done = _steps(tmp_path, "slow+fast=30")
    assert done.returncode == 0, done.stdout
    assert "[slow] slow ran" in done.stdout and "[fast] fast ran" in done.stdout
    assert "| slow+fast |" in done.stdout
    # a failed target fails its step, whichever side it is on
    for step in ("broken+slow=30", "slow+broken=30"):
        done = _steps(tmp_path, step)
        assert done.returncode == 1 and f"| {step.split('=')[0]} |" in done.stdout, done.stdout
        assert f"==> make test FAILED: {step.split('=')[0]}" in done.stdout


def test_steps_clock_never_shows_60_seconds() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("test_steps_tool", STEPS)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert [tool._clock(s) for s in (0.4, 59.6, 119.5, 3599.7)] == ["0:00", "1:00", "2:00", "60:00"]


def test_steps_refuse_a_step_without_budget(tmp_path: Path) -> None:
    done = _steps(tmp_path, "fast")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "tools/test_steps.py: a step is TARGET=SECONDS (or A+B=SECONDS), not 'fast'"
    ]


def _make_dry_run(target: str) -> subprocess.CompletedProcess[str]:
    """`make -n TARGET` in the repository: the recipes it would run, nothing run."""
    return subprocess.run(
        ["make", "-n", "--no-print-directory", target],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_programs_make_starts_write_bytecode_whatever_the_shell_says() -> None:
    """The venvs hold no bytecode (uv writes none; pip is told --no-compile), so a shell exporting
    PYTHONDONTWRITEBYTECODE (this machine's do) would make every process of the suite compile torch, transformers
    and TRL from source again: the Makefile unexports it for everything it starts."""
    show = "import os; print('PYTHONDONTWRITEBYTECODE=' + repr(os.environ.get('PYTHONDONTWRITEBYTECODE')))"
    done = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "--eval",
            f'dm-env-probe:\n\t@python3 -c "{show}"',
            "dm-env-probe",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "PYTHONDONTWRITEBYTECODE=None", done.stdout


def test_make_test_runs_every_step_with_a_budget() -> None:
    """`make test` is the step runner over the venv builds, lint, the release check and the five venvs' tests."""
    done = _make_dry_run("test")
    assert done.returncode == 0, done.stderr
    (runner,) = [line for line in done.stdout.splitlines() if "tools/test_steps.py" in line]
    steps = runner.split("tools/test_steps.py", 1)[1].split()
    assert steps[0] == "--first" and steps[1].startswith("venvs=")
    names = [step.split("=")[0] for step in steps[2:]]
    expected = [
        "lint",
        "dist",
        "test-core",
        "test-axolotl",
        "test-axolotl-latest",
        "test-opencompass",
        "test-swift",
    ]
    assert sorted(part for name in names for part in name.split("+")) == sorted(expected)


# ---------------------------------------------------------------------------------------------------------
# The `launches` marker: a test that starts a program without it fails; `make test-quick` leaves marked tests out

GUARDED = """\
import subprocess, sys
import pytest

def test_quiet():
    assert 1 + 1 == 2

def test_starts_python_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.launches
def test_starts_python_marked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_spawns_unmarked():
    import multiprocessing
    process = multiprocessing.get_context("spawn").Process(target=print)
    process.start()
    process.join()

def test_os_system_unmarked():
    import os
    assert os.system("true") == 0

def _tool(folder):
    import os, pathlib
    path = pathlib.Path(os.environ["GUARDED_SCRATCH"], *folder, "ptxas")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\\nexit 0\\n")
    path.chmod(0o755)
    return str(path)

def _module(folder, package=False):
    # A module at scratch/<folder>/driver.py that starts programs (Triton's layout when package=True).
    import importlib.util, os, pathlib
    root = pathlib.Path(os.environ["GUARDED_SCRATCH"], folder[0])
    path = root.joinpath(*folder[1:], "driver.py")
    path.parent.mkdir(parents=True, exist_ok=True)
    if package:
        (root / "__init__.py").write_text("")
    path.write_text("import subprocess\\ndef run(argv):\\n    return subprocess.run(argv, check=True, capture_output=True)\\n")
    spec = importlib.util.spec_from_file_location("driver_" + folder[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

def test_triton_compiles_unmarked():
    _module(["triton", "backends", "nvidia"], package=True).run([_tool(["triton", "backends", "nvidia", "bin"]), "-v"])

def test_triton_driver_lookup_unmarked():
    _module(["triton", "backends", "nvidia"], package=True).run(["/sbin/ldconfig", "-p"])

def test_ptxas_from_the_test_unmarked():
    subprocess.run([_tool(["triton", "backends", "nvidia", "bin"]), "-v"], check=True)

def test_ldconfig_elsewhere_unmarked():
    _module(["vendor", "backends", "nvidia"]).run(["/sbin/ldconfig", "-p"])

def test_not_a_triton_package_unmarked():
    _module(["plain", "triton", "backends", "amd"]).run(["/sbin/ldconfig", "-p"])
"""


def _outside_xdist() -> dict[str, str]:
    """This environment without the variables an xdist worker sets (the inner run would think it is a worker)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}


def _inner_pytest(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A pytest run of scratch test files with the project's settings and tests/conftest.py as a plugin."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(REPO_ROOT / "pyproject.toml"),
            "--rootdir",
            str(folder),
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            str(folder),
            *args,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**_outside_xdist(), **env},
    )


@pytest.fixture
def guarded_tests(tmp_path: Path) -> Path:
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    return tmp_path


def test_a_test_that_launches_without_the_marker_fails(guarded_tests: Path) -> None:
    done = _inner_pytest(guarded_tests, "-p", "no:xdist", GUARDED_SCRATCH=str(guarded_tests / "scratch"))
    out = done.stdout
    assert done.returncode == 1, out
    assert "10 passed, 6 errors" in out, out
    unmarked = ("test_starts_python_unmarked", "test_spawns_unmarked", "test_os_system_unmarked")
    elsewhere = (
        "test_ptxas_from_the_test_unmarked",
        "test_ldconfig_elsewhere_unmarked",
        "test_not_a_triton_package_unmarked",
    )
    for name in (*unmarked, *elsewhere):
        assert f"test_guarded.py::{name} started a program" in out, (name, out)
        assert "without the `launches` marker" in out
    assert "test_starts_python_marked started a program" not in out
    assert "test_quiet started a program" not in out
    assert "test_triton_compiles_unmarked started a program" not in out  # Triton's JIT assembler on a GPU
    assert "test_triton_driver_lookup_unmarked started a program" not in out  # libcuda lookup


def test_recording_lists_the_launching_tests_instead(guarded_tests: Path, tmp_path_factory) -> None:
    record = tmp_path_factory.mktemp("record") / "launches"
    done = _inner_pytest(
        guarded_tests,
        "-p",
        "no:xdist",
        "-k",
        "not triton and not ptxas and not ldconfig and not package",
        DISTMATCH_RECORD_LAUNCHES=str(record),
    )
    assert done.returncode == 0, done.stdout
    lines = Path(f"{record}.main").read_text().splitlines()
    names = sorted(line.split("\t")[0].rsplit("::", 1)[1] for line in lines)
    assert names == [
        "test_os_system_unmarked",
        "test_spawns_unmarked",
        "test_starts_python_marked",
        "test_starts_python_unmarked",
    ]


def test_quick_selection_leaves_the_marked_tests_out(guarded_tests: Path) -> None:
    done = _inner_pytest(
        guarded_tests, "-p", "no:xdist", "-m", "not launches", "-k", "quiet or starts_python_marked"
    )
    assert done.returncode == 0, done.stdout
    assert "1 passed, 9 deselected" in done.stdout, done.stdout


def test_make_test_quick_selects_no_launching_test() -> None:
    done = _make_dry_run("test-quick")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if "-m pytest" in line]
    assert "not launches" in line and "not multiprocess" in line and ".venv/bin/python" in line


# ---------------------------------------------------------------------------------------------------------
# build_once: one build per run, shared by the xdist workers; a failed build leaves nothing behind

ONCE = """\
import os
from pathlib import Path
import pytest
from tests.helpers.once import build_once

def _build(folder: Path) -> str:
    log = Path(os.environ["ONCE_LOG"])
    with log.open("a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    (folder / "made").write_text("x")
    return str(folder)

@pytest.fixture(scope="session")
def built(tmp_path_factory):
    return build_once(tmp_path_factory, "thing", _build)

@pytest.mark.parametrize("i", range(6))
def test_uses(built, i):
    assert (Path(built) / "made").read_text() == "x"
"""


@pytest.mark.parametrize(
    "workers", [["-n", "2", "--dist", "load"], ["-p", "no:xdist"]], ids=["xdist", "plain"]
)
def test_build_once_builds_once_for_all_workers(tmp_path: Path, workers: list[str]) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_once.py").write_text(ONCE)
    log = tmp_path / "log"
    done = _inner_pytest(tests, *workers, ONCE_LOG=str(log))
    assert done.returncode == 0, done.stdout
    assert "6 passed" in done.stdout
    built_by = log.read_text().splitlines()
    assert len(built_by) == 1, built_by
    assert built_by[0].startswith("gw" if "-n" in workers else "main")


def test_the_slow_modules_listed_first_exist() -> None:
    """tests/conftest.py hands these modules to the xdist workers first: a renamed one would silently go last."""
    from tests.conftest import SLOW_MODULES_FIRST, TESTS_DIR

    assert [name for name in SLOW_MODULES_FIRST if not (TESTS_DIR / name).is_file()] == []
