"""tests/placement.py, the one table of where each test runs, says what the Makefile and tests/conftest.py do: its
selections are the Makefile's `pytest_run` calls, each row's venvs are what those selections give for its markers,
every test folder has a row, and docs/development.md's recipe for adding a test puts a new file where the table says
(checked by collecting a scratch copy's tests with each venv's marker expression, through the real conftest)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from _pytest.mark.expression import Expression

from tests import placement
from tests.conftest import TESTS_DIR, folder_markers
from tests.helpers.env import REPO_ROOT

MAKEFILE = REPO_ROOT / "Makefile"


def _split_arguments(text: str) -> list[str]:
    """A `$(call ...)`'s arguments: split at commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    return [*parts, current]


def makefile_selections() -> set[placement.Selection]:
    """The Makefile's `pytest_run` calls, with its variables (`$(VENV)`, `$(NOT_ENV_MARKED)`) resolved."""
    text = MAKEFILE.read_text(encoding="utf-8")
    variables = dict(re.findall(r"^([A-Z_]+) *[:?]?= *(.*)$", text, flags=re.MULTILINE))

    def resolve(value: str) -> str:
        return re.sub(r"\$\(([A-Z_]+)\)", lambda m: resolve(variables[m.group(1)]), value).strip()

    found, target = set(), None
    for line in text.splitlines():
        rule = re.match(r"^([a-z][a-z-]*):", line)
        if rule:
            target = rule.group(1)
        call = re.match(r"^\t\$\(call pytest_run,(.*)\)$", line)
        if call:
            venv, markers, paths, *_ = [*_split_arguments(call.group(1)), "", ""]
            found.add(
                placement.Selection(target, resolve(venv), resolve(markers), tuple(resolve(paths).split()))
            )
    return found


def test_the_makefile_runs_the_tables_selections() -> None:
    assert makefile_selections() == set(placement.SELECTIONS)


def _row_marks(row: placement.Place) -> set[str]:
    """The marks conftest gives a test of the row (a file in it, for a folder), `one_stack` aside (single tests)."""
    path = TESTS_DIR / row.path
    probe = path if row.path.endswith(".py") else path / "test_probe.py"
    marks = set(folder_markers(probe))
    relative = probe.relative_to(TESTS_DIR).as_posix()
    if any(relative == p or relative.startswith(p + "/") for p in placement.LAUNCHING_PATHS):
        marks.add("launches")
    return marks


def _selected(selection: placement.Selection, relative: str, marks: set[str]) -> bool:
    in_paths = not selection.paths or any(
        f"tests/{relative}" == p or f"tests/{relative}".startswith(p + "/") for p in selection.paths
    )
    return in_paths and Expression.compile(selection.markers).evaluate(lambda name: name in marks)


def test_each_rows_venvs_are_what_the_selections_give() -> None:
    for row in placement.PLACES:
        marks = _row_marks(row)
        venvs = {
            s.venv for s in placement.SELECTIONS if s.target != "test-quick" and _selected(s, row.path, marks)
        }
        assert venvs == set(row.venvs), (row.path, sorted(marks), sorted(venvs))


def test_every_test_folder_has_a_row_and_every_row_exists() -> None:
    rows = {row.path for row in placement.PLACES}
    folders = {
        path.parent.relative_to(TESTS_DIR).as_posix()
        for path in TESTS_DIR.rglob("test_*.py")
        if "helpers" not in path.parts
    }
    assert sorted(folders - rows) == [], "a test folder without a row in tests/placement.py"
    assert [row for row in sorted(rows) if not (TESTS_DIR / row).exists()] == []
    assert len(rows) == len(placement.PLACES), "a path has two rows"
    for row in placement.PLACES:
        assert row.why and row.venvs, row.path
        assert row.markers is not None or row.path.endswith(".py"), (
            f"{row.path}: a folder row sets its markers"
        )


def _collected(root: Path, selection: placement.Selection, test_file: str) -> bool:
    """Whether pytest, run as the selection's `make` step runs it (its marker expression and paths), collects the
    scratch copy's `test_file`."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-q",
            "-m",
            selection.markers,
        ]
        + list(selection.paths or ["tests"]),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode in (0, 5), result.stdout + result.stderr
    return f"{test_file}::test_probe" in result.stdout


def test_the_documented_recipe_puts_a_new_test_where_the_table_says(tmp_path: Path) -> None:
    """docs/development.md's three lines, followed for a new TRL trainer test: the file goes into tests/trl/ and
    nothing else changes; each `make` step's selection then collects it exactly where the table's `trl` row says
    (`.venv` and `.venv-axolotl`, and `make test-quick`, since it starts no program)."""
    recipe = (REPO_ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    start = recipe.index("### How to add a test to the right venv")
    assert "tests/placement.py" in recipe[start : start + 1500]

    (tmp_path / "tests").mkdir()
    for name in ("__init__.py", "conftest.py", "placement.py"):
        shutil.copy2(TESTS_DIR / name, tmp_path / "tests" / name)
    shutil.copytree(
        TESTS_DIR / "helpers", tmp_path / "tests" / "helpers", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy2(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    folder = tmp_path / "tests" / "trl"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "test_new_feature.py").write_text("def test_probe() -> None:\n    assert True\n")

    (row,) = [row for row in placement.PLACES if row.path == "trl"]
    assert row.venvs == (".venv", ".venv-axolotl")
    test_file = "tests/trl/test_new_feature.py"
    for selection in placement.SELECTIONS:
        expected = (selection.venv in row.venvs) and _selected(
            selection, "trl/test_new_feature.py", {"trl_trainer"}
        )
        if selection.paths and not expected:
            continue  # a selection of other files: nothing to collect
        assert _collected(tmp_path, selection, test_file) == expected, selection
