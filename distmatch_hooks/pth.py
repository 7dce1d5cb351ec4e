"""The activation hooks' `.pth` files, and `python -m distmatch_hooks install-pth`, which writes them.

Python runs each file's single line at every interpreter start. A wheel ships them at the root of site-packages
(setup.py writes them into the build tree); an editable install (the Makefile's venvs) ships none, so the Makefile
runs `python -m distmatch_hooks install-pth`, which writes the same files into the running interpreter's
site-packages and removes the `.pth` files of earlier distmatch versions (their lines import top-level modules that
no longer exist; Python would print an error for each at every start).
"""

from __future__ import annotations

import os
import sys

#: File name -> its line. One list for wheels (setup.py) and the project's own venvs (`install_pth_files`).
PTH_FILES = {
    "distmatch_hooks.trl.pth": "import distmatch_hooks.trl\n",
    "distmatch_hooks.lm_eval.pth": "import distmatch_hooks.lm_eval\n",
    "distmatch_hooks.axolotl.pth": "import distmatch_hooks.axolotl\n",
}
#: The `.pth` files earlier versions installed (`import distmatch_trl_hook` and so on): removed by `install-pth`.
STALE_PTH_FILES = ("distmatch_trl_hook.pth", "distmatch_lm_eval_hook.pth", "distmatch_axolotl_hook.pth")
USAGE = "usage: python -m distmatch_hooks install-pth"


def _update_record(record: str, add: list[str], drop: list[str]) -> None:
    """List the names in `add` in a `.dist-info/RECORD` file (once each) and remove the rows of those in `drop`."""
    with open(record, encoding="utf-8", newline="") as stream:
        text = stream.read()
    rows = text.splitlines()
    kept = [row for row in rows if row.split(",", 1)[0] not in drop]
    listed = {row.split(",", 1)[0] for row in kept}
    kept += [f"{name},," for name in add if name not in listed]
    if kept != rows:
        eol = "\r\n" if "\r\n" in text else "\n"  # pip writes RECORD with the csv module's \r\n
        with open(record, "w", encoding="utf-8", newline="") as stream:
            stream.writelines(f"{row}{eol}" for row in kept)


def remove_stale_pth_files(site_packages: str, record: str | None = None) -> list[str]:
    """Delete the `STALE_PTH_FILES` found in `site_packages` (and their rows in `record`). Returns the paths deleted."""
    removed = []
    for name in STALE_PTH_FILES:
        path = os.path.join(site_packages, name)
        if os.path.isfile(path):
            os.remove(path)
            removed.append(path)
    if record is not None:
        _update_record(record, add=[], drop=list(STALE_PTH_FILES))
    return removed


def install_pth_files(site_packages: str, record: str | None = None) -> list[str]:
    """Write `PTH_FILES` into `site_packages` (what a wheel install has; for editable installs).

    `record`: a `.dist-info/RECORD` file to list them in, so that `pip uninstall distmatch` removes them too.
    Returns the paths written. Idempotent.
    """
    written = []
    for name, line in PTH_FILES.items():
        path = os.path.join(site_packages, name)
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(line)
        written.append(path)
    if record is not None:
        _update_record(record, add=list(PTH_FILES), drop=[])
    return written


def main(argv: list[str]) -> int:
    """`python -m distmatch_hooks install-pth`: install the hooks into the running interpreter's venv."""
    import sysconfig
    from importlib import metadata

    if argv != ["install-pth"]:
        print(USAGE, file=sys.stderr)
        return 2
    site_packages = sysconfig.get_paths()["purelib"]
    try:
        metadata.distribution("distmatch")
    except metadata.PackageNotFoundError:
        print(
            "distmatch is not installed in this interpreter; install it first (pip install -e .)",
            file=sys.stderr,
        )
        return 1
    # Listed in distmatch's RECORD when that install lives in this site-packages (pip uninstall removes them). Looked
    # up there only: from the source tree, `distmatch.egg-info` (no RECORD) would be found first on sys.path.
    record = next(
        (
            str(f.locate())
            for dist in metadata.distributions(name="distmatch", path=[site_packages])
            for f in dist.files or []
            if f.name == "RECORD"
        ),
        None,
    )
    for path in remove_stale_pth_files(site_packages, record):
        print(f"removed {path}")
    for path in install_pth_files(site_packages, record):
        print(f"installed {path}")
    return 0
