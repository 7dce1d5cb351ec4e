"""`python -m distmatch_hooks install-pth`: write the hooks' `.pth` files into this interpreter's site-packages."""

import sys

from distmatch_hooks.pth import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
