"""One training run per output folder: a second run into a folder another run is writing is refused.

Two runs into one `output_dir` would write their checkpoints over each other (same `checkpoint-N` names, one
`trainer_state.json`), and a later resume would mix two runs. The main process of a distmatch run takes an exclusive
`flock` on the folder itself (no file is added to it, so nothing extra is saved or pushed); the kernel releases it
when the process ends, also after `kill -9`, so a killed run never leaves a stale lock.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .checks import DistMatchConfigError

#: Folder -> open descriptor holding the lock, for the life of the process.
_HELD: dict[str, int] = {}


def _refusal(output_dir: str | os.PathLike[str]) -> DistMatchConfigError:
    return DistMatchConfigError(
        f"output_dir={str(output_dir)!r} is being written by another training run; give this run another "
        "`output_dir` (two runs in one folder would overwrite each other's checkpoints), or wait for it to end."
    )


def _try_lock(folder: Path) -> int | None:
    """An open descriptor of `folder` holding its exclusive lock, or None when another process holds it."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return None
    return fd


def check_output_dir_free(output_dir: str | os.PathLike[str] | None) -> None:
    """Refuse now (a launcher, before starting the training processes) if another run holds the folder's lock."""
    if output_dir is None:
        return
    folder = Path(output_dir).expanduser().resolve()
    if str(folder) in _HELD or not folder.is_dir():
        return
    fd = _try_lock(folder)
    if fd is None:
        raise _refusal(output_dir)
    os.close(fd)  # closing releases the lock taken to look


def lock_output_dir(output_dir: str | os.PathLike[str]) -> None:
    """Take the folder's lock (creating the folder) or refuse in one line; idempotent within a process."""
    folder = Path(output_dir).expanduser().resolve()
    if str(folder) in _HELD:
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = _try_lock(folder)
    if fd is None:
        raise _refusal(output_dir)
    _HELD[str(folder)] = fd


__all__ = ["check_output_dir_free", "lock_output_dir"]
