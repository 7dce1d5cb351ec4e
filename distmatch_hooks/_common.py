"""The mechanism the distmatch activation hooks share: run a callback right after a given module is imported.

`distmatch_hooks.trl` (``trl``), `distmatch_hooks.lm_eval` (``lm_eval.tasks.manager``, ``lm_eval.evaluator``) and
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
from collections.abc import Callable, Mapping

OFF_VALUES = ("0", "false", "no", "off")

ENV_DEBUG = "DISTMATCH_DEBUG"
#: The loss options' config keys, the same in TRL and Axolotl (the hooks must not import `trl_ext.options`: it imports
#: torch). Kept equal to `trl_ext.options.LOSS_OPTIONS` by the tests.
LOSS_OPTION_NAMES = (
    "gem_beta",
    "emo_cost_embedding",
    "emo_weighting",
    "emo_ratio_clamp",
    "ce_entropy_coef",
    "tailr_gamma",
    "tailr_min_weight",
    "tailr_variant",
    "mixce_gamma",
    "eaft_alpha",
    "eaft_k",
)
#: Any option starting with one of these also counts (future EMO options).
LOSS_OPTION_PREFIXES = ("emo_",)
#: The distmatch settings that are not loss options (same names in TRL and Axolotl; `trl_ext.resume`).
RUN_OPTION_NAMES = ("allow_loss_change",)
#: The file a distmatch run writes into every checkpoint and output folder (its loss and options; `trl_ext.resume`).
RECORD_FILE = "distmatch.json"


def switched_on(variable: str) -> bool:
    """False when the environment variable says 0/false/no/off; on by default."""
    return os.environ.get(variable, "1").strip().lower() not in OFF_VALUES


def stderr_line(text: str) -> None:
    """`text` and its newline on stderr in one write: the ranks of a multi-process launch share one stderr, and
    `print` writes the text and the newline separately when stderr is unbuffered (PYTHONUNBUFFERED, `-u`), so two
    ranks' lines could run together."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def debug(source: str, message: str) -> None:
    """A decision of a hook, on stderr when DISTMATCH_DEBUG is set (to anything but 0/false/no/off)."""
    if os.environ.get(ENV_DEBUG, "").strip().lower() not in ("", *OFF_VALUES):
        stderr_line(f"{source}[{os.getpid()}]: {message}")


#: Exit status of a command refused for a setting (argparse's status for a bad argument).
CONFIG_ERROR_STATUS = 2


class DistMatchConfigError(ValueError):
    """A setting distmatch refuses (the message names it and says what to do); entry points print it as one line."""


def _config_errors(err: BaseException) -> list[str]:
    """The DistMatchConfigError messages in `err`: itself, its cause/context chain, or a pydantic error's items."""
    found: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DistMatchConfigError):
            return [str(current)]
        errors = getattr(current, "errors", None)  # pydantic.ValidationError: the validators' exceptions
        if callable(errors) and type(current).__name__ == "ValidationError":
            try:
                items = errors()
            except Exception:
                items = []
            for item in items:
                inner = (item.get("ctx") or {}).get("error") if isinstance(item, dict) else None
                if isinstance(inner, DistMatchConfigError):
                    found.append(str(inner))
            if found:
                return found
        current = current.__cause__ or current.__context__
    return found


def print_config_errors_as_one_line() -> None:
    """`sys.excepthook` that prints an uncaught DistMatchConfigError as `error: <message>` (no traceback) and ends
    the process with status 2, as argparse does for a bad argument: CPython honours a SystemExit raised by the
    excepthook. Any other exception keeps the previous hook."""
    previous = sys.excepthook
    if getattr(previous, "_distmatch", False):
        return

    def hook(kind: type, err: BaseException, tb: object) -> None:
        messages = _config_errors(err)
        if not messages:
            previous(kind, err, tb)
            return
        for message in messages:
            stderr_line(f"error: {message}")
        raise SystemExit(CONFIG_ERROR_STATUS)

    hook._distmatch = True  # type: ignore[attr-defined]
    sys.excepthook = hook


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


def last_checkpoint(output_dir: object) -> str | None:
    """The `checkpoint-N` folder with the largest N in `output_dir` (what `resume_from_checkpoint=True` and
    Axolotl's `auto_resume_from_checkpoints` resume from), or None."""
    try:
        names = os.listdir(str(output_dir))
    except OSError:
        return None
    steps = [
        (int(name.split("-", 1)[1]), name)
        for name in names
        if name.startswith("checkpoint-")
        and name.split("-", 1)[1].isdigit()
        and os.path.isdir(os.path.join(str(output_dir), name))
    ]
    return os.path.join(str(output_dir), max(steps)[1]) if steps else None


def has_record(checkpoint: object) -> bool:
    """Whether `checkpoint` (a `resume_from_checkpoint` value) is a folder holding a distmatch run record."""
    return isinstance(checkpoint, str) and os.path.isfile(os.path.join(checkpoint, RECORD_FILE))


def axolotl_resume_checkpoint(cfg: Mapping) -> object:
    """`resume_from_checkpoint`, else with `auto_resume_from_checkpoints` the last `checkpoint-N` of `output_dir`
    (what Axolotl resumes from), or None: an Axolotl config, raw or validated."""
    checkpoint = cfg.get("resume_from_checkpoint")
    if checkpoint is not None or not cfg.get("auto_resume_from_checkpoints"):
        return checkpoint
    return last_checkpoint(cfg.get("output_dir") or "./model-out")
