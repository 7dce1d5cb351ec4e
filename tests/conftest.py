"""Shared pytest set-up: offline everything, the repository root, and the markers each test gets (from the table in
tests/placement.py: which venv runs which tests, and why).

Every folder under tests/ is a package (`__init__.py`), so a test module is imported as `tests.<folder>.<name>` with
the repository root on sys.path: folder names (`trl`, `axolotl`) never shadow the installed packages, and two folders
may hold files of the same name. Shared helpers: `from tests.helpers.tiny_model import build_tiny_llama`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.helpers import launches
from tests.helpers.cli import WheelVenv, build_wheel_venv
from tests.helpers.collection import module_could_match
from tests.helpers.env import OFFLINE_ENV, REPO_ROOT, extensions_dir
from tests.helpers.once import build_once
from tests.helpers.warm_cli import WarmCli
from tests.placement import FOLDER_MARKERS, LAUNCHING_PATHS, LAUNCHING_TESTS, ONE_STACK_TESTS

# Set before any test module imports transformers / datasets / axolotl: no network in tests.
for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)
# One DeepSpeed op build per venv, shared by every launch of the run (tests/helpers/env.py).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())


TESTS_DIR = Path(__file__).resolve().parent


def _relative(path: Path) -> str | None:
    """`path` relative to tests/ (POSIX form); None outside tests/."""
    try:
        return path.resolve().relative_to(TESTS_DIR).as_posix()
    except ValueError:
        return None


def _listed(relative: str, keys: Iterable[str]) -> list[str]:
    """The keys (paths under tests/, folders or files) that are `relative` or a folder holding it."""
    return [key for key in keys if relative == key or relative.startswith(key + "/")]


def folder_markers(path: Path) -> tuple[str, ...]:
    """The FOLDER_MARKERS entry for a test file: its longest matching path under tests/ (none outside tests/)."""
    relative = _relative(path)
    if relative is None:
        return ()
    matches = _listed(relative, FOLDER_MARKERS)
    return FOLDER_MARKERS[max(matches, key=len)] if matches else ()


def launches_marked(path: Path, name: str) -> bool:
    """Whether the test `name` (its function's name) in `path` is listed as starting other programs."""
    relative = _relative(path)
    if relative is None:
        return False
    return bool(_listed(relative, LAUNCHING_PATHS)) or name in LAUNCHING_TESTS.get(relative, ())


# The longest modules (minutes each: multi-process runs, many `trl sft` / `lm_eval` launches) are handed out first, so
# that pytest-xdist's two workers do not end with one of them running alone (`--dist loadscope` keeps a module on one
# worker and hands modules out in collection order). Order only: every module still runs all its tests in its order.
SLOW_MODULES_FIRST = (
    "trl/cli/test_trl_sft.py",
    "distributed/test_trl_distributed.py",
    "benchmarks/test_benchmarks.py",
    "trl/cli/test_trl_faults.py",
    "trl/cli/test_trl_resume.py",
    "eval/lm_eval_tasks/test_preflight.py",
    "distributed/test_zero3_fused.py",
    "axolotl/test_trainer.py",
    "axolotl/test_plugin.py",
    "axolotl/test_resume.py",
    "demo/test_demo.py",
    "distributed/test_fsdp2.py",
    "project/test_project_venvs.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        relative = _relative(item.path)
        return (
            SLOW_MODULES_FIRST.index(relative) if relative in SLOW_MODULES_FIRST else len(SLOW_MODULES_FIRST)
        )

    items.sort(key=rank)  # stable: the order within a module, and of the other modules, is kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test module, and the libraries they import, is loaded now and lives until the end: `gc.freeze()` takes
    these objects out of the cyclic collector's scans. The frameworks call `gc.collect()` often inside a training run
    (Axolotl's packing sampler for every batch plan, accelerate when it clears the device cache), and in a pytest
    process holding torch, transformers, TRL, Axolotl and lm-eval each call took about 0.45 s: three quarters of an
    in-process Axolotl training test. Nothing is skipped: what the tests create is collected as before; only the
    objects alive at this point are taken as alive for good."""
    gc.collect()
    gc.freeze()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave a test module unimported when none of its tests can match `-m` (tests/helpers/collection.py): each
    venv's run then imports only the frameworks of the tests it runs."""
    markexpr = config.getoption("markexpr")
    # DISTMATCH_COLLECT_ALL=1 imports every module (tests/project/test_collection.py compares the two).
    if not markexpr or os.environ.get("DISTMATCH_COLLECT_ALL") == "1":
        return None
    relative = _relative(collection_path)
    if relative is None or not (relative.endswith(".py") and collection_path.name.startswith("test_")):
        return None
    launching = bool(_listed(relative, LAUNCHING_PATHS))
    certain = set(folder_markers(collection_path)) | ({launches.MARKER} if launching else set())
    # The marks pytest_itemcollected adds to single tests.
    possible = {launches.MARKER} if relative in LAUNCHING_TESTS else set()
    possible |= {"one_stack"} if relative in ONE_STACK_TESTS else set()
    return None if module_could_match(collection_path, markexpr, certain, possible) else True


def pytest_itemcollected(item: pytest.Item) -> None:
    for name in folder_markers(item.path):
        item.add_marker(name)
    if launches_marked(item.path, getattr(item, "originalname", item.name)):
        item.add_marker(launches.MARKER)
    if item.name in ONE_STACK_TESTS.get(_relative(item.path) or "", {}):
        item.add_marker("one_stack")


# `launches`: a test that starts another program must carry the marker (tests/helpers/launches.py); with
# DISTMATCH_RECORD_LAUNCHES=<file> the run lists the launching tests there instead of failing them.
launches.install()
_RECORD_LAUNCHES = os.environ.get("DISTMATCH_RECORD_LAUNCHES")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    launches.start(item.nodeid)
    try:
        yield
    finally:
        launches.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    command = launches.launched.get(item.nodeid)
    if call.when != "teardown" or command is None or _RECORD_LAUNCHES or not report.passed:
        return
    if item.get_closest_marker(launches.MARKER) is None:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started a program ({command}) without the `{launches.MARKER}` marker: give it the "
            "marker (tests/placement.py: `launches` or `launching_tests` in its row, or @pytest.mark.launches) so that "
            "`make test-quick` leaves it out"
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _RECORD_LAUNCHES:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        lines = "".join(f"{nodeid}\t{command}\n" for nodeid, command in sorted(launches.launched.items()))
        Path(f"{_RECORD_LAUNCHES}.{worker}").write_text(lines)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the folder holding pyproject.toml)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> WheelVenv:
    """Our wheel installed in a fresh venv (built once per test run, shared by the xdist workers; the TRL CLI and
    distributed tests use it)."""
    return build_once(tmp_path_factory, "wheel", build_wheel_venv)


@pytest.fixture(scope="session")
def warm_cli(wheel_venv: WheelVenv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmCli]:
    """`run_cli` for the refusal tests of the wheel venv's commands, forked from a warm interpreter
    (tests/helpers/warm_cli.py: each program's first command also runs cold, and the two must agree)."""
    cli = WarmCli(wheel_venv.python, tmp_path_factory.mktemp("warm_cli"))
    yield cli
    cli.close()
