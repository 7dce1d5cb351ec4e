"""The sandbox's contract (eval_tasks.sandbox's docstring) on limits, time, opt-in, scratch and output, each checked
with real programs.

Every `SandboxLimits` field given to `execute_many` is the limit a program meets (each one alone: a program just
inside passes, the same program past it fails), `timeout_s` is wall time from the program's start (a sleeping
program is stopped too) and CPU time is bounded by it (not below it), an explicit ``allow=False`` wins over the
environment's opt-in, the program's scratch folder is ``/tmp/distmatch-sandbox-*`` (working directory, ``HOME``,
``TMPDIR``), the failure reason holds the end of stderr and nothing of stdout, and a sandbox that cannot start the
program raises `SandboxUnavailable` from `execute_many` too.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks import sandbox
from eval_tasks.sandbox import harness

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("unshare") is None, reason="needs Linux and unshare"
)


@pytest.fixture(autouse=True)
def _no_scratch_left():
    before = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith(harness.scratch_prefix())}
    yield
    after = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith(harness.scratch_prefix())}
    assert after - before == set()


def many(programs: list[str], timeout_s: float = 5.0, **limits: int) -> list[sandbox.ExecutionResult]:
    return sandbox.execute_many(
        programs, timeout_s, workers=2, limits=sandbox.SandboxLimits(**limits), allow=True
    )


def test_an_explicit_allow_false_wins_over_the_environment_opt_in(monkeypatch, tmp_path) -> None:
    marker = tmp_path / "ran"
    program = f"open({str(marker)!r}, 'w')\n"
    monkeypatch.setenv(sandbox.ALLOW_ENV, "1")
    for call in (
        lambda: sandbox.execute(program, 2.0, allow=False),
        lambda: sandbox.execute_many([program], 2.0, allow=False),
    ):
        with pytest.raises(DistMatchConfigError, match="Refusing to run model-generated code"):
            call()
    assert not marker.exists()
    assert sandbox.execute("pass", 2.0).passed  # allow unset: the environment's opt-in is enough
    monkeypatch.setenv(sandbox.ALLOW_ENV, "0")
    with pytest.raises(DistMatchConfigError, match="Refusing"):
        sandbox.execute("pass", 2.0)
    assert sandbox.execute("pass", 2.0, allow=True).passed


def test_execute_many_applies_its_file_size_limit() -> None:
    write = "open('f', 'wb').write(b'0' * ({} * 2**20))\n"
    small, big = many([write.format(1), write.format(3)], file_size_mb=2, scratch_mb=64)
    assert small.passed, small.reason
    assert not big.passed and "File too large" in big.reason, big.reason


def test_execute_many_applies_its_memory_limit() -> None:
    hog = "b = bytearray({} * 2**20)\nb[-1] = 1\n"
    (within,) = many([hog.format(64)], memory_mb=400)
    assert within.passed, within.reason
    # the same 600 MB: refused under a 400 MB address space, allowed under 2 GB (MB, not GB: 400 GB would allow it)
    (past,) = many([hog.format(600)], memory_mb=400)
    assert not past.passed and "MemoryError" in past.reason, past.reason
    assert many([hog.format(600)], memory_mb=2048)[0].passed


def test_execute_many_applies_its_process_limit() -> None:
    """RLIMIT_NPROC = processes: the program (the sandbox's only process of its user) can start processes - 1."""
    program = (
        "import os, signal\n"
        "started = 0\n"
        "for _ in range(20):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            signal.pause()\n"
        "            os._exit(0)\n"
        "        started += 1\n"
        "    except OSError:\n"
        "        break\n"
        "assert started == {}, started\n"
    )
    results = many([program.format(3), program.format(5)], processes=4)
    assert results[0].passed, results[0].reason
    assert not results[1].passed and "AssertionError: 3" in results[1].reason, results[1].reason


def test_the_scratch_folder_is_in_tmp_and_is_cwd_home_and_tmpdir() -> None:
    program = (
        "import os, tempfile\n"
        "here = os.getcwd()\n"
        f"assert os.path.dirname(here) == '/tmp' and os.path.basename(here).startswith({harness.SCRATCH_PREFIX!r}), here\n"
        "assert os.environ['HOME'] == here and os.environ['TMPDIR'] == here, dict(os.environ)\n"
        "assert tempfile.gettempdir() == here and os.path.dirname(__file__) == here, __file__\n"
        "with tempfile.NamedTemporaryFile(dir=None) as f:\n"
        "    assert os.path.dirname(f.name) == here\n"
    )
    result = sandbox.execute(program, 5.0, allow=True)
    assert result.passed, result.reason


def test_the_timeout_counts_wall_time_a_sleeping_program_is_stopped() -> None:
    start = time.monotonic()
    result = sandbox.execute("import time\ntime.sleep(30)\n", 1.0, allow=True)
    assert not result.passed and result.reason == "timed out after 1s", result
    assert time.monotonic() - start < 10.0
    # the same kind of program within its timeout passes: the limit is timeout_s, not a fixed one
    assert sandbox.execute("import time\ntime.sleep(1.5)\n", 6.0, allow=True).passed


def test_the_cpu_limit_is_not_below_the_timeout() -> None:
    """A program computing 1.3 CPU-seconds within a 10 s timeout passes (the CPU limit is above the timeout)."""
    busy = "import time\nwhile time.process_time() < 1.3:\n    pass\n"
    result = sandbox.execute(busy, 10.0, allow=True)
    assert result.passed, result.reason


def test_the_reason_holds_the_end_of_stderr_and_nothing_of_stdout() -> None:
    program = (
        "import sys\n"
        "print('STDOUT-MARK ' * 1000)\n"
        f"sys.stderr.write('noise ' * {sandbox.OUTPUT_TAIL})\n"
        "raise ValueError('the last words')\n"
    )
    result = sandbox.execute(program, 5.0, allow=True)
    assert result.returncode == 1 and result.reason.endswith("ValueError: the last words"), result.reason[
        -200:
    ]
    assert "STDOUT-MARK" not in result.reason


def test_a_sandbox_that_cannot_start_raises_from_execute_many_never_a_failed_sample(monkeypatch) -> None:
    monkeypatch.setenv(sandbox.PYTHON_ENV, "/nonexistent/python3")
    with pytest.raises(sandbox.SandboxUnavailable, match="could not start the program"):
        many(["pass", "raise SystemExit(1)"])
    with pytest.raises(sandbox.SandboxUnavailable, match="nothing was run"):
        sandbox.execute("pass", 2.0, allow=True)
