"""`pip install` into a venv, done by uv where it can be, by pip otherwise: the venv builds of `make venvs` and the
release check's clean venv (`tools/dist.py`).

    python tools/installer.py VENV_PYTHON [pip install arguments ...]

uv installs the same requirements, resolved to the same versions, in a fraction of pip's time (the five venvs:
minutes of CPU under pip, seconds under uv). It reads none of pip's settings, so they are carried over from
``pip config list`` (the configuration files and the ``PIP_*`` environment, environment first, as pip reads them):
index-url, extra-index-url, find-links, constraint, no-index and cert. ``--index-strategy unsafe-best-match`` makes
it pick, as pip does, the best version found on any index. uv itself is installed once into ``build/uv`` (a small
venv, from the same package index); where that fails, or with ``DISTMATCH_INSTALLER=pip``, pip does the install
(with ``--no-compile``). Every venv keeps its own pip: `pip check`, `pip freeze` and the tests use it.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
UV_VENV = REPO / "build" / "uv"
UV = UV_VENV / "bin" / "uv"
DEFAULT_INDEX = "https://pypi.org/simple"  # pip's default index-url
#: pip settings that uv is told about (uv's options of the same names, but `cert`: uv reads SSL_CERT_FILE)
CARRIED = ("index-url", "extra-index-url", "find-links", "constraint", "no-index", "cert")


def pip_settings(python: str) -> dict[str, str]:
    """pip's settings as `pip config list` shows them: `global.find-links='...'`, `:env:.find-links='...'` (the
    environment wins over the files, the user's file over the global one: the later line wins)."""
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    files: dict[str, str] = {}
    environment: dict[str, str] = {}
    for line in listed.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if not sep or section not in (":env:", "global", "install"):
            continue
        (environment if section == ":env:" else files)[name] = shlex.split(value)[0] if value else ""
    return {**files, **environment}


def uv_arguments(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The uv options and environment that say what pip's settings say."""
    options = ["--index-strategy", "unsafe-best-match"]
    environment: dict[str, str] = {}
    # pip pools the files of every index and takes the best wheel for this interpreter; uv takes a version's files
    # from the first index that has it. A partial local mirror listing only `multiprocess`'s py310 wheel thus gave
    # Python 3.11 the py310 code (its `fork_exec` call fails). The package index pip would use comes first, so that
    # uv sees the full file list where pip does.
    no_index = settings.get("no-index", "").lower() in ("1", "true", "yes", "on")
    if not no_index:
        options += ["--extra-index-url", settings.get("index-url") or DEFAULT_INDEX]
    for name in CARRIED:
        value = settings.get(name)
        if value is None:
            continue
        if name == "no-index":
            if no_index:
                options.append("--no-index")
        elif name == "cert":
            environment["SSL_CERT_FILE"] = value
        else:
            flag = {"index-url": "--index-url", "extra-index-url": "--extra-index-url"}.get(name, f"--{name}")
            for item in value.split():
                if item.startswith("file://") and not Path(item[len("file://") :]).exists():
                    continue  # pip warns and skips a local index that is not there; uv would fail
                options += [flag, item]
    return options, environment


def ensure_uv(python: str) -> Path | None:
    """uv in build/uv, installed on first use (under a lock: the venvs are built side by side); None if it cannot
    be installed here."""
    if os.environ.get("DISTMATCH_INSTALLER", "uv") == "pip":
        return None
    UV_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(UV_VENV.parent / ".uv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if UV.is_file() and subprocess.run([UV, "--version"], capture_output=True).returncode == 0:
            return UV
        built = subprocess.run(
            f"{shlex.quote(python)} -m venv --clear {UV_VENV} && {UV_VENV}/bin/python -m pip install -q uv",
            shell=True,
            capture_output=True,
            text=True,
        )
        if built.returncode == 0 and UV.is_file():
            return UV
        tail = (built.stdout + built.stderr).strip().splitlines()[-1:]
        print(f"==> tools/installer.py: uv could not be installed ({' '.join(tail)}); pip installs instead")
        return None


def install_command(python: str, arguments: list[str], uv: Path | None) -> tuple[list[str], dict[str, str]]:
    """The command (and its extra environment) that installs `arguments` into the venv of `python`."""
    if uv is None:
        return [python, "-m", "pip", "install", "--no-compile", *arguments], {}
    options, environment = uv_arguments(pip_settings(python))
    return [str(uv), "pip", "install", "--python", python, *options, *arguments], environment


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    python, arguments = argv[0], argv[1:]
    command, environment = install_command(python, arguments, ensure_uv(sys.executable))
    return subprocess.run(command, env={**os.environ, **environment}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
