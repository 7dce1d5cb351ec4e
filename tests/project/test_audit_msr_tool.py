"""Outside audit "mutation score round": tools/mutation_score.py against its documented rules (docs/development.md
"Mutation score", the tool's docstring): the score is (killed + timed out) over the mutants that are not equivalent
and were checked; a mutant no test reaches counts as survived; a module without a result fails the goal; an
equivalent mutant counts only while its diff adds the listed line; a module's `env` reaches its mutmut run.

The scratch results are written by hand in mutmut's own format (`mutants/<file>.meta`: exit code per mutant) and read
with `--report-only`; the last test runs real mutmut on a one-function project."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.helpers.mutation_score_project import TOOL, run_tool, tiny_project

pytestmark = pytest.mark.launches  # the tool starts Python (mutmut's diffs) and mutmut


def _load():
    spec = importlib.util.spec_from_file_location("_audit_mutation_score", TOOL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ms = _load()

CONFIG = """\
[[module]]
name = "{name}"
file = "tiny/{name}.py"
tests = ["tests/test_{name}.py"]
"""


def _project(root: Path, results: dict[str, dict[str, int | None] | str]) -> Path:
    """A root with one module per entry of `results`: a dict of mutmut exit codes, or a mutmut log line (no meta)."""
    (root / "tools").mkdir(parents=True, exist_ok=True)
    (root / "tools" / "mutation_score.toml").write_text("\n".join(CONFIG.format(name=n) for n in results))
    for name, codes in results.items():
        dest = root / "build" / "mutation-score" / name
        (dest / "mutants" / "tiny").mkdir(parents=True, exist_ok=True)
        (dest / "wall.json").write_text(json.dumps({"wall_s": 61.0, "stopped": False, "rc": 0}))
        if isinstance(codes, str):
            (dest / "mutmut.log").write_text(codes + "\n")
        else:
            (dest / "mutants" / "tiny" / f"{name}.py.meta").write_text(
                json.dumps({"exit_code_by_key": codes})
            )
    return root


def _report(root: Path, capsys: pytest.CaptureFixture[str], *names: str) -> tuple[int, dict[str, list[str]]]:
    rc = ms.main(["--root", str(root), "--report-only", "--only", *names])
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        for name in names:
            if line.startswith(f"| {name} |"):
                rows[name] = [c.strip() for c in line.strip("|").split("|")]
    return rc, rows


def test_score_counts_timed_out_as_detected_and_leaves_out_the_unchecked(tmp_path, capsys) -> None:
    codes = {
        "tiny.calc.x_f__mutmut_1": 1,  # killed
        "tiny.calc.x_f__mutmut_2": 3,  # killed
        "tiny.calc.x_f__mutmut_3": 36,  # timed out
        "tiny.calc.x_f__mutmut_4": 0,  # survived
        "tiny.calc.x_f__mutmut_5": 33,  # no test reached it: survived
        "tiny.calc.x_f__mutmut_6": None,  # not checked
    }
    rc, rows = _report(_project(tmp_path, {"calc": codes}), capsys, "calc")
    # mutants, killed, survived, timed out, equivalent, not checked, score = (2 + 1) / (6 - 0 - 1) = 60 %
    assert rows["calc"][2:9] == ["6", "2", "2", "1", "0", "1", "60.0 %"]
    assert rows["calc"][9] == "1:01"
    assert rc == 1  # under the 90 % goal


def test_goal_met_only_when_every_module_has_a_score_at_or_above_it(tmp_path, capsys) -> None:
    good = {"tiny.good.x_f__mutmut_1": 1, "tiny.good.x_f__mutmut_2": 36}
    root = _project(
        tmp_path, {"good": good, "broken": "Stopping early, could not find any test case for any mutant"}
    )
    rc, rows = _report(root, capsys, "good")
    assert rows["good"][8] == "100.0 %" and rc == 0
    rc, rows = _report(root, capsys, "good", "broken")
    assert "mutmut stopped" in rows["broken"][2]
    assert rc == 1  # a module mutmut stopped before its mutants ran fails the target


def test_an_equivalent_mutant_needs_its_listed_line_added() -> None:
    entry = {"mutant": "m__mutmut_3", "changed": "return x >= high"}
    same = "--- a.py\n+++ a.py\n@@ -1 +1 @@\n-    return x > high\n+    return x >= high\n"
    renumbered = "--- a.py\n+++ a.py\n@@ -1 +1 @@\n-    return x * k + 1\n+    return x * k - 1\n"
    removed = "--- a.py\n+++ a.py\n@@ -1 +1 @@\n-    return x >= high\n+    return x > high\n"
    assert ms.still_equivalent(same, entry) is True
    assert ms.still_equivalent(renumbered, entry) is False
    assert ms.still_equivalent(removed, entry) is False


SOURCE = "def double(x):\n    return 2 * x\n"
TESTS = """\
import os

from tiny.calc import double


def test_double():
    assert os.environ.get("AUDIT_MODULE_ENV") == "yes"  # the module's `env` reached the run
    assert double(3) == 6
"""


def test_a_modules_env_reaches_its_mutmut_run(tmp_path) -> None:
    config = (
        '[[module]]\nname = "calc"\nfile = "tiny/calc.py"\ntests = ["tests/test_calc.py"]\n'
        'env = { AUDIT_MODULE_ENV = "yes" }\ntimeout = 200\n'
    )
    root = tiny_project(tmp_path / "proj", SOURCE, TESTS, config)
    out = run_tool(root, "--jobs", "1", unset=("AUDIT_",))
    row = [line for line in out.stdout.splitlines() if line.startswith("| calc |")]
    assert row, out.stdout + out.stderr
    cells = [c.strip() for c in row[-1].strip("|").split("|")]
    assert "mutmut stopped" not in cells[2], cells  # the clean run passed: it saw the variable
    assert cells[8] == "100.0 %", cells
    assert out.returncode == 0
