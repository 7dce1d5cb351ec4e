"""The mechanism the distmatch activation hooks share: run a callback right after a given module is imported.

`distmatch_hooks.trl` (``trl``), `distmatch_hooks.lm_eval` (``lm_eval.tasks.manager``, ``lm_eval.evaluator``,
``lm_eval.config.evaluate_config``) and
`distmatch_hooks.axolotl` (``axolotl.cli.config``, ``axolotl.utils.config``) are imported by ``.pth`` files at every
interpreter start, so this module imports only ``os``/``sys`` and does nothing until asked.
`PatchAfterImport.install()` puts one ``sys.meta_path`` finder first. On the first import of the target module it
takes the spec the other finders give, wraps its loader so that, once the module's code has run, the real loader
is put back (the module looks normally imported: ``importlib.resources`` and friends use ``__spec__.loader``), the
finder leaves ``sys.meta_path``, and the callback runs with the module. Every other import passes through
untouched.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from distmatch._loss_names import LOSS_NAMES, LOSS_OPTION_NAMES, RUN_OPTION_NAMES  # noqa: F401 (re-exported)
from distmatch.errors import one_edit_apart, stderr_line  # noqa: F401 (one_edit_apart re-exported)

OFF_VALUES = ("0", "false", "no", "off")

ENV_DEBUG = "DISTMATCH_DEBUG"
#: The loss options' config keys (the same in TRL and Axolotl) and the distmatch settings that are not loss options
#: (`trl_ext.resume`): the hooks must not import `trl_ext` (it imports torch), so `python tools/generate.py` writes
#: them from the loss specs into the torch-free `distmatch._loss_names` (`--check` fails when they differ).
#: Any option starting with one of the prefixes also counts (future EMO options).
LOSS_OPTION_PREFIXES = ("emo_",)


def misspelled_distmatch_keys(cfg: object) -> list[str]:
    """Keys of a config mapping that look meant for distmatch but are not its keys: one edit away from one
    (`gem_betta`), or `loss_type` set to a distmatch loss (another framework's spelling of `loss`)."""
    names = ("loss", *RUN_OPTION_NAMES, *LOSS_OPTION_NAMES)
    found = []
    for key in cfg if isinstance(cfg, dict) or hasattr(cfg, "keys") else ():
        name = str(key)
        if name in names:
            continue
        if any(one_edit_apart(name, option) for option in names) or (
            name == "loss_type" and cfg[key] in LOSS_NAMES  # type: ignore[index]
        ):
            found.append(name)
    return found


def switched_on(variable: str) -> bool:
    """False when the environment variable says 0/false/no/off; on by default."""
    return os.environ.get(variable, "1").strip().lower() not in OFF_VALUES


def debug(source: str, message: str) -> None:
    """A decision of a hook, on stderr when DISTMATCH_DEBUG is set (to anything but 0/false/no/off)."""
    if os.environ.get(ENV_DEBUG, "").strip().lower() not in ("", *OFF_VALUES):
        stderr_line(f"{source}[{os.getpid()}]: {message}")


class _LoaderThenCallback:
    """Loader wrapper: runs the real loader, puts it back on the module, then calls the hook's callback."""

    def __init__(self, loader: object, hook: PatchAfterImport) -> None:
        self._loader = loader
        self._hook = hook

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)

    def create_module(self, spec: object) -> object:
        return self._loader.create_module(spec)

    def exec_module(self, module: object) -> None:
        self._hook.uninstall()
        try:
            self._loader.exec_module(module)
        finally:
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader
            module.__loader__ = self._loader
        self._hook.on_imported(module)  # the callback reports its own errors (quietly or loudly)


class PatchAfterImport:
    """``sys.meta_path`` finder acting once, on the first import of `target`, then calling `on_imported(module)`."""

    def __init__(self, target: str, on_imported: Callable[[object], object], source: str) -> None:
        self.target = target
        self.on_imported = on_imported
        self.source = source  # the hook's name, for debug messages
        self.done = False

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname != self.target or self.done:
            return None
        self.done = True  # also stops the recursion through find_spec below
        try:
            from importlib.util import find_spec

            spec = find_spec(fullname)  # what the other finders give (parent packages are imported already)
        except Exception as err:  # leave the import to the other finders
            debug(self.source, f"not patching {fullname}: {err!r}")
            return None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _LoaderThenCallback(spec.loader, self)
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)  # before the path finder, which would find the module first

    def uninstall(self) -> None:
        """Leave ``sys.meta_path`` (called from the loader: never while an import iterates over it)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
