"""A throw-away venv set up like the project's own (`make venvs`): distmatch importable from the working tree, not from
a wheel, and the activation hooks installed by `python -m distmatch_hooks install-pth` (the Makefile's step).

The running venv's packages (torch, trl, axolotl, ...) are seen through a path line in a `.pth` file: Python does
not process `.pth` files of a directory added that way, so the running venv's own editable install (which may point
at another checkout) stays inactive and the working tree is the one imported. Console scripts (`trl`, `lm_eval`,
`axolotl`, `accelerate`, `distmatch-trl`) are written as a pip install would, for this venv's interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

SCRIPTS = ("trl", "lm_eval", "axolotl", "accelerate", "distmatch-trl")


@dataclass
class ProjectLikeVenv:
    root: Path
    python: Path
    site_packages: Path
    bin: Path
    install_output: str


def make_project_like_venv(base: Path, repo_root: Path) -> ProjectLikeVenv:
    root = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    python = root / "bin" / "python"
    site_packages = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    # Read before the hooks' .pth files (alphabetical order): the sources, then the running venv's packages.
    (site_packages / "_distmatch_src.pth").write_text(f"{repo_root}\n")
    (site_packages / "_parent_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [str(python), "-m", "distmatch_hooks", "install-pth"],
        cwd=repo_root,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    scripts = {ep.name: ep for ep in entry_points(group="console_scripts") if ep.name in SCRIPTS}
    for name, ep in scripts.items():
        module, _, attr = ep.value.partition(":")
        target = root / "bin" / name
        target.write_text(
            f"#!{python}\nimport sys\nfrom {module} import {attr.split('.')[0]}\n\n"
            f"if __name__ == '__main__':\n    sys.exit({attr}())\n"
        )
        target.chmod(0o755)
    return ProjectLikeVenv(root, python, site_packages, root / "bin", installed.stdout)
