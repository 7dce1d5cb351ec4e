"""distmatch: distribution-matching SFT losses (EMO, GEM and baselines).

``trl_ext`` is the lowest layer: the framework-agnostic losses (``trl_ext.losses``) and the TRL
integration built on them. ``axolotl_distmatch`` and ``eval_tasks`` build on this package.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
