"""Activation hook that lets the plain ``lm_eval --tasks distmatch_nlu ...`` find the distmatch tasks.

lm-eval 0.4.13 has no plugin mechanism for tasks (no entry points, no environment variable): it indexes its own
``lm_eval/tasks`` folder plus whatever ``--include_path`` / ``TaskManager(include_path=...)`` names. The distmatch
wheel installs ``distmatch_hooks.lm_eval.pth`` at the root of site-packages; Python runs its single line,
``import distmatch_hooks.lm_eval``, at every interpreter start. So this module is cheap and inert: it imports only
``os``/``sys`` (and the shared ``distmatch_hooks._common``) and puts one ``sys.meta_path`` finder first, which
ignores every import except that of ``lm_eval.tasks.manager``. Right after that module has run,
``TaskManager.__init__`` is wrapped so that the distmatch task folder (the ``eval_tasks`` package, whose family
packages hold the YAMLs, located without importing ``eval_tasks``) is searched after lm-eval's own tasks and before
the user's ``include_path`` (the precedence of lm-eval's upcoming ``lm_eval.tasks`` entry points: defaults <
plugins < ``--include_path``). Nothing else changes; a process that never imports lm-eval's task manager is not affected at all. Two more finders wait for
``lm_eval.evaluator`` and ``lm_eval.config.evaluate_config``: the pre-flight check of the ``distmatch_*`` tasks'
options runs at the start of ``simple_evaluate`` and, for the command line, before ``EvaluatorConfig.process_tasks``
builds lm-eval's task index.

It stands down when lm-eval itself discovers task plugins (a release with ``discover_plugin_task_paths``, which
reads the ``lm_eval.tasks`` entry point distmatch declares), when the user's ``include_path`` already holds the
folder, and when ``DISTMATCH_LM_EVAL_HOOK=0`` (or false/no/off); then use
``lm_eval --include_path "$(python -m eval_tasks.lm_eval_tasks)" ...``. ``DISTMATCH_DEBUG=1`` prints its
decisions to stderr. It never raises at interpreter start.
"""

from __future__ import annotations

import os
import sys

from distmatch.errors import (
    CONFIG_ERROR_STATUS,
    DistMatchConfigError,
    print_config_errors_as_one_line,
    stderr_line,
)
from distmatch_hooks._common import PatchAfterImport, debug, switched_on

ENV_SWITCH = "DISTMATCH_LM_EVAL_HOOK"
TARGET_MODULE = "lm_eval.tasks.manager"
EVALUATOR_MODULE = "lm_eval.evaluator"
CONFIG_MODULE = "lm_eval.config.evaluate_config"  # the command line's settings and task index


def _debug(message: str) -> None:
    debug("distmatch_hooks.lm_eval", message)


def enabled() -> bool:
    return switched_on(ENV_SWITCH)


def task_dir() -> str | None:
    """The installed ``eval_tasks`` package folder (lm-eval indexes the YAMLs of every family package under it,
    ``eval_tasks.lm_eval_tasks.TASK_DIR``), found without importing ``eval_tasks``."""
    from importlib.util import find_spec

    spec = find_spec("eval_tasks")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if os.path.isdir(os.path.join(location, "lm_eval_tasks")):
            return location
    return None


def _same_dir(a: object, b: str) -> bool:
    try:
        return os.path.realpath(os.fspath(a)) == os.path.realpath(b)  # type: ignore[arg-type]
    except TypeError:
        return False


def with_task_dir(include_path: object, folder: str) -> object:
    """`include_path` (None, a path or a list) with `folder` first, unless it is already there."""
    paths = (
        []
        if include_path is None
        else list(include_path)
        if isinstance(include_path, (list, tuple))
        else [include_path]
    )
    if any(_same_dir(p, folder) for p in paths):
        return include_path
    return [folder, *paths]


