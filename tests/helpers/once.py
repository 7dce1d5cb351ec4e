"""Expensive set-up built once per test run, also when pytest-xdist splits the run over several workers.

A session-scoped fixture runs once per xdist worker; for a build that costs a training run or an `lm_eval` run, that
would repeat the work on each worker. `build_once` runs the build in a folder shared by the workers of one run (the
parent of each worker's base temporary folder), under a file lock: the first worker builds, the others wait and
reuse the result read-only. Without xdist it is a plain once-per-session build.
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from filelock import FileLock

T = TypeVar("T")
_DONE = ".built.pickle"


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the workers of this run share (the session's base temporary folder without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T]) -> T:
    """`build(folder)` once per test run in `<shared root>/<name>`; its (picklable) result is returned to every
    caller. A build that failed leaves nothing behind, so the next caller builds again (and fails the same way)."""
    folder = shared_root(tmp_path_factory) / f"once-{name}"
    with FileLock(f"{folder}.lock"):
        done = folder / _DONE
        if done.exists():
            return pickle.loads(done.read_bytes())
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            result = build(folder)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        done.write_bytes(pickle.dumps(result))
        return result
