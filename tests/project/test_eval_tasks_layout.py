"""eval_tasks/ by benchmark family: at most 8 modules at its root besides the packages, one package
per family with its README naming its tasks, only lm-eval task YAMLs under it (lm-eval indexes the whole package),
and no import wired by a computed string."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from eval_tasks.lm_eval_tasks import TASK_DIR
from tests.helpers.env import REPO_ROOT

EVAL_TASKS = REPO_ROOT / "eval_tasks"
#: The benchmark families (each a package directly under eval_tasks/); any other package holding task
#: YAMLs is a family too and is held to the same rules.
FAMILIES = ("nlu", "creative", "open_ended", "code", "math", "chat", "best_of_n")
MAX_ROOT_MODULES = 8
GENERATED = "by `python tools/generate.py`"


class _Loader(yaml.SafeLoader):
    """lm-eval's YAML dialect: `!function utils.x` is a reference, read here as its text."""


_Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


def _task_yamls() -> list[Path]:
    return sorted(p for p in EVAL_TASKS.rglob("*.yaml") if "__pycache__" not in p.parts)


def _families() -> list[str]:
    """The packages that hold lm-eval task YAMLs."""
    return sorted({p.parent.name for p in _task_yamls()})


def test_the_root_holds_the_shared_layers_only() -> None:
    modules = sorted(p.name for p in EVAL_TASKS.glob("*.py"))
    assert "__init__.py" in modules and len(modules) <= MAX_ROOT_MODULES, modules
    for family in FAMILIES:
        assert not (EVAL_TASKS / f"{family}.py").exists(), f"eval_tasks/{family}.py: the family is a package"


def test_lm_eval_indexes_the_package_root() -> None:
    """`TASK_DIR` (what `python -m eval_tasks.lm_eval_tasks` prints) is eval_tasks/ itself: lm-eval recurses into it."""
    assert TASK_DIR == EVAL_TASKS.resolve()
    assert set(FAMILIES) <= set(_families())
    assert {p.parent.parent for p in _task_yamls()} == {EVAL_TASKS}  # each family directly under eval_tasks/


def test_every_yaml_under_the_package_is_an_lm_eval_task_or_group() -> None:
    """lm-eval reads every `*.yaml` under TASK_DIR: any other YAML (a config, a fixture) would be indexed too."""
    for path in _task_yamls():
        config = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
        assert isinstance(config, dict) and ("task" in config or "group" in config), path.relative_to(
            REPO_ROOT
        )
        assert str(config.get("group") or config.get("task")).startswith("distmatch_"), path


def test_each_family_is_a_package_with_a_readme_naming_its_tasks() -> None:
    """Each family's README names its tasks and groups (a generated task: its tag or group, which the README names
    instead of repeating the task table), and says which paper and which published numbers they reproduce."""
    for family in _families():
        folder = EVAL_TASKS / family
        assert (folder / "__init__.py").is_file(), f"eval_tasks/{family}/ is not a package"
        if any("!function utils." in p.read_text(encoding="utf-8") for p in folder.glob("*yaml")):
            assert (folder / "utils.py").is_file(), (
                f"eval_tasks/{family}/: its YAMLs reference a missing utils.py"
            )
        readme = (folder / "README.md").read_text(encoding="utf-8")
        assert "### Paper" in readme and "arxiv.org" in readme, family
        if family in FAMILIES:
            assert "### Published numbers" in readme and "eval_tasks/published/" in readme, family
        for path in sorted(folder.glob("*.yaml")):
            config = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
            name = str(config.get("group") or config.get("task"))  # a group's `task` lists its members
            if f"`{name}`" in readme:
                continue
            generated = GENERATED in path.read_text(encoding="utf-8").partition("\n")[0]
            assert generated and f"`{config.get('tag')}`" in readme, (
                f"{family}/README.md does not name {name}"
            )


def _string_imports(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """Calls of `__import__(...)` and of `import_module(<not a literal>)` in `path` (import wiring by strings)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        literal = bool(node.args) and isinstance(node.args[0], ast.Constant)
        if name == "__import__" or (name == "import_module" and not literal):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_import_by_a_computed_string() -> None:
    assert [hit for path in sorted(EVAL_TASKS.rglob("*.py")) for hit in _string_imports(path)] == []


def test_the_check_finds_string_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib\nm = importlib.import_module(f'eval_tasks.{x}')\nn = __import__('os')\n"
        "o = importlib.import_module('json')\n"
    )
    assert _string_imports(probe, tmp_path) == ["probe.py:2", "probe.py:3"]