def patch_task_manager(module: object) -> bool:
    """Wrap ``module.TaskManager.__init__`` to add the distmatch task folder; False if not applicable."""
    if getattr(module, "discover_plugin_task_paths", None) is not None:
        _debug("lm-eval discovers task plugins itself (lm_eval.tasks entry point): hook not needed")
        return False
    manager = getattr(module, "TaskManager", None)
    original = getattr(manager, "__init__", None)
    if original is None or getattr(original, "_distmatch_wrapped", False):
        return False
    import functools
    import inspect

    signature = inspect.signature(original)
    if "include_path" not in signature.parameters:
        _debug("TaskManager.__init__ has no include_path parameter: not patched")
        return False

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):  # noqa: N807
        try:
            folder = task_dir()
            if folder is not None:
                bound = signature.bind(self, *args, **kwargs)
                bound.arguments["include_path"] = with_task_dir(bound.arguments.get("include_path"), folder)
                args, kwargs = bound.args[1:], bound.kwargs
                _debug(f"TaskManager include_path += {folder}")
        except Exception as err:  # never break lm-eval; it then runs without our tasks
            _debug(f"could not add the task folder: {err!r}")
        original(self, *args, **kwargs)

    __init__._distmatch_wrapped = True  # type: ignore[attr-defined]
    manager.__init__ = __init__
    return True


def _patch_quietly(module: object) -> None:
    try:
        patch_task_manager(module)
    except Exception as err:  # never break lm-eval; it then runs without our tasks
        _debug(f"not patched: {err!r}")


def _model_arg_names(model_args: object) -> list[str] | None:
    if isinstance(model_args, dict):
        return [str(k) for k in model_args]
    if isinstance(model_args, str):
        return [part.split("=", 1)[0].strip() for part in model_args.split(",") if "=" in part]
    return [] if model_args is None else None


def _called_by_cli(frame: object) -> bool:
    """Whether `frame` (the caller of ``simple_evaluate``) is lm-eval's command line (``lm_eval run``)."""
    name = str(getattr(frame, "f_globals", {}).get("__name__", ""))
    return name == "lm_eval._cli" or name.startswith(("lm_eval._cli.", "lm_eval.__main__"))


def _distmatch_task_names(tasks: object) -> list[str]:
    """The requested task names (a list, or lm-eval's comma-separated string), [] unless one is a distmatch task."""
    names = tasks.split(",") if isinstance(tasks, str) else list(tasks or [])
    return names if any(isinstance(t, str) and t.startswith("distmatch_") for t in names) else []


def _preflight(
    tasks: list, metadata: object, model_args: object, model: object, confirm: object, caller: object
):
    """``eval_tasks.lm_eval_tasks.preflight.preflight`` for these settings: its environment variables, or a refusal,
    which is one ``error: ...`` line on stderr and exit status 2 when `caller` (a frame) is lm-eval's command line
    and the ``DistMatchConfigError`` otherwise."""
    from eval_tasks.lm_eval_tasks.preflight import preflight

    try:
        # confirm None: an lm-eval without the setting (its own check then decides)
        return preflight(tasks, metadata, _model_arg_names(model_args), model, confirm)
    except DistMatchConfigError as err:
        if not _called_by_cli(caller):
            raise  # Python-API callers get the exception
        stderr_line(f"error: {err}")
        raise SystemExit(CONFIG_ERROR_STATUS) from None


