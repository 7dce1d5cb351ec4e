"""Which tests start another program: the `launches` marker, kept honest.

`make test-quick` runs only the tests that start no subprocess (no second interpreter, no training launch). Which
tests those are is not guessed: every way a test can start a program from Python (`subprocess`, `multiprocessing`'s
spawn / forkserver, `os.system`, `os.posix_spawn`) is watched while each test runs (its set-up, call and tear-down),
and a test that starts one without carrying the `launches` marker fails with a message naming the marker. So the
quick selection (`-m "not launches"`) can never silently run a launching test, and `make test` proves the markers.

Two exceptions, both Triton's own work the first time a kernel runs on a GPU (on CPU the same tests run Triton's
interpreter and start nothing): its JIT compiler running the assembler it ships
(`.../triton/backends/<backend>/bin/ptxas`), and its driver asking `ldconfig -p` where libcuda is (called from
`.../triton/backends/<backend>/driver.py`). Any other program, `ptxas` elsewhere or `ldconfig` called from anywhere
else too, still counts.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

MARKER = "launches"

#: node id of the test whose set-up / call / tear-down is running (None between tests)
_running: list[str] = []
#: node ids of the tests that started a program, with the first command of each
launched: dict[str, str] = {}


def _is_triton_compiler(what: Any) -> bool:
    """argv whose program is a tool in Triton's own backend folder (`triton/backends/<backend>/bin/<tool>`)."""
    if isinstance(what, (str, bytes, os.PathLike)) or not what:
        return False
    parts = os.fsdecode(next(iter(what))).split(os.sep)
    return len(parts) >= 5 and parts[-5] == "triton" and parts[-4] == "backends" and parts[-2] == "bin"


def _is_triton_driver_lookup(what: Any) -> bool:
    """`ldconfig` started from a Triton backend's driver module (`triton/backends/<backend>/driver.py`)."""
    if isinstance(what, (str, bytes, os.PathLike)) or not what:
        return False
    if os.path.basename(os.fsdecode(next(iter(what)))) != "ldconfig":
        return False
    frame = sys._getframe(1)
    while frame is not None:
        parts = frame.f_code.co_filename.split(os.sep)
        if len(parts) >= 4 and parts[-4:-2] == ["triton", "backends"] and parts[-1] == "driver.py":
            return True
        frame = frame.f_back
    return False


def _note(what: Any) -> None:
    if _is_triton_compiler(what) or _is_triton_driver_lookup(what):
        return
    if _running and _running[-1] not in launched:
        launched[_running[-1]] = str(what)[:200]


def _watch(function: Callable[..., Any], describe: Callable[..., Any]) -> Callable[..., Any]:
    def watched(*args: Any, **kwargs: Any) -> Any:
        _note(describe(*args, **kwargs))
        return function(*args, **kwargs)

    watched.__wrapped__ = function  # type: ignore[attr-defined]
    return watched


def install() -> None:
    """Wrap the process-starting calls once per interpreter (idempotent)."""
    if getattr(subprocess.Popen._execute_child, "__wrapped__", None) is not None:
        return
    subprocess.Popen._execute_child = _watch(  # type: ignore[method-assign]
        subprocess.Popen._execute_child, lambda self, args, *rest, **kw: args
    )
    # multiprocessing's spawn / forkserver start their interpreter through this (util.spawnv_passfds)
    _posixsubprocess.fork_exec = _watch(_posixsubprocess.fork_exec, lambda args, *rest, **kw: args)
    os.system = _watch(os.system, lambda command: command)
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, _watch(getattr(os, name), lambda path, argv, *rest, **kw: argv))


def start(nodeid: str) -> None:
    _running.append(nodeid)


def stop() -> None:
    _running.pop()
