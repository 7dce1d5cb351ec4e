"""What the sandbox's tests share: running a program with the opt-in, and the check that a test leaves no scratch
folder and no sandboxed process behind (`clean_host`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from eval_tasks import sandbox
from eval_tasks.sandbox import harness
from eval_tasks.sandbox.config import PROGRAM_FILE


def scratch_folders() -> set[str]:
    """This process's scratch folders: other sandboxes may run beside the test (the other xdist worker, lm-eval's
    code tasks, a parallel mutants job), and their folders come and go on their own."""
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith(harness.scratch_prefix())}


def sandbox_processes() -> list[str]:
    """Host processes running a sandboxed program of this process (their command line names its scratch folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if harness.scratch_prefix().encode() in cmdline and PROGRAM_FILE.encode() in cmdline:
                found.append(f"{entry}: {cmdline!r}")
    return found


@pytest.fixture
def clean_host():
    """Asserts, after the test, that no scratch folder and no sandboxed process is left."""
    before = scratch_folders()
    yield
    assert scratch_folders() - before == set()
    assert sandbox_processes() == []


def run(program: str | tuple[str, ...], timeout_s: float = 3.0, **kwargs) -> sandbox.ExecutionResult:  # noqa: ANN003
    return sandbox.execute(program, timeout_s, allow=True, **kwargs)
