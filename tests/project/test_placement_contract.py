"""Outside audit ("noveltybench and placement round"): tests/placement.py's rows against the tests they name and the
tests' own behaviour (its docstring's contract: `launching_tests` are single tests of the file that start programs,
`launches` marks what starts programs, so that `make test-quick` leaves out only those), read from the files
themselves, not from the table.
"""

from __future__ import annotations

import ast

import pytest

from tests import placement
from tests.conftest import TESTS_DIR


def _test_functions(path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    }


def test_every_listed_launching_test_is_a_test_of_its_file() -> None:
    """A misspelt name in `launching_tests` marks nothing: the test that starts a program would run unmarked."""
    for row in placement.PLACES:
        if not row.launching_tests:
            continue
        names = _test_functions(TESTS_DIR / row.path)
        missing = [t for t in row.launching_tests if t.split("[", 1)[0] not in names]
        assert missing == [], (row.path, missing)


def test_a_novelty_test_that_starts_no_program_is_not_marked_launches(request: pytest.FixtureRequest) -> None:
    """The NoveltyBench rules and the pure report tests start no program (lm-eval in-process): `make test-quick`
    runs them; only the lm-eval run (git describe) is marked. Checked through the real conftest on this file's
    neighbours' paths, as pytest marks them."""
    from tests.conftest import launches_marked

    for name in (
        "test_noveltybench_rules.py",
        "test_audit_rules.py",
        "test_novelty_cli_report.py",
    ):
        assert not launches_marked(TESTS_DIR / "eval" / "novelty" / name, "test_anything"), name
    assert launches_marked(
        TESTS_DIR / "eval" / "novelty" / "test_novelty_tasks.py",
        "test_lm_eval_task_reports_the_rules_on_its_samples",
    )


def test_the_env_marked_tests_are_left_out_of_every_venv_step() -> None:
    """Each framework venv's tests (axolotl_env, opencompass_env, swift_env) need their own venv: the .venv steps'
    marker expression leaves out each of them."""
    from _pytest.mark.expression import Expression

    core = [s for s in placement.SELECTIONS if s.venv == placement.CORE]
    assert core
    for marker in ("axolotl_env", "opencompass_env", "swift_env"):
        for s in core:
            assert not Expression.compile(s.markers).evaluate(lambda m, marker=marker: m == marker), (
                s.target,
                marker,
            )


def test_the_kernel_contract_row_says_both_venvs() -> None:
    """tests/losses/test_kernel_contract.py runs where Triton is: .venv and .venv-axolotl (the Makefile's
    test-axolotl step names the file)."""
    row = next(r for r in placement.PLACES if r.path == "losses/test_kernel_contract.py")
    steps = {s.venv for s in placement.SELECTIONS if "tests/losses/test_kernel_contract.py" in s.paths}
    assert set(row.venvs) == {placement.CORE} | steps == {placement.CORE, placement.AXOLOTL}
