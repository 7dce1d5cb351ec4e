"""distmatch's activation hooks: the plain `trl sft --loss ...`, `lm_eval --tasks distmatch_...` and Axolotl configs
with `loss:` use distmatch without extra flags.

- `distmatch_hooks.trl`: `trl sft` with a distmatch option trains with the distmatch SFT config and trainer;
- `distmatch_hooks.lm_eval`: lm-eval's TaskManager finds the distmatch task folder, and runs with `distmatch_*`
  tasks check their options before the model is built;
- `distmatch_hooks.axolotl`: an Axolotl config with a distmatch key loads the distmatch plugin;
- `distmatch_hooks._common`: the import-finder mechanism they share (`PatchAfterImport`) and the one-line error
  printer;
- `distmatch_hooks.pth`: the `.pth` files whose single lines (`import distmatch_hooks.trl`, ...) import the hooks at
  every interpreter start, and `python -m distmatch_hooks install-pth`, which writes them for editable installs.

Every `.pth` line imports this package first: it stays cheap and inert (only `os`/`sys`, nothing that can raise).
"""

from distmatch.errors import DistMatchConfigError
from distmatch_hooks._common import LOSS_OPTION_NAMES, LOSS_OPTION_PREFIXES

__all__ = ["LOSS_OPTION_NAMES", "LOSS_OPTION_PREFIXES", "DistMatchConfigError"]
