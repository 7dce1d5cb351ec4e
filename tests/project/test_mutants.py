"""The mutation check's list (`tools/mutants/*.toml`, run by `make mutants`) still matches the code.

Fast and part of `make test`: every mutant's `old` string occurs exactly once in its file, its test paths exist and
its venv is one of the project's, so a refactor that moves the code fails here instead of silently turning a mutant
into a no-op.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.helpers.env import REPO_ROOT

if sys.version_info < (3, 11):  # tomllib
    pytest.skip("tools/mutants.py needs Python >= 3.11 (tomllib)", allow_module_level=True)


def _tool():
    spec = importlib.util.spec_from_file_location("distmatch_mutants", REPO_ROOT / "tools" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is created
    spec.loader.exec_module(module)
    return module


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
    """Each mutant's test paths (a node id's file part) exist, a node id's test function is defined in its file,
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
            assert path.is_file(), f"{m.id}: {file} does not exist"
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
    assert listed_mutant.setup == ("tools/generate_task_configs.py",)
