"""ms-swift plugin for the distmatch losses: `swift sft --loss_type gem_ls --external_plugins <PLUGIN_FILE>`.

ms-swift pins `trl<1.0`, distmatch's TRL integration needs `trl>=1.9`: the two cannot share a venv. This package
therefore uses only the framework-free loss library (`trl_ext.losses`, pure torch) and the shared refusals; install
distmatch into an ms-swift venv with `pip install --no-deps` (docs/swift.md). Importing this package imports neither
ms-swift nor torch; `swift_distmatch.loss` (imported by the plugin file) does.
"""

from __future__ import annotations

from pathlib import Path

#: The file to pass to ms-swift's `--external_plugins` (`python -m swift_distmatch` prints it).
PLUGIN_FILE: Path = Path(__file__).resolve().parent / "plugin.py"
#: The environment variable that carries the loss options (JSON object, e.g. '{"gem_beta": 0.5}').
OPTIONS_ENV = "DISTMATCH_SWIFT_OPTIONS"

__all__ = ["OPTIONS_ENV", "PLUGIN_FILE"]
