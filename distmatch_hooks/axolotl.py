"""Activation hook that makes an Axolotl config with `loss:` (or another distmatch key) load the distmatch plugin.

Axolotl drops unknown top-level keys silently: without `plugins: [axolotl_distmatch.DistMatchPlugin]`, Axolotl 0.19
reads `loss: gem_ls` and trains plain cross-entropy; Axolotl >= 0.21 auto-loads the plugin through its
`axolotl.plugins` entry point but only logs a warning (and trains cross-entropy) if it fails to import.

The distmatch wheel installs `distmatch_hooks.axolotl.pth`, whose single line imports this module at every
interpreter start. Like the TRL hook it is cheap and inert: it imports only `os`/`sys` (and the shared
`distmatch_hooks._common`) and puts `sys.meta_path` finders first that ignore every import except those of
`axolotl.cli.config` and `axolotl.utils.config`. Right after such a module has run, its `prepare_plugins(cfg)`
(which registers the config's plugins, before validation; `axolotl train` uses the CLI module's) is wrapped:

* a config without distmatch keys is passed through untouched;
* a config with one (`loss`, `gem_beta`, `emo_...`, `allow_loss_change`, ...), or one that resumes from a checkpoint
  holding a distmatch run record (`resume_from_checkpoint`, `auto_resume_from_checkpoints`; the plugin continues
  or checks the recorded loss), or a new run whose `output_dir` holds a distmatch run (the plugin refuses it unless
  `overwrite_run: true`, as for a distmatch run: a plain run would leave records naming a loss it did not train), gets `axolotl_distmatch.DistMatchPlugin` added to its
  `plugins` when no entry names it, after checking that the plugin imports (an import failure stops the run with
  one line saying what failed); after Axolotl registered the plugins, the distmatch plugin must be among them.

Errors are one line on stderr and a non-zero exit (no traceback). `DISTMATCH_AXOLOTL_HOOK=0` (or false/no/off)
disables it (then list the plugin in `plugins:` yourself); `DISTMATCH_DEBUG=1` prints its decisions to stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from distmatch.checkpoints import RECORD_FILE, axolotl_resume_checkpoint, has_record, run_records
from distmatch.errors import DistMatchConfigError, print_config_errors_as_one_line
from distmatch_hooks._common import (
    LOSS_OPTION_NAMES,
    LOSS_OPTION_PREFIXES,
    RUN_OPTION_NAMES,
    PatchAfterImport,
    debug,
    misspelled_distmatch_keys,
    switched_on,
)

ENV_SWITCH = "DISTMATCH_AXOLOTL_HOOK"
#: The modules defining `prepare_plugins(cfg)`: the CLI's (`load_cfg`, behind `axolotl train`) and the library's.
TARGET_MODULES = ("axolotl.cli.config", "axolotl.utils.config")
PLUGIN = "axolotl_distmatch.DistMatchPlugin"
#: Spellings of our plugin in `plugins:` (Axolotl 0.21 also accepts `module:Class`).
PLUGIN_NAMES = (PLUGIN, "axolotl_distmatch.plugin.DistMatchPlugin")
#: The distmatch config keys besides `loss`.
OPTION_NAMES = LOSS_OPTION_NAMES
OPTION_PREFIXES = LOSS_OPTION_PREFIXES


def _debug(message: str) -> None:
    debug("distmatch_hooks.axolotl", message)


def enabled() -> bool:
    return switched_on(ENV_SWITCH)


def distmatch_keys(cfg: Mapping) -> list[str]:
    """The distmatch keys set in an Axolotl config (a raw dict or Axolotl's DictDefault); without any, a resume from
    a checkpoint with a distmatch run record (its loss is continued or checked by the plugin) counts as one."""
    keys = []
    for key in cfg:
        name = str(key)
        if cfg[key] is None:
            continue
        if name in ("loss", *RUN_OPTION_NAMES) or name in OPTION_NAMES or name.startswith(OPTION_PREFIXES):
            keys.append(name)
    keys += [name for name in misspelled_distmatch_keys(cfg) if name not in keys]  # the plugin refuses them
    checkpoint = axolotl_resume_checkpoint(cfg)
    if not keys and has_record(checkpoint):
        keys.append(f"resume_from_checkpoint ({checkpoint}/{RECORD_FILE})")
    elif not keys and checkpoint is None and (records := run_records(cfg.get("output_dir") or "./model-out")):
        # a plain run would write over a distmatch run's checkpoints while their records still name its loss: the
        # plugin refuses it like a distmatch run's (`trl_ext.resume.check_new_run`), unless `overwrite_run: true`
        keys.append(f"output_dir (holds a distmatch run: {records[0]})")
    return keys


def names_our_plugin(entry: object) -> bool:
    return str(entry).replace(":", ".") in PLUGIN_NAMES


def add_plugin(cfg: Mapping) -> list[str]:
    """The distmatch keys of `cfg`; when there are some, `cfg["plugins"]` lists our plugin (added if missing)."""
    keys = distmatch_keys(cfg)
    if not keys:
        return keys
    try:
        import axolotl_distmatch.plugin  # noqa: F401  (import errors stop the run here, not at trainer build)
    except Exception as err:
        raise DistMatchConfigError(
            f"{', '.join(keys)} in the Axolotl config ask for the distmatch plugin, but it failed to import "
            f"({type(err).__name__}: {err}); without it Axolotl would train plain cross-entropy. Reinstall "
            "distmatch (pip install -U 'distmatch[axolotl]') or remove those keys."
        ) from None
    plugins = list(cfg.get("plugins") or [])
    if not any(names_our_plugin(entry) for entry in plugins):
        cfg["plugins"] = [*plugins, PLUGIN]  # type: ignore[index]
        _debug(f"{', '.join(keys)} set: added {PLUGIN} to plugins")
    return keys


def check_registered(keys: list[str]) -> None:
    """After Axolotl registered the plugins: the distmatch plugin must be one of them."""
    from axolotl.integrations.base import PluginManager

    from axolotl_distmatch.plugin import DistMatchPlugin

    registered = PluginManager.get_instance().plugins.values()
    if not any(isinstance(plugin, DistMatchPlugin) for plugin in registered):
        raise DistMatchConfigError(
            f"{', '.join(keys)} in the Axolotl config need the plugin {PLUGIN}, which Axolotl did not load; "
            f"add `plugins: [{PLUGIN}]` to the config."
        )


def patch_prepare_plugins(module: object) -> bool:
    original = getattr(module, "prepare_plugins", None)
    if original is None or getattr(original, "_distmatch_wrapped", False):
        return False
    import functools

    @functools.wraps(original)
    def prepare_plugins(cfg, *args, **kwargs):  # type: ignore[no-untyped-def]
        keys = add_plugin(cfg) if isinstance(cfg, Mapping) else []
        result = original(cfg, *args, **kwargs)
        if keys:
            check_registered(keys)
        return result

    prepare_plugins._distmatch_wrapped = True  # type: ignore[attr-defined]
    module.prepare_plugins = prepare_plugins  # type: ignore[attr-defined]
    print_config_errors_as_one_line()  # an Axolotl process: refused settings as one line, exit status 2
    _debug(f"{getattr(module, '__name__', '?')}.prepare_plugins wrapped")
    return True


def _patch(module: object) -> None:
    try:
        patch_prepare_plugins(module)
    except Exception as err:  # never break Axolotl for configs without distmatch keys
        _debug(f"not patched: {err!r}")


finders = [PatchAfterImport(target, _patch, source="distmatch_hooks.axolotl") for target in TARGET_MODULES]


def _activate() -> None:
    if not enabled():
        return
    for finder in finders:
        if finder.target in sys.modules:  # imported before us (not the case at interpreter start)
            _patch(sys.modules[finder.target])
        else:
            finder.install()


try:
    _activate()
except Exception as _err:  # never break interpreter start
    _debug(f"disabled by an error: {_err!r}")
