"""The file ms-swift imports with `--external_plugins`: adds every distmatch loss to ms-swift's `loss_map`.

ms-swift imports a plugin by its path, not as a package module, so this file only calls the package's `register`.
"""

from swift_distmatch.loss import register

register()
