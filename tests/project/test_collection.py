"""The collection filter (tests/helpers/collection.py): a module is left unimported only when none of its tests can
match `-m`, so every venv's run selects exactly the tests it selected when every module was imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ONE_STACK_TESTS
from tests.helpers.collection import could_match, marks_named_in
from tests.helpers.env import REPO_ROOT


@pytest.mark.parametrize(
    ("markexpr", "certain", "possible", "expected"),
    [
        ("loss_library", {"loss_library"}, set(), True),
        ("loss_library", {"trl_cli", "launches"}, set(), False),
        ("axolotl_env or trl_cli", set(), {"axolotl_env"}, True),  # one test marked in the module
        ("not launches", {"launches"}, set(), False),  # a launching folder
        ("not launches", set(), {"launches"}, True),  # single launching tests: the others match
        ("not axolotl_env and not slow", set(), {"slow"}, True),
        ("not axolotl_env and not slow", {"axolotl_env"}, {"slow"}, False),
        ("trl_cli and not multiprocess", {"trl_cli"}, {"multiprocess"}, True),
        ("trl_cli and multiprocess", {"trl_cli"}, set(), False),
        ("slow(reason='x')", set(), set(), True),  # keyword arguments: not judged, collected
    ],
)
def test_could_match(markexpr: str, certain: set[str], possible: set[str], expected: bool) -> None:
    assert could_match(markexpr, certain, possible) is expected


def test_marks_named_in_the_source() -> None:
    source = (
        "pytestmark = pytest.mark.slow\n@pytest.mark.axolotl_env\ndef test_a(): ...\n"
        "@pytest.mark.parametrize('x', [pytest.param(1, marks=pytest.mark.launches)])\ndef test_b(x): ...\n"
    )
    assert marks_named_in(source) == {"slow", "axolotl_env", "parametrize", "launches"}
    assert (
        marks_named_in("request.applymarker(pytest.mark.slow)") is None
    )  # applied at run time: always collected
    assert marks_named_in("m = getattr(pytest.mark, name)") is None


def _collected(markexpr: str, collect_all: bool) -> list[str]:
    env = dict(os.environ, DISTMATCH_COLLECT_ALL="1" if collect_all else "0", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "--collect-only", "-q"]
    cmd += ["-m", markexpr, "tests/trl", "tests/axolotl", "tests/project", "tests/losses/test_specs.py"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sorted(line for line in proc.stdout.splitlines() if "::" in line)


def test_the_filter_selects_what_importing_every_module_selects() -> None:
    """Folder markers, a mark written on one test (tests/project/test_environments.py), launching paths: the same
    node ids with and without the filter."""
    markexpr = "axolotl_env or trl_cli"
    filtered = _collected(markexpr, collect_all=False)
    assert any("test_environments.py" in nodeid for nodeid in filtered)  # its one `axolotl_env` test
    assert any(nodeid.startswith("tests/trl/cli/") for nodeid in filtered)
    assert filtered == _collected(markexpr, collect_all=True)
    # every test ONE_STACK_TESTS names exists (a renamed one would silently run on TRL 1.9 again)
    named = {f"tests/{path}::{name}" for path, names in ONE_STACK_TESTS.items() for name in names}
    assert named <= set(filtered), sorted(named - set(filtered))
    # and each carries the mark (parametrized ones too), so that .venv-axolotl leaves exactly these out
    assert _collected("one_stack", collect_all=False) == sorted(named)
    # and the test each names as its cover on TRL 1.9 exists and runs there (is not one_stack itself)
    for path, names in ONE_STACK_TESTS.items():
        for name, cover in names.items():
            if cover.startswith("("):  # a reason, no test: a path TRL never sees
                continue
            if cover.startswith("["):  # another parameter of the same test
                cover = name.split("[")[0] + cover
            file = (
                f"tests/{path.rsplit('/', 1)[0]}/{cover.split('::')[0]}" if "::" in cover else f"tests/{path}"
            )
            nodeid = f"{file}::{cover.split('::')[-1]}"
            assert nodeid in filtered and nodeid not in named, (name, nodeid)
