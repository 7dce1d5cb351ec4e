"""`python -m swift_distmatch`: print the path to pass to `swift sft --external_plugins`."""

from __future__ import annotations

from . import PLUGIN_FILE

if __name__ == "__main__":
    print(PLUGIN_FILE)
