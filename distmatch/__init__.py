"""distmatch: distribution-matching SFT losses (EMO, GEM and baselines) for TRL and Axolotl, and their evaluations.

This package is the bottom layer: torch-free, imported by everything above it and importing nothing of the project.
It holds what every layer shares: the version, the error type of a refused setting (:mod:`distmatch.errors`), the
guarded imports of optional dependencies (:mod:`distmatch.optional`), the run record's file name and checkpoint
lookup (:mod:`distmatch.checkpoints`) and the one reader of a model folder (:mod:`distmatch.model_folder`). The layers above, lowest first: ``trl_ext`` (the losses and the TRL
integration), ``axolotl_distmatch`` and ``eval_tasks`` (built on ``trl_ext``), ``distmatch_hooks`` (the activation
hooks, which import the integrations only when a framework asks for them).
"""

from distmatch.errors import DistMatchConfigError

__version__ = "0.1.0"

__all__ = ["DistMatchConfigError", "__version__"]
