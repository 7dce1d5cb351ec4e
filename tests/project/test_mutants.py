"""The mutation check's lists (`tools/mutants/*.toml`, run by `make mutants`) still match the code, and the runner
tells caught from survived.

Fast and part of `make test`: every mutant's `old` string occurs exactly once in its file, its test paths exist and
its venv is one of the project's, so a refactor that moves the code fails here instead of silently turning a mutant
into a no-op.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module

if sys.version_info < (3, 11):  # tomllib
    pytest.skip("tools/mutants.py needs Python >= 3.11 (tomllib)", allow_module_level=True)


def _tool():
    return load_module("distmatch_mutants", REPO_ROOT / "tools" / "mutants.py")


def test_every_mutant_still_applies_exactly_once() -> None:
    tool = _tool()
    mutants = tool.load_mutants()
    assert len(mutants) >= 15
    assert tool.problems(mutants) == []
    areas = {m.area for m in mutants}
    assert {"loss math", "reduction", "model forward", "trainer", "axolotl", "evaluation"} <= areas


def test_a_rotten_entry_is_reported(tmp_path: Path) -> None:
    tool = _tool()
    (tmp_path / "tests").mkdir()
    (tmp_path / "a.py").write_text("x = 1\nx = 1\n")
    listed = tmp_path / "m.toml"
    listed.write_text(
        '[[mutant]]\nid = "twice"\narea = "a"\nwhat = "w"\nfile = "a.py"\nold = "x = 1"\nnew = "x = 2"\n'
        'venv = ".venv"\ntests = ["tests/test_gone.py"]\n'
        '[[mutant]]\nid = "gone"\narea = "a"\nwhat = "w"\nfile = "b.py"\nold = "y"\nnew = "z"\n'
        'venv = ".venv"\ntests = ["tests"]\n'
    )
    found = tool.problems(tool.load_mutants(listed), root=tmp_path)
    assert found == [
        "twice: `old` occurs 2 times in a.py (must be exactly once)",
        "twice: test path tests/test_gone.py does not exist",
        "gone: b.py does not exist",
    ]
    listed.write_text(listed.read_text().replace('venv = ".venv"', 'venv = "venv2"', 1))
    with pytest.raises(ValueError, match="venv must be one of"):
        tool.load_mutants(listed)


def test_every_named_test_path_and_selection_exists() -> None:
    """Each mutant's test paths (a node id's file part) are test files, not folders (a mutant runs only the tests
    that cover its file, which keeps `make mutants` practical), a node id's test function is defined in its file,
    and every word of a `-k` expression occurs in one of the named files, so a moved or renamed test cannot leave a
    mutant running nothing (pytest exit 5 would show only when `make mutants` runs)."""
    mutants = _tool().load_mutants()
    for m in mutants:
        paths, keywords = [], []
        args = iter(m.tests)
        for arg in args:
            if arg == "-k":
                keywords.append(next(args))
            elif not arg.startswith("-"):
                paths.append(arg)
        assert paths, m.id
        texts = []
        for arg in paths:
            file, _, node = arg.partition("::")
            path = REPO_ROOT / file
            assert path.is_file(), (
                f"{m.id}: {file} is not a test file (a folder runs more than covers {m.file})"
            )
            text = path.read_text(encoding="utf-8")
            texts.append(text)
            if node:
                function = node.split("::")[-1].split("[")[0]
                assert f"def {function}(" in text, f"{m.id}: {function} is not defined in {file}"
        for expression in keywords:
            for word in expression.replace("(", " ").replace(")", " ").split():
                if word not in ("and", "or", "not"):
                    assert any(word in text for text in texts), (
                        f"{m.id}: -k {word!r} matches nothing in {paths}"
                    )


def test_setup_is_read_and_a_missing_setup_script_is_reported(tmp_path: Path) -> None:
    tool = _tool()
    (tmp_path / "a.py").write_text("x = 1\n")
    listed = tmp_path / "m.toml"
    listed.write_text(
        '[[mutant]]\nid = "gen"\narea = "a"\nwhat = "w"\nfile = "a.py"\nold = "x = 1"\nnew = "x = 2"\n'
        'venv = ".venv"\nsetup = ["tools/gen.py", "--quiet"]\ntests = ["tests"]\n'
    )
    (mutant,) = tool.load_mutants(listed)
    assert mutant.setup == ("tools/gen.py", "--quiet")
    assert tool.problems([mutant], root=tmp_path) == ["gen: setup script tools/gen.py does not exist"]
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "gen.py").write_text("")
    assert tool.problems([mutant], root=tmp_path) == []
    (listed_mutant,) = [m for m in tool.load_mutants() if m.id == "nlu_group_weighted_by_size"]
    assert listed_mutant.setup == ("tools/generate.py",)


#: Which list guards which code (tools/mutants/README.md's table): the first prefix of an entry's `file` that
#: matches names the lists it may be in. The evaluation's families and layers share one prefix (the family packages
#: move under eval_tasks/), so either evaluation list is accepted there.
LIST_OF_PREFIX = (
    (("docs/", "README.md", "Makefile"), {"docs"}),
    (("eval_tasks/sandbox/",), {"sandbox"}),
    (("eval_tasks/",), {"evaluation", "evaluation_families"}),
    (("trl_ext/losses/objectives/", "trl_ext/losses/validation.py"), {"losses"}),
    (("trl_ext/losses/",), {"fused"}),
    (("trl_ext/",), {"training"}),
    (("axolotl_distmatch/",), {"axolotl"}),
    (("distmatch_hooks/",), {"hooks"}),
    (("distmatch/",), {"distmatch"}),
    (("tools/gpu_check", "benchmarks/"), {"gpu_check"}),
    (("tools/", "tests/"), {"tools"}),
)


def test_mutants_listed_per_code_area_read_from_the_folder() -> None:
    """Every `*.toml` is read; each list is named after the code it guards (never after the round that wrote it: no
    `audit`, `round` or number in the name), each entry sits in the list of its `file`'s area, and an entry planted
    by an outside audit names its round as data (`audit = "<name> round[ N]"`)."""
    tool = _tool()
    files = sorted(p.stem for p in tool.MUTANTS_DIR.glob("*.toml"))
    per_file = {f: tool.load_mutants(tool.MUTANTS_DIR / f"{f}.toml") for f in files}
    mutants = tool.load_mutants()
    assert len(files) >= 6 and len(mutants) == sum(len(listed) for listed in per_file.values())
    for name in files:
        assert not re.search(r"audit|round|\d", name), f"tools/mutants/{name}.toml is named after a round"
    for name, listed in per_file.items():
        for m in listed:
            lists = next((lists for prefixes, lists in LIST_OF_PREFIX if m.file.startswith(prefixes)), None)
            assert lists is not None, (
                f"{m.id}: no list guards {m.file} (add a row to LIST_OF_PREFIX and the README)"
            )
            assert name in lists, f"{m.id} ({m.file}) is in {name}.toml, belongs in {sorted(lists)}"
    audits = {m.audit for m in mutants} - {""}
    assert {"training round 1", "evaluation round 2", "tiles round"} <= audits
    for audit in audits:
        assert re.fullmatch(r"[A-Za-z][A-Za-z -]* round( \d+)?", audit), audit
    packages = {m.file.split("/")[0] for m in mutants}
    assert {
        "distmatch",
        "trl_ext",
        "axolotl_distmatch",
        "distmatch_hooks",
        "eval_tasks",
        "tools",
        "docs",
    } <= packages


def test_only_exit_one_counts_as_caught() -> None:
    tool = _tool()
    assert tool.verdict(1) == "caught" and tool.verdict(0) == "SURVIVED"
    for rc in (2, 3, 4, 5, 124):  # usage/internal error, setup failed, no tests collected, timeout
        assert tool.verdict(rc).startswith("ERROR")


def _mini_repo(root: Path) -> None:
    """A git repository with one module, its test, and two mutants: one its test catches, one it cannot see."""
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\ndef unused():\n    return 1\n")
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (root / "tools" / "mutants").mkdir(parents=True)
    entry = 'area = "a"\nwhat = "w"\nfile = "calc.py"\nvenv = ".venv"\ntests = ["tests/test_calc.py"]\n'
    (root / "tools" / "mutants" / "calc.toml").write_text(
        f'[[mutant]]\nid = "add_subtracts"\nold = "a + b"\nnew = "a - b"\n{entry}'
        f'[[mutant]]\nid = "unused_changed"\nold = "return 1"\nnew = "return 2"\n{entry}'
    )
    (root / ".venv").symlink_to(Path(sys.executable).parent.parent)
    (root / ".gitignore").write_text(".venv\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "mini"]):
        subprocess.run([*git, *args], cwd=root, check=True)


@pytest.mark.parametrize("jobs", [1, 2])
def test_parallel_run_reports_caught_and_survived_and_leaves_the_tree_alone(
    jobs: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner itself, on a two-module repository: both mutants run side by side in their own copies, the caught
    one and the survivor are told apart (with one job, the second runs in the copy the first used), the exit status is 1 (not all caught), the working tree is untouched, and
    `--since` selects by changed file."""
    tool = _tool()
    _mini_repo(tmp_path)
    monkeypatch.setattr(tool, "REPO", tmp_path)
    monkeypatch.setattr(tool, "MUTANTS_DIR", tmp_path / "tools" / "mutants")
    before = (tmp_path / "calc.py").read_text()
    assert tool.main(["--jobs", str(jobs)]) == 1
    out = capsys.readouterr().out
    assert f"2 mutants, {jobs} jobs" in out
    assert "| add_subtracts | a | calc.py | caught |" in out
    assert "| unused_changed | a | calc.py | SURVIVED |" in out
    assert "1 / 2 caught (50 %)" in out and f"min with {jobs} jobs" in out
    assert (tmp_path / "calc.py").read_text() == before
    assert tool.main(["--since", "HEAD", "--list"]) == 0
    assert capsys.readouterr().out == ""
    (tmp_path / "calc.py").write_text(before + "\n")
    assert tool.main(["--since", "HEAD", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == ["add_subtracts", "unused_changed"]


def test_baselines_run_once_per_file_set() -> None:
    tool = _tool()
    selections = [
        (".venv", ("tests/a.py", "-k", "x")),
        (".venv", ("tests/a.py", "-k", "y and not z")),
        (".venv", ("tests/a.py", "tests/b.py", "-k", "x")),
        (".venv", ("tests/c.py",)),
        (".venv", ("tests/c.py", "-k", "w")),
        (".venv-axolotl", ("tests/a.py", "-k", "x")),
    ]
    assert tool.baseline_runs(selections) == [
        (".venv", ("tests/a.py", "-k", "(x) or (y and not z)")),
        (".venv", ("tests/a.py", "tests/b.py", "-k", "x")),
        (".venv", ("tests/c.py",)),  # one selection runs the whole file: so does the baseline
        (".venv-axolotl", ("tests/a.py", "-k", "x")),
    ]
    listed = {(m.venv, m.tests) for m in tool.load_mutants()}
    assert len(tool.baseline_runs(sorted(listed))) < len(listed)


def test_the_documented_run_names_every_mutant_caught() -> None:
    """docs/development.md carries the table of the last full `make mutants` run: one row per listed mutant, each
    caught, and the summary line with the catch rate (re-run and paste it after adding a mutant)."""
    text = (REPO_ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    start = text.index("<!-- mutants: the table printed by `make mutants` -->")
    table = text[start : text.index("<!-- end mutants -->", start)]
    rows = [
        line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ") and "---" not in line
    ]
    results = {cells[0].strip(): cells[3].strip() for cells in rows[1:]}
    mutants = _tool().load_mutants()
    listed = {m.id for m in mutants}
    assert set(results) == listed, (sorted(listed - set(results)), sorted(set(results) - listed))
    assert set(results.values()) == {"caught"}
    # each row names the file its mutant changes now (a refactor that moves the code moves the row's file too)
    files = {cells[0].strip(): cells[2].strip() for cells in rows[1:]}
    stale = {m.id: (files[m.id], m.file) for m in mutants if files[m.id] != m.file}
    assert not stale, stale
    assert f"{len(listed)} / {len(listed)} caught (100 %)" in table
