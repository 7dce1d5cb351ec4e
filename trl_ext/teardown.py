"""The end of a multi-process run: every communication thread is joined while the interpreter is still whole.

Why a rank could abort after a successful run (`terminate called without an active exception`, SIGABRT): each gloo
process group runs worker threads (`pt_gloo_runloop`) and a socket thread (`gloo_tcp_loop`); they end only when the
group's C++ object is destroyed. `torch.distributed.destroy_process_group()` (TRL's `trainer.end()`, or our exit
handler) only forgets the groups: DeepSpeed keeps them (its `groups` module, the engine, the ZeRO optimizer, every
parameter's `_dp_group`, and the default arguments of `deepspeed.comm.torch.TorchBackend.barrier`, which capture the
default group when DeepSpeed is imported after it exists: DDP runs too), so the threads are still running when
CPython finalizes. A
worker that drops the last reference of a finished collective's tensor then needs the GIL; during finalization
CPython (3.11, 3.12) answers with `pthread_exit`, whose forced unwinding through a `noexcept` C++ destructor calls
`std::terminate`. Whether a worker is that late depends on scheduling: 2 of 20 ZeRO-2 launches aborted in an
earlier loop on another machine; on the machine that measured this fix, 0 of 26 launches without it aborted, but
every rank still had 3 to 6 gloo threads running at exit (docs/distributed.md).

`release_process_groups` (registered with `atexit` by the trainers) removes the cause: it destroys the default group
if it still exists, then drops every Python reference to a process group, so the groups' destructors run now, on the
main thread, with the GIL released (torch's bindings destroy a group without the GIL), and join the threads. It then
counts the communication threads left (Linux `/proc`): none is expected; `DISTMATCH_DEBUG` prints the count, a
non-zero count is logged as a warning.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
import types
from pathlib import Path

logger = logging.getLogger(__name__)

#: Native threads that belong to a live gloo process group.
COMMUNICATION_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")
#: The line `DISTMATCH_DEBUG=1` prints on every rank at exit (the tests read it).
RELEASED_LINE = "distmatch: process groups released at exit; communication threads left: {left}"


def communication_threads() -> int | None:
    """How many gloo threads this process has (None where `/proc/self/task` does not exist)."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None
    count = 0
    for task in tasks.iterdir():
        try:
            count += (task / "comm").read_text().strip() in COMMUNICATION_THREADS
        except OSError:  # the thread ended while we looked
            continue
    return count


def _is_group(value: object, group_type: type) -> bool:
    return issubclass(type(value), group_type)  # type(), not isinstance: no proxy's `__class__` is asked


def _slot_names(kind: type) -> list[str]:
    names = []
    for klass in kind.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return names


def _drop_references(group_type: type) -> int:
    """Replace every reference to a process group that Python can reach by None: in a plain dict (module globals,
    instance attributes), a list, a closure cell, a slot (FSDP2's `FSDPMeshInfo`) or a function's default arguments
    (DeepSpeed's `TorchBackend.barrier(self, group=GroupMember.WORLD)` captures the default group when
    `deepspeed.comm` is imported after the group exists, as under `accelerate launch`). Only called at exit, once the
    groups are destroyed: what is dropped could no longer communicate."""
    dropped = 0
    for holder in gc.get_objects():
        kind = type(holder)
        if kind is types.FunctionType:
            defaults = holder.__defaults__ or ()
            if any(_is_group(value, group_type) for value in defaults):
                holder.__defaults__ = tuple(None if _is_group(v, group_type) else v for v in defaults)
                dropped += 1
            continue
        if not any(_is_group(referent, group_type) for referent in gc.get_referents(holder)):
            continue
        if kind is dict:  # exactly dict: a Mapping subclass may compute its items (transformers' lazy maps)
            keys = [key for key, value in dict.items(holder) if _is_group(value, group_type)]
            for key in keys:
                holder[key] = None
            dropped += len(keys)
        elif kind is list:
            for index, value in enumerate(holder):
                if _is_group(value, group_type):
                    holder[index] = None
                    dropped += 1
        elif kind is types.CellType:
            holder.cell_contents = None
            dropped += 1
        else:  # an object's slots or inline attributes (CPython >= 3.11 keeps them without a dict object)
            names = _slot_names(kind) + list(getattr(holder, "__dict__", None) or ())
            for name in names:
                if _is_group(getattr(holder, name, None), group_type):
                    object.__setattr__(holder, name, None)  # also frozen dataclasses
                    dropped += 1
    return dropped


def release_process_groups() -> int | None:
    """Destroy the default process group (if any), end every group's threads; return the threads left."""
    try:
        import torch.distributed as dist
    except ImportError:
        return communication_threads()
    if not dist.is_available():
        return communication_threads()
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()  # trainer, engine and optimizer cycles first: most references go with them
    if communication_threads():
        _drop_references(dist.ProcessGroup)
        gc.collect()
    left = communication_threads()
    if os.environ.get("DISTMATCH_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off"):
        # one write: the ranks share one stderr
        sys.stderr.write(f"{RELEASED_LINE.format(left=left)} (rank {os.environ.get('RANK', 0)})\n")
        sys.stderr.flush()
    if left:
        logger.warning(
            "distmatch: %s communication threads are still running at exit (a process group is referenced from "
            "where it cannot be released); the process may abort while the interpreter shuts down.",
            left,
        )
    return left


def release_process_groups_at_exit() -> None:
    """Register `release_process_groups` with `atexit` (idempotent; runs before earlier-registered handlers)."""
    atexit.unregister(release_process_groups)
    atexit.register(release_process_groups)


__all__ = [
    "COMMUNICATION_THREADS",
    "RELEASED_LINE",
    "communication_threads",
    "release_process_groups",
    "release_process_groups_at_exit",
]