def patch_simple_evaluate(module: object) -> bool:
    """Wrap ``simple_evaluate`` so that a run with ``distmatch_*`` tasks checks their options and local data
    (``eval_tasks.lm_eval_tasks.preflight.preflight``) before the model is built. Called by lm-eval's command line, a
    refusal is one ``error: ...`` line on stderr and exit status 2; Python callers get the ``DistMatchConfigError``."""
    original = getattr(module, "simple_evaluate", None)
    if original is None or getattr(original, "_distmatch_wrapped", False):
        return False
    import functools
    import inspect

    signature = inspect.signature(original)
    confirms = "confirm_run_unsafe_code" in signature.parameters

    @functools.wraps(original)
    def simple_evaluate(*args, **kwargs):  # type: ignore[no-untyped-def]
        bound = signature.bind_partial(*args, **kwargs).arguments
        tasks = _distmatch_task_names(bound.get("tasks"))
        settings: dict[str, str] = {}
        if tasks:
            confirm = bool(bound.get("confirm_run_unsafe_code", False)) if confirms else None
            settings = _preflight(
                tasks,
                bound.get("metadata"),
                bound.get("model_args"),
                bound.get("model", "hf"),
                confirm,
                sys._getframe(1),
            )
        # for this evaluation only (the tasks are built inside it): a later one in the process may use another model
        saved = {key: os.environ.get(key) for key in settings}
        os.environ.update(settings)
        try:
            return original(*args, **kwargs)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    simple_evaluate._distmatch_wrapped = True  # type: ignore[attr-defined]
    module.simple_evaluate = simple_evaluate  # type: ignore[attr-defined]
    print_config_errors_as_one_line()  # a refusal outside lm-eval's CLI: one line naming it, exit status 2
    return True


def patch_process_tasks(module: object) -> bool:
    """Wrap ``EvaluatorConfig.process_tasks``, where lm-eval's command line builds its task index (parsing its
    14,000 task YAML files: 5-10 s of CPU) before it calls ``simple_evaluate``: the same pre-flight check runs
    first, so that a refused ``lm_eval run`` stops before that work. ``simple_evaluate`` checks again (the Python
    API's path, and it sets the run's environment)."""
    config = getattr(module, "EvaluatorConfig", None)
    original = getattr(config, "process_tasks", None)
    if original is None or getattr(original, "_distmatch_wrapped", False):
        return False
    import functools

    @functools.wraps(original)
    def process_tasks(self, metadata=None, *args, **kwargs):  # type: ignore[no-untyped-def]
        tasks = _distmatch_task_names(getattr(self, "tasks", None))
        if tasks:
            confirm = getattr(self, "confirm_run_unsafe_code", None)
            _preflight(
                tasks,
                metadata or getattr(self, "metadata", None),
                getattr(self, "model_args", None),
                getattr(self, "model", "hf"),
                None if confirm is None else bool(confirm),
                sys._getframe(1),
            )
        return original(self, metadata, *args, **kwargs)

    process_tasks._distmatch_wrapped = True  # type: ignore[attr-defined]
    config.process_tasks = process_tasks  # type: ignore[union-attr]
    return True


def _patch_evaluator(module: object) -> None:
    try:
        patch_simple_evaluate(module)
    except Exception as err:  # the task classes check their options again
        _debug(f"simple_evaluate not wrapped: {err!r}")


def _patch_config(module: object) -> None:
    try:
        patch_process_tasks(module)
    except Exception as err:  # simple_evaluate checks after the task index instead
        _debug(f"EvaluatorConfig.process_tasks not wrapped: {err!r}")


finder = PatchAfterImport(TARGET_MODULE, _patch_quietly, source="distmatch_hooks.lm_eval")
evaluator_finder = PatchAfterImport(EVALUATOR_MODULE, _patch_evaluator, source="distmatch_hooks.lm_eval")
config_finder = PatchAfterImport(CONFIG_MODULE, _patch_config, source="distmatch_hooks.lm_eval")


def _activate() -> None:
    if not enabled():
        return
    for target, patch, hook in (
        (TARGET_MODULE, _patch_quietly, finder),
        (EVALUATOR_MODULE, _patch_evaluator, evaluator_finder),
        (CONFIG_MODULE, _patch_config, config_finder),
    ):
        if target in sys.modules:  # imported before us (not the case at interpreter start)
            patch(sys.modules[target])
        else:
            hook.install()


try:
    _activate()
except Exception as _err:  # never break interpreter start
    _debug(f"disabled by an error: {_err!r}")
