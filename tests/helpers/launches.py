"""Which tests start another program: the `launches` marker, kept honest.

`make test-quick` runs only the tests that start no subprocess (no second interpreter, no training launch). Which
tests those are is not guessed: every way a test can start a program from Python (`subprocess`, `multiprocessing`'s
spawn / forkserver, `os.system`, `os.posix_spawn`) is watched while each test runs (its set-up, call and tear-down),
and a test that starts one without carrying the `launches` marker fails with a message naming the marker. So the
quick selection (`-m "not launches"`) can never silently run a launching test, and `make test` proves the markers.

One exception: Triton's own work the first time a kernel runs on a GPU, which starts programs from inside the Triton
package (its driver asks `ldconfig -p` where libcuda is, builds its launcher with the C compiler after
`platform.architecture()` runs `file`, and its JIT compiler runs the `ptxas` it ships). On CPU the same tests run
Triton's interpreter and start nothing. So a program started while a frame of the Triton package is on the call
stack (a file under a folder `triton` holding `__init__.py` and `backends/`) is not the test's; any other, the same
programs started from anywhere else too, still counts.
"""

from __future__ import annotations

import _posixsubprocess
import functools
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


@functools.lru_cache(maxsize=4096)
def _in_triton_package(filename: str) -> bool:
    """`filename` lies inside the Triton package: under a folder `triton` holding `__init__.py` and `backends/`."""
    parts = filename.split(os.sep)
    for i, part in enumerate(parts[:-1]):
        if part == "triton":
            root = os.sep.join(parts[: i + 1])
            package = os.path.isfile(os.path.join(root, "__init__.py"))
            if package and os.path.isdir(os.path.join(root, "backends")):
                return True
    return False


def _started_by_triton() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if _in_triton_package(frame.f_code.co_filename):
            return True
        frame = frame.f_back
    return False


def _note(what: Any) -> None:
    if not _running or _running[-1] in launched or _started_by_triton():
        return
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
