"""Another process looking at, or holding, an output folder's `flock` (what `trl_ext.output_lock` takes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: A second interpreter trying the folder's lock without waiting: prints "free" or "busy".
PROBE = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
    "try:\n"
    "    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
    "    print('free')\n"
    "except OSError:\n"
    "    print('busy')\n"
)


def probe(folder: Path) -> str:
    """ "free" or "busy": whether another process could take the folder's lock now."""
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(folder)], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()


def holder(folder: Path) -> subprocess.Popen:
    """A process that takes the folder's lock and keeps it until its stdin closes (`communicate("")`); started and
    holding when this returns."""
    held = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PROBE.replace("print('free')", "print('free', flush=True); sys.stdin.read()"),
            str(folder),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert held.stdout is not None and held.stdout.readline().strip() == "free"
    return held
