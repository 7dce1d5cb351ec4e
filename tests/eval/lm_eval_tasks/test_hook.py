"""The lm-eval activation hook (`distmatch_hooks/lm_eval.py`) and the wheel's entry point: the installed wheel finds
the distmatch tasks without `--include_path` (the `wheel_python` venv of conftest.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from eval_tasks.nlu import nlu
from tests.eval.lm_eval_tasks.helpers import (
    ALL_OUR_TASKS,
    _check,
    _model_args,
    _results,
    _run,
    needs_lm_eval,
)
from tests.helpers.env import REPO_ROOT

pytestmark = pytest.mark.slow


@needs_lm_eval
def test_wheel_declares_lm_eval_tasks_entry_point(
    wheel_python: Path, workdir: Path, env: dict[str, str]
) -> None:
    script = (
        "from importlib.metadata import distribution; import eval_tasks, importlib, pathlib;"
        "eps = [e for e in distribution('distmatch').entry_points if e.group == 'lm_eval.tasks'];"
        "print([(e.name, e.value) for e in eps]);"
        "mod = importlib.import_module(eps[0].value); print(pathlib.Path(mod.__file__).parent);"
        "print(eval_tasks.__file__)"
    )
    lines = _check(_run([str(wheel_python), "-c", script], env, workdir)).stdout.splitlines()
    assert lines[0] == "[('distmatch', 'eval_tasks')]"
    assert lines[1].startswith(str(wheel_python.parent.parent)) and lines[2].startswith(
        str(wheel_python.parent.parent)
    )


@needs_lm_eval
def test_hook_adds_task_folder_and_env_switch(wheel_python: Path, workdir: Path, env: dict[str, str]) -> None:
    script = (
        "import sys; from lm_eval.tasks import TaskManager;"
        "tm = TaskManager(include_defaults=False); print(sorted(t for t in tm.all_tasks if t.startswith('distmatch')));"
        "print('distmatch_hooks.lm_eval' in sys.modules)"
    )
    on = _check(_run([str(wheel_python), "-c", script], env, workdir)).stdout.splitlines()
    assert set(ALL_OUR_TASKS) | {"distmatch_nlu", "distmatch_creative", "distmatch_icl"} <= set(
        ast.literal_eval(on[0])
    )
    assert on[1] == "True"
    off = _check(
        _run([str(wheel_python), "-c", script], dict(env, DISTMATCH_LM_EVAL_HOOK="0"), workdir)
    ).stdout
    assert off.splitlines()[0] == "[]"
    # Inert at interpreter start: nothing of lm-eval or distmatch is imported, only the finder is waiting.
    plain = (
        "import sys, distmatch_hooks.lm_eval as h;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lm_eval', 'eval_tasks', 'trl_ext', 'torch')));"
        "print(h.finder in sys.meta_path)"
    )
    assert _check(_run([str(wheel_python), "-c", plain], env, workdir)).stdout.splitlines() == ["[]", "True"]


def test_hook_patches_lm_eval_modules_imported_before_it(
    wheel_python: Path, workdir: Path, env: dict[str, str]
) -> None:
    """lm-eval imported while the hook was off (`DISTMATCH_LM_EVAL_HOOK=0` at start), then the hook activated: the
    three modules already there are patched at once, not waited for."""
    script = (
        "import os, distmatch_hooks.lm_eval as hook, lm_eval.tasks.manager as m, lm_eval.evaluator as e,"
        " lm_eval.config.evaluate_config as c\n"
        "os.environ['DISTMATCH_LM_EVAL_HOOK'] = '1'\n"
        "hook._activate()\n"
        "targets = (m.TaskManager.__init__, e.simple_evaluate, c.EvaluatorConfig.process_tasks)\n"
        "print([getattr(f, '_distmatch_wrapped', False) for f in targets])"
    )
    out = _check(_run([str(wheel_python), "-c", script], dict(env, DISTMATCH_LM_EVAL_HOOK="0"), workdir))
    assert out.stdout.strip().splitlines()[-1] == "[True, True, True]", out.stdout


def test_hook_include_path_handling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTMATCH_LM_EVAL_HOOK", "0")  # importing it must not patch this pytest process
    sys.path.insert(0, str(REPO_ROOT))
    try:
        import distmatch_hooks.lm_eval as hook
    finally:
        sys.path.remove(str(REPO_ROOT))
    folder = str(REPO_ROOT / "eval_tasks")
    assert hook.with_task_dir(None, folder) == [folder]
    assert hook.with_task_dir("/user/tasks", folder) == [folder, "/user/tasks"]  # user's paths override ours
    assert hook.with_task_dir(["/a", Path(folder)], folder) == [
        "/a",
        Path(folder),
    ]  # already there: unchanged

    class FakeManager:
        def __init__(self, verbosity=None, include_path=None, include_defaults=True, metadata=None):
            self.include_path = include_path

    module = type(sys)("fake_manager")
    module.TaskManager = FakeManager
    assert hook.patch_task_manager(module) is True
    assert hook.patch_task_manager(module) is False  # wrapped once only
    assert FakeManager(include_path="/x").include_path[1:] == ["/x"]
    module.discover_plugin_task_paths = lambda: []  # a lm-eval with entry-point discovery: hands off
    assert hook.patch_task_manager(module) is False


@needs_lm_eval
def test_wheel_validate_without_include_path(wheel_python: Path, workdir: Path, env: dict[str, str]) -> None:
    names = ",".join([*ALL_OUR_TASKS, "distmatch_nlu", "distmatch_creative"])
    proc = _check(_run([str(wheel_python), "-m", "lm_eval", "validate", "--tasks", names], env, workdir))
    assert "All tasks found and valid" in proc.stdout


@needs_lm_eval
def test_wheel_run_distmatch_nlu_without_include_path(
    wheel_python: Path, workdir: Path, env: dict[str, str], suite_run: Path
) -> None:
    out = workdir / "out_wheel"
    cmd = [
        str(wheel_python),
        "-m",
        "lm_eval",
        "run",
        "--model",
        "hf",
        "--model_args",
        _model_args(workdir),
        "--tasks",
        "distmatch_nlu",
        "--device",
        "cpu",
        "--limit",
        "2",
        "--batch_size",
        "4",
        "--output_path",
        str(out),
    ]
    proc = _check(_run(cmd, env, workdir))
    results = _results(out)["results"]
    assert set(nlu.NLU_TASK_NAMES) | {"distmatch_nlu"} <= set(results)
    accs = [results[t]["acc,none"] for t in nlu.NLU_TASK_NAMES]
    assert results["distmatch_nlu"]["acc,none"] == pytest.approx(sum(accs) / 8)
    # The same data and encoder: the retrievals cached by the first run are reused (no encoder needed).
    assert "retrieval read from" in proc.stderr + proc.stdout
