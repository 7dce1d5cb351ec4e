"""`DistMatchPlugin`: the Axolotl plugin (`plugins: [axolotl_distmatch.DistMatchPlugin]`, `loss: gem_ls`).

Hooks used (all present from Axolotl 0.19 on):

* `get_input_args` -> `axolotl_distmatch.args.DistMatchArgs`: the `loss` key and the loss options, validated with
  Axolotl's config (bad values and conflicting settings fail there, with the valid choices / what to remove);
* `register` (raw config, before validation): resuming (`resume_from_checkpoint`, or `auto_resume_from_checkpoints`
  with a checkpoint in `output_dir`) from a checkpoint whose run record (`distmatch.json`, `trl_ext.resume`)
  names a loss: without `loss` the recorded loss and options are put into the config (one log line), another loss
  or other options are refused unless `allow_loss_change: true`; then, with `loss` set, fail now if the trainer
  cannot be imported (Axolotl <= 0.19 only logs a plugin's import errors and would train plain cross-entropy);
* `get_trainer_cls` -> `DistMatchTrainer` bound to the loss and its options, only when `loss` is set: without
  it the plugin does nothing (it is auto-loaded for every config through the `axolotl.plugins` entry point on
  Axolotl >= 0.21).
"""

from __future__ import annotations

import logging
from typing import Any

from axolotl.integrations.base import BasePlugin

from distmatch.checkpoints import axolotl_resume_checkpoint
from trl_ext.options import LOSS_OPTIONS, options_of
from trl_ext.resume import check_checkpoint_folder, check_new_run, resolve_resume

LOG = logging.getLogger(__name__)

ARGS_PATH = "axolotl_distmatch.args.DistMatchArgs"
MIN_AXOLOTL = "0.19"


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    value = cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)
    return default if value is None else value


def continue_recorded_loss(cfg: Any) -> None:
    """Raw config (before validation): a resume without `loss` gets the checkpoint's recorded loss and options;
    another loss or other options are refused (`DistMatchConfigError`) unless `allow_loss_change` is true."""
    written = {o.name: _get(cfg, o.name) for o in LOSS_OPTIONS if _get(cfg, o.name) is not None}
    checkpoint = axolotl_resume_checkpoint(cfg)  # shared with the activation hook
    output_dir = _get(cfg, "output_dir", "./model-out")
    check_checkpoint_folder(checkpoint, output_dir)
    if checkpoint is None:
        check_new_run(output_dir, None, bool(_get(cfg, "overwrite_run", False)))
    resume = resolve_resume(
        None if checkpoint is None else str(checkpoint),
        _get(cfg, "loss"),
        written,
        allow_change=bool(_get(cfg, "allow_loss_change", False)),
    )
    if resume is None or resume.action != "adopt":
        return  # a change is announced by the trainer when training starts
    cfg["loss"] = resume.loss
    for option in options_of(resume.loss):
        if resume.options.get(option.name) is not None:
            cfg[option.name] = resume.options[option.name]
    LOG.warning(resume.message())


class DistMatchPlugin(BasePlugin):
    """Train with EMO / GEM / the baselines: add `loss: <name>` (and its options) to an Axolotl config."""

    def _is_active_instance(self) -> bool:
        """False for a second registration of this plugin (e.g. listed in `plugins` and auto-loaded through the
        entry point under another name): the first one acts, so the config schema gets the args class once."""
        try:
            from axolotl.integrations.base import PluginManager
        except ImportError:  # pragma: no cover - Axolotl is installed whenever this module imports
            return True
        for plugin in PluginManager.get_instance().plugins.values():
            if isinstance(plugin, DistMatchPlugin):
                return plugin is self
        return True

    def get_input_args(self) -> str | None:
        return ARGS_PATH if self._is_active_instance() else None

    def register(self, cfg: dict) -> None:
        if self._is_active_instance():
            continue_recorded_loss(cfg)
        loss = _get(cfg, "loss")
        if loss is None:
            return
        from importlib.metadata import version

        from packaging.version import Version

        installed = version("axolotl")
        if Version(installed) < Version(MIN_AXOLOTL):
            raise RuntimeError(
                f"loss: {loss} needs axolotl >= {MIN_AXOLOTL} (installed: {installed}). "
                "Upgrade it: pip install -U 'distmatch[axolotl]'"
            )
        try:
            from . import trainer  # noqa: F401  (fail here, loudly, rather than at trainer-build time)
        except ImportError as err:
            from trl_ext.checks import DistMatchConfigError

            raise DistMatchConfigError(
                f"loss: {loss} is set but the distmatch Axolotl trainer failed to import ({err}); without it "
                "Axolotl would train with plain cross-entropy. Reinstall: pip install 'distmatch[axolotl]'"
            ) from err

    def get_trainer_cls(self, cfg: Any) -> type | None:
        loss = _get(cfg, "loss")
        if loss is None or not self._is_active_instance():
            return None
        from .trainer import DistMatchTrainer

        options = {o.name: _get(cfg, o.name, o.default) for o in LOSS_OPTIONS}
        LOG.info("distmatch: training with loss=%s (%s)", loss, options)
        return DistMatchTrainer.configured(
            loss, options, allow_loss_change=bool(_get(cfg, "allow_loss_change", False))
        )


__all__ = ["DistMatchPlugin"]
