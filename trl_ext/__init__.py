"""distmatch: distribution-matching SFT losses (EMO, GEM and baselines).

``trl_ext`` is the layer above the torch-free ``distmatch`` package: the framework-agnostic losses
(``trl_ext.losses``) and the TRL integration built on them. ``axolotl_distmatch`` and ``eval_tasks`` build on this
package.
"""

from distmatch import __version__

__all__ = ["__version__"]
