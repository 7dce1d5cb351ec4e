"""No import cycle between the modules of the packages, counting imports inside functions too (a lazy import that
closes a cycle still ties two modules together), imports only go down the layers, the bottom layer imports neither
torch nor any framework, and every eval_tasks module imports on its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.helpers.env import REPO_ROOT

REPO = REPO_ROOT
PACKAGES = ("distmatch", "trl_ext", "axolotl_distmatch", "eval_tasks", "swift_distmatch", "distmatch_hooks")
#: Each package's layer (docs/development.md): a module may import its own layer's package and lower layers only.
LAYERS = {
    "distmatch": 0,
    "trl_ext": 1,
    "axolotl_distmatch": 2,
    "eval_tasks": 2,
    "swift_distmatch": 2,
    "distmatch_hooks": 3,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package modules it imports (``from pkg import name`` counts as pkg.name when that is a module).

    A package's ``__init__`` re-exporting its own submodules is not an edge: importing a submodule runs the
    package's ``__init__`` first by design, so those edges would make every package a cycle.
    """
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not (is_package and target.startswith(name + ".")):
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_finds_a_lazy_import_cycle() -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert find_cycle(graph) == ["p.a", "p.b", "p.c", "p.a"]
    assert find_cycle({"p.a": {"p.b"}, "p.b": set()}) is None


def test_no_import_cycle_in_the_packages() -> None:
    graph = import_graph(_modules())
    assert graph["eval_tasks.cli.sampling"] >= {
        "eval_tasks.samples",
        "eval_tasks.generation",
        "eval_tasks.results",
    }
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every import from a package to another of the same or a higher layer."""
    package = lambda module: module.split(".")[0]  # noqa: E731
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if package(a) != package(b) and LAYERS[package(b)] >= LAYERS[package(a)]
    )


def test_layer_check_finds_an_upward_import() -> None:
    graph = {
        "trl_ext.x": {"distmatch.errors", "distmatch_hooks._common"},
        "eval_tasks.y": {"axolotl_distmatch.z"},
    }
    assert upward_imports(graph) == [
        "eval_tasks.y -> axolotl_distmatch.z",
        "trl_ext.x -> distmatch_hooks._common",
    ]


def test_imports_only_go_down_the_layers() -> None:
    graph = import_graph(_modules())
    assert (
        "distmatch.errors" in graph["distmatch_hooks._common"]
        and "distmatch.optional" in graph["eval_tasks.cli.sampling"]
    )
    assert upward_imports(graph) == []


def test_bottom_layer_imports_no_framework() -> None:
    """`distmatch` is imported by the activation hooks at every interpreter start: it must stay torch-free."""
    code = "import sys, distmatch, distmatch.errors, distmatch.optional, distmatch.checkpoints, distmatch.model_folder; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    loaded = {name.split(".")[0] for name in eval(out.stdout)}  # noqa: S307 - our own subprocess's list
    assert not loaded & {
        "torch",
        "transformers",
        "trl",
        "axolotl",
        "lm_eval",
        "trl_ext",
        "eval_tasks",
        "numpy",
    }


def _in_cli(module: str) -> bool:
    return module == "eval_tasks.cli" or module.startswith("eval_tasks.cli.")


def test_report_and_metrics_do_not_import_the_cli() -> None:
    """The command line sits on the library (eval_tasks/cli/): no library module imports any of its modules."""
    graph = import_graph(_modules())
    assert {"eval_tasks.cli", "eval_tasks.cli.bon"} <= set(graph)
    library = [m for m in graph if m.startswith("eval_tasks.") and not _in_cli(m)]
    assert [m for m in library if any(_in_cli(target) for target in graph[m])] == []


def _is_lm_eval_glue(module: str) -> bool:
    """A family package's lm-eval task classes (``harness``) or its YAMLs' ``utils``: they need lm-eval."""
    path = _modules()[module]
    return path.stem in ("harness", "utils") and any(path.parent.glob("*.yaml"))


_LEAVES = sorted(
    m
    for m in _modules()
    if m.startswith("eval_tasks")
    and not m.startswith(("eval_tasks.lm_eval_tasks", "eval_tasks.opencompass"))  # need lm-eval / OpenCompass
    and not _is_lm_eval_glue(m)
    and not m.endswith(".__main__")  # a program: importing it runs it
)


def test_every_eval_tasks_module_imports_alone() -> None:
    """Each module in a fresh interpreter of its own (a cycle breaks the import of a cycle's second module)."""
    code = (
        "import importlib, subprocess, sys\n"
        "bad = []\n"
        "for name in sys.argv[1:]:\n"
        "    done = subprocess.run([sys.executable, '-c', f'import {name}'], capture_output=True, text=True)\n"
        "    if done.returncode:\n"
        "        bad.append((name, done.stderr.strip().splitlines()[-1:]))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *_LEAVES], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "eval_tasks.report.plots" in _LEAVES and "eval_tasks.samples" in _LEAVES
