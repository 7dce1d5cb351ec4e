"""One training run per output folder: a second run into a folder another run is writing is refused.

Two runs into one `output_dir` would write their checkpoints over each other (same `checkpoint-N` names, one
`trainer_state.json`), and a later resume would mix two runs. A run takes an exclusive `flock` on the folder itself
(no file is added to it, so nothing extra is saved or pushed); the kernel releases it when the holder ends, also
after `kill -9`, so a killed run never leaves a stale lock.

Who holds it: the launcher (`trl sft`, `distmatch-trl sft`) takes it once its checks pass, before it starts the
training processes, and keeps it until they end; it names itself in `HOLDER_ENV` (`<pid>:<folder>`), which the
processes it starts inherit, so their trainer knows the lock is held for them. Without a launcher (the Python API)
the trainer's main process takes it. Two launches into one folder therefore meet in the launchers: the second is
refused there, in one line, before any training process starts.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .checks import DistMatchConfigError

#: `<pid>:<folder>` of the launcher holding a folder's lock for the processes it starts.
HOLDER_ENV = "DISTMATCH_OUTPUT_LOCK_HOLDER"

#: Folder -> open descriptor holding the lock (None: held by this process's launcher), for the life of the process.
_HELD: dict[str, int | None] = {}


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


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])  # the field after the state
    except (OSError, ValueError, IndexError):
        return None


def _held_by_launcher(folder: Path) -> bool:
    """Whether `HOLDER_ENV` names `folder` and a live ancestor of this process as its holder."""
    pid_text, _, named = os.environ.get(HOLDER_ENV, "").partition(":")
    if named != str(folder) or not pid_text.isdigit():
        return False
    holder, pid = int(pid_text), os.getpid()
    for _ in range(64):  # launcher -> (torchrun) -> rank: a few levels
        pid = _parent_pid(pid)
        if pid is None or pid <= 1:
            return False
        if pid == holder:
            return True
    return False


def check_output_dir_free(output_dir: str | os.PathLike[str] | None) -> None:
    """Refuse now if another run holds the folder's lock (a quick look; `lock_output_dir` takes it)."""
    if output_dir is None:
        return
    folder = Path(output_dir).expanduser().resolve()
    if str(folder) in _HELD or not folder.is_dir() or _held_by_launcher(folder):
        return
    fd = _try_lock(folder)
    if fd is None:
        raise _refusal(output_dir)
    os.close(fd)  # closing releases the lock taken to look


def lock_output_dir(output_dir: str | os.PathLike[str], *, for_children: bool = False) -> None:
    """Take the folder's lock (creating the folder) or refuse in one line; idempotent within a process. A process
    whose launcher holds it takes nothing. `for_children`: a launcher, which names itself in `HOLDER_ENV` for the
    processes it starts."""
    folder = Path(output_dir).expanduser().resolve()
    if str(folder) not in _HELD:
        if _held_by_launcher(folder):
            _HELD[str(folder)] = None
        else:
            folder.mkdir(parents=True, exist_ok=True)
            fd = _try_lock(folder)
            if fd is None:
                raise _refusal(output_dir)
            _HELD[str(folder)] = fd
    if for_children and _HELD[str(folder)] is not None:
        os.environ[HOLDER_ENV] = f"{os.getpid()}:{folder}"


__all__ = ["HOLDER_ENV", "check_output_dir_free", "lock_output_dir"]
