"""`make mutation-score` (tools/mutation_score.py) on a tiny project of its own: real mutmut 3 runs, real git.

The tool's documented rules (docs/development.md "Mutation score"), each checked on what mutmut really produced:
the counts per module, a survivor's diff in survivors.txt, the exit status against the 90 % goal, an equivalent
mutant counted only while its diff still adds the listed line, `--report-only` re-reading the last run, a module
that runs in another venv, and a mutant no test reaches counted as survived.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.mutation_score_project import run_tool, tiny_project

pytestmark = pytest.mark.launches  # git and the tool (which starts mutmut)

# `scale` is tested exactly; `above` only far from its bound (x >= high survives); `unused` by
# nothing (its mutants are survivors no test reaches).
SOURCE = """\
def scale(x, k):
    return x * k + 1


def above(x, high):
    return x > high


def unused(x):
    return x - 1
"""
TESTS = """\
from tiny.calc import above, scale


def test_scale():
    assert scale(3, 4) == 13
    assert scale(0, 5) == 1


def test_above():
    assert above(50, 10) is True
    assert above(2, 10) is False
"""
CONFIG = """\
[defaults]
timeout = 300

[[module]]
name = "calc"
file = "tiny/calc.py"
tests = ["tests/test_calc.py"]
"""


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_project(
        tmp_path_factory.mktemp("tiny_project"), SOURCE, TESTS, CONFIG, "build/\n.venv-other/\n"
    )


def _row(stdout: str, name: str = "calc") -> list[str]:
    rows = [line for line in stdout.splitlines() if line.startswith(f"| {name} |")]
    assert rows, stdout
    return [cell.strip() for cell in rows[-1].strip("|").split("|")]


@pytest.fixture(scope="module")
def first_run(project: Path) -> subprocess.CompletedProcess[str]:
    return run_tool(project, "--jobs", "1")


def test_a_run_counts_each_mutant_once_and_fails_under_the_goal(
    project: Path, first_run: subprocess.CompletedProcess[str]
) -> None:
    assert first_run.returncode == 1, first_run.stdout + first_run.stderr
    name, file, mutants, killed, survived, timed_out, equivalent, unchecked, score, wall = _row(
        first_run.stdout
    )
    assert (name, file) == ("calc", "`tiny/calc.py`")
    assert int(mutants) == int(killed) + int(survived) + int(timed_out) + int(equivalent) + int(unchecked)
    assert (int(timed_out), int(equivalent), int(unchecked)) == (0, 0, 0)
    assert int(killed) >= 3 and int(survived) >= 2  # scale's operators; above's `>=`, unused's mutants
    assert score == f"{100 * int(killed) / int(mutants):.1f} %"
    assert ":" in wall
    assert "==> below 90 % (or no result): calc" in first_run.stdout
    # the report is written beside the scratch copies; nothing is written into the project's own files
    assert (project / "build" / "mutation-score" / "report.md").read_text().strip() in first_run.stdout
    assert (project / "tiny" / "calc.py").read_text() == SOURCE


def test_survivors_are_listed_with_their_diffs(
    project: Path, first_run: subprocess.CompletedProcess[str]
) -> None:
    survivors = (project / "build" / "mutation-score" / "calc" / "survivors.txt").read_text()
    assert "+    return x >= high" in survivors  # above's bound: no test at x == high
    assert "tiny.calc.x_unused__mutmut_" in survivors  # a mutant no test reaches is a survivor
    for mutant in (line.split()[1] for line in survivors.splitlines() if line.startswith("### ")):
        assert f"- {mutant}" in first_run.stdout


def _survivor(project: Path, added: str) -> str:
    """The name of the survivor whose diff adds `added`."""
    text = (project / "build" / "mutation-score" / "calc" / "survivors.txt").read_text()
    for block in text.split("### ")[1:]:
        if f"\n+{added}\n" in block.replace("+    ", "+"):
            return block.split()[0]
    raise AssertionError(f"no survivor adds {added!r}:\n{text}")


def test_an_equivalent_mutant_counts_only_while_its_diff_adds_the_listed_line(
    project: Path, first_run: subprocess.CompletedProcess[str]
) -> None:
    bound = _survivor(project, "return x >= high")
    before = _row(first_run.stdout)
    equivalent = project / "tools" / "mutation_equivalent.toml"
    try:
        equivalent.write_text(
            f'[[equivalent]]\nmutant = "{bound}"\nchanged = "return x >= high"\nwhy = "x"\n'
        )
        listed = run_tool(project, "--report-only")
        row = _row(listed.stdout)
        assert (int(row[4]), int(row[6])) == (int(before[4]) - 1, 1)  # one survivor fewer, one equivalent
        assert f"- {bound}" not in listed.stdout
        judged = int(row[2]) - 1
        assert row[8] == f"{100 * int(row[3]) / judged:.1f} %"
        # the same name listed with another line: a renumbered mutant is triaged again
        equivalent.write_text(
            f'[[equivalent]]\nmutant = "{bound}"\nchanged = "return x > high + 1"\nwhy = "x"\n'
        )
        stale = run_tool(project, "--report-only")
        assert _row(stale.stdout)[4:7] == before[4:7] and f"- {bound}" in stale.stdout
    finally:
        equivalent.unlink(missing_ok=True)


def test_the_goal_is_met_when_every_mutant_is_killed(project: Path, first_run) -> None:
    work = project.parent / "tiny_project_full"
    shutil.copytree(project, work, symlinks=True)
    (work / "tiny" / "calc.py").write_text(SOURCE.split("\n\n\ndef unused")[0] + "\n")
    (work / "tests" / "test_calc.py").write_text(TESTS + "    assert above(10, 10) is False\n")
    _git(work, "add", "-A")
    done = run_tool(work, "--jobs", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    row = _row(done.stdout)
    assert int(row[4]) == 0 and row[8] == "100.0 %" and "below 90" not in done.stdout


def test_a_module_in_another_venv_needs_mutmut_there(project: Path) -> None:
    work = project.parent / "tiny_project_venv"
    shutil.copytree(project, work, symlinks=True)
    config = work / "tools" / "mutation_score.toml"
    config.write_text(CONFIG.replace('name = "calc"', 'name = "calc"\nvenv = ".venv-other"'))
    (work / ".venv-other" / "bin").mkdir(parents=True)
    refused = run_tool(work, "--report-only")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "tools/mutation_score.toml: module 'calc' runs in .venv-other, which has no mutmut: "
        "`make mutation-score` installs it there"
    )


def test_an_unknown_module_is_refused_before_any_work(project: Path) -> None:
    refused = run_tool(project, "--only", "nope")
    assert refused.returncode == 2 and "unknown module(s): ['nope']; known: ['calc']" in refused.stderr
