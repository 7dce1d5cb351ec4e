"""eval_tasks.sandbox: each attack fails its sample and leaves the host as it was; the opt-in; refusals.

Every attack runs for real in the sandbox (loopback addresses only, bounded time): an infinite loop, a fork loop,
a memory hog, a connection to a listener the test opens on 127.0.0.1, reading the parent's environment (directly
and through /proc); what a program sees and writes outside its scratch folder, in three layouts of the checkout, the
venvs and TMPDIR: test_layouts.py; the system call filter: test_syscalls.py. After each: no file outside scratch, no scratch folder
left, no process of the sandbox alive. A pass is the harness's verdict: every way of ending the interpreter before
the checks end, or of printing or writing a marker, fails a wrong HumanEval completion.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks import sandbox
from eval_tasks.code import code_tasks as ct
from eval_tasks.sandbox import harness
from eval_tasks.sandbox.config import UID_BASE
from tests.eval.sandbox.conftest import run, scratch_folders
from tests.helpers.env import REPO_ROOT

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("unshare") is None, reason="needs Linux and unshare"
)

SECRET = "DISTMATCH_TEST_SECRET_" + uuid.uuid4().hex[:8]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "code"


def test_a_correct_program_passes_and_a_failing_one_does_not(clean_host) -> None:
    ok = run("def f(x):\n    return x + 1\nassert f(1) == 2\n")
    assert ok == sandbox.ExecutionResult(True, "passed", 0)
    bad = run("assert 1 + 1 == 3\n")
    assert not bad.passed and bad.returncode == 1 and "AssertionError" in bad.reason
    syntax = run("def f(:\n")
    assert not syntax.passed and "SyntaxError" in syntax.reason


def test_the_program_may_write_in_its_scratch_folder(clean_host) -> None:
    result = run(
        "import os, tempfile\nopen('out.txt', 'w').write('x')\n"
        "open(os.path.join(tempfile.gettempdir(), 't'), 'w').write('y')\nassert open('out.txt').read() == 'x'\n"
    )
    assert result.passed, result.reason


def test_infinite_loop_is_killed_at_the_time_limit(clean_host) -> None:
    start = time.monotonic()
    result = run("while True:\n    pass\n", timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert not result.passed and result.reason == "timed out after 1s"
    assert elapsed < 4.0


def test_fork_loop_is_contained_and_every_child_is_gone(clean_host) -> None:
    program = (
        "import os, time\n"
        "forked = 0\n"
        "for _ in range(10000):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "        forked += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(forked)\n"
        "raise SystemExit(0 if forked >= 10000 else 3)\n"
    )
    result = run(program, timeout_s=3.0, limits=sandbox.SandboxLimits(processes=16))
    # The process limit stops the loop long before 10,000 children; the sleeping children die with the program.
    assert not result.passed and result.returncode == 3, result


def test_memory_hog_fails(clean_host) -> None:
    result = run("x = bytearray(3 * 2**30)\nx[-1] = 1\n", limits=sandbox.SandboxLimits(memory_mb=256))
    assert not result.passed and "MemoryError" in result.reason


def test_a_huge_file_is_stopped_by_the_file_size_limit(clean_host) -> None:
    result = run(
        "open('big', 'wb').write(b'0' * (8 * 2**20))\n", limits=sandbox.SandboxLimits(file_size_mb=1)
    )
    # Python ignores SIGXFSZ, so the write fails with EFBIG.
    assert not result.passed and "File too large" in result.reason


def test_connection_to_a_loopback_listener_fails(clean_host) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        program = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
        )
        result = run(program)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever connected
    assert not result.passed and "Network is unreachable" in result.reason


def test_the_parent_environment_is_not_visible(clean_host, monkeypatch) -> None:
    monkeypatch.setenv(SECRET, "hunter2")
    direct = run(f"import os\nassert os.environ.get({SECRET!r}) == 'hunter2'\n")
    assert not direct.passed and "AssertionError" in direct.reason
    # Nor through /proc: it shows only the sandbox's own processes, so no process holds the secret.
    via_proc = run(
        "import os\nfound = []\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n        found.append(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError:\n        pass\n"
        "assert any(b'hunter2' in e for e in found), sorted(os.listdir('/proc'))[:5]\n"
    )
    assert not via_proc.passed and "AssertionError" in via_proc.reason
    seen = run(
        "import os\nallowed = {'PATH', 'HOME', 'TMPDIR', 'LANG', 'LC_CTYPE', 'PYTHONPATH'}\n"
        "allowed |= {'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'}\n"
        "assert set(os.environ) <= allowed, sorted(os.environ)\n"
        "assert all('site-packages' in p for p in os.environ.get('PYTHONPATH', 'site-packages').split(':'))\n"
    )
    assert seen.passed, seen.reason


def test_the_launchers_packages_are_importable() -> None:
    """EvalPlus's tests import numpy: the sandbox's interpreter sees the launcher's site-packages."""
    pytest.importorskip("numpy")
    result = run("import numpy as np\nnp.testing.assert_allclose(np.array([1.0]), [1.0 + 1e-9], atol=1e-6)\n")
    assert result.passed, result.reason


def test_nothing_runs_without_the_opt_in(clean_host, monkeypatch, tmp_path) -> None:
    marker = tmp_path / "ran"
    monkeypatch.delenv(sandbox.ALLOW_ENV, raising=False)
    for call in (
        lambda: sandbox.execute(f"open({str(marker)!r}, 'w')", 2.0),
        lambda: sandbox.execute_many([f"open({str(marker)!r}, 'w')"], 2.0),
        lambda: sandbox.execute("pass", 2.0, allow=False),
    ):
        with pytest.raises(DistMatchConfigError, match="Refusing to run model-generated code") as err:
            call()
        assert "\n" not in str(err.value)
    assert not marker.exists()
    monkeypatch.setenv(sandbox.ALLOW_ENV, "1")
    assert sandbox.execute("pass", 2.0).passed


def test_without_unshare_it_refuses_instead_of_running_unsandboxed(monkeypatch, tmp_path) -> None:
    marker = tmp_path / "ran"
    monkeypatch.setattr(harness.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailable, match="needs util-linux's `unshare`"):
        run(f"open({str(marker)!r}, 'w')")
    assert not marker.exists() and scratch_folders() == scratch_folders()


def test_bad_timeout_is_refused() -> None:
    with pytest.raises(DistMatchConfigError, match="timeout_s must be a number of seconds from 0.1 to 600"):
        sandbox.execute("pass", 0, allow=True)


def test_execute_many_keeps_the_order(clean_host) -> None:
    results = sandbox.execute_many(["pass", "raise SystemExit(4)", "pass"], 3.0, workers=2, allow=True)
    assert [r.passed for r in results] == [True, False, True] and results[1].returncode == 4


def test_the_host_mounts_stay_writable_after_a_run(clean_host, tmp_path) -> None:
    """The read-only remounts happen in the sandbox's own mount namespace only."""
    run("pass")
    probe = tmp_path / "probe"
    probe.write_text("ok")
    assert probe.read_text() == "ok"
    out = subprocess.run(["findmnt", "-n", "-o", "OPTIONS", "/"], capture_output=True, text=True, check=False)
    if out.returncode == 0:
        assert out.stdout.split(",")[0].strip() == "rw"


def test_the_limits_and_the_user_inside(clean_host) -> None:
    limits = sandbox.SandboxLimits(memory_mb=300, file_size_mb=2, processes=7)
    program = (
        "import os, resource as r\n"
        "assert r.getrlimit(r.RLIMIT_CPU) == (4, 4)\n"  # ceil(2.5 s) + 1: a backstop behind the wall-clock kill
        "assert r.getrlimit(r.RLIMIT_AS) == (300 * 2**20,) * 2\n"
        "assert r.getrlimit(r.RLIMIT_FSIZE) == (2 * 2**20,) * 2\n"
        "assert r.getrlimit(r.RLIMIT_NPROC) == (7, 7)\n"
        "assert r.getrlimit(r.RLIMIT_NOFILE) == (256, 256) and r.getrlimit(r.RLIMIT_CORE) == (0, 0)\n"
        "assert os.getpid() == 1\n"  # PID 1 of its own PID namespace
        # Started by root: a user of its own (its process budget is its own), never root; else root of a user ns.
        f"assert os.geteuid() {'>= ' + str(UID_BASE) if os.geteuid() == 0 else '== 0'}\n"
        "assert os.getuid() == os.geteuid() == os.getgid()\n"
        "status = open('/proc/self/status').read()\n"
        "assert 'CapEff:\\t0000000000000000' in status and 'NoNewPrivs:\\t1' in status, status\n"
        "assert 'CapBnd:\\t0000000000000000' in status and 'CapPrm:\\t0000000000000000' in status, status\n"
        "assert open('/proc/self/oom_score_adj').read().strip() == '1000'\n"  # the host's OOM killer's first pick
        "assert '/distmatch-sandbox-' in os.getcwd() and os.environ['HOME'] == os.getcwd()\n"
    )
    result = sandbox.execute(program, 2.5, limits=limits, allow=True)
    assert result.passed, result.reason


# ---------------------------------------------------------------------------------------------------------
# A pass means the program's code ran to its end: the ways to end the interpreter early, or to print or
# write a marker, all fail a wrong HumanEval completion; a correct one still passes whatever it does afterwards.

HUMANEVAL = json.loads((FIXTURES / "humaneval" / "test.jsonl").read_text().splitlines()[0])  # HumanEval/0
WRONG = "    return False\n"  # fails check's first assert
EARLY_EXITS = {
    "unittest_main": "import unittest\nif __name__ == '__main__':\n    unittest.main()\n",
    "unittest_main_unguarded": "import unittest\nunittest.main()\n",
    "sys_exit_0": "import sys\nsys.exit(0)\n",
    "exit": "exit()\n",
    "quit": "quit()\n",
    "os__exit_0": "import os\nos._exit(0)\n",
    "raise_system_exit": "raise SystemExit\n",
    "atexit_os__exit": "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "excepthook_exits_0": "import os, sys\nsys.excepthook = lambda *args: os._exit(0)\n",
    "sigint_handler_exits_0": "import os, signal\nsignal.signal(signal.SIGINT, lambda *a: os._exit(0))\n"
    "os.kill(os.getpid(), signal.SIGINT)\n",
    "sigkill_self": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",  # PID 1: ignored, checks fail
    "thread_exits_0_after_the_failure": "import os, threading, time\n"
    "threading.Thread(target=lambda: (time.sleep(0.3), os._exit(0))).start()\n",
    "fork_parent_exits_0": "import os, sys\nif os.fork():\n    os.wait()\n    sys.exit(0)\n",
    "exec_true": "import os\nos.execv('/bin/true', ['true'])\n",
    # A marker: printed, and written to every open file descriptor (the verdict pipe among them).
    "prints_and_writes_markers": "import os\nprint('passed')\nfor fd in range(64):\n    try:\n"
    "        os.write(fd, b'0' * 32)\n    except OSError:\n        pass\nos._exit(0)\n",
}
# Attacks inside the checks: the candidate itself ends the interpreter, or a signal handler does while it runs.
IN_CHECK = {
    "system_exit_in_check": "    raise SystemExit(0)\n",
    "alarm_handler_exits_0": "    import time\n    time.sleep(2)\n    return False\n\nimport os, signal\n"
    "signal.signal(signal.SIGALRM, lambda *a: os._exit(0))\nsignal.setitimer(signal.ITIMER_REAL, 0.2)\n",
}


def humaneval_program(completion: str) -> tuple[str, ...]:
    return ct.completion_program(HUMANEVAL, "distmatch_humaneval", completion)


@pytest.mark.parametrize("attack", sorted(EARLY_EXITS))
def test_a_wrong_program_that_ends_before_its_checks_finish_fails(clean_host, attack) -> None:
    result = run(humaneval_program(WRONG + "\n" + EARLY_EXITS[attack]), timeout_s=5.0)
    assert not result.passed, (attack, result)


@pytest.mark.parametrize("attack", sorted(IN_CHECK))
def test_a_candidate_that_ends_the_interpreter_during_the_checks_fails(clean_host, attack) -> None:
    result = run(humaneval_program(IN_CHECK[attack]), timeout_s=5.0)
    assert not result.passed, (attack, result)


def test_only_the_sandboxs_first_process_gives_the_verdict(clean_host) -> None:
    """A forked child that runs the checks to their end is not the program: the first process ended early."""
    fork = "\nimport os\nif os.fork():\n    os.wait()\n    os._exit(0)\n"
    result = run(humaneval_program(HUMANEVAL["canonical_solution"] + fork))
    assert not result.passed and result.returncode == 0, result


def test_tracing_cannot_jump_over_a_failing_assert(clean_host) -> None:
    program = (
        "import sys, linecache\n"
        "def jump(frame, event, arg):\n"
        "    if event == 'line' and linecache.getline(__file__, frame.f_lineno).strip().startswith('assert'):\n"
        "        try:\n            frame.f_lineno += 1\n        except ValueError:\n            pass\n"
        "    return jump\n"
        "sys.settrace(lambda frame, event, arg: jump if frame.f_code.co_name == 'check' else None)\n"
        "def add(a, b):\n    return a - b\n"
        "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(0, 0) == 0\n"
        "check(add)\n"
    )
    result = run(program)
    assert not result.passed and "the sandbox refuses sys.settrace" in result.reason, result


def test_the_program_is_read_as_the_utf8_the_harness_wrote() -> None:
    """A coding cookie in the completion cannot make the interpreter re-read the checks in another encoding."""
    result = run("# -*- coding: latin-1 -*-\nassert len('\u00e9') == 1\n")
    assert result.passed, result.reason


def test_a_tracer_set_through_the_c_api_is_refused_too(clean_host) -> None:
    """The audit hook behind ``sys.settrace``: ``PyEval_SetTrace`` called through ctypes sets no tracer either."""
    program = (
        "import ctypes\ncalls = []\n"
        "TRACE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.py_object, ctypes.c_int, ctypes.py_object)\n"
        "tracer = TRACE(lambda obj, frame, what, arg: calls.append(what) or 0)\n"
        "ctypes.pythonapi.PyEval_SetTrace.argtypes = [TRACE, ctypes.py_object]\n"
        "ctypes.pythonapi.PyEval_SetTrace(tracer, None)\n"
        "x = 1\ny = 2\n"
        "assert calls == [], calls[:5]\n"
    )
    result = run(program)
    assert result.passed, result.reason


@pytest.mark.parametrize(
    "tail",
    [
        "if __name__ == '__main__':\n    print(has_close_elements([1.0, 1.05], 0.1))\n",
        # Not run, as in the reference harnesses: the program's __name__ is not "__main__".
        "import unittest\nif __name__ == '__main__':\n    unittest.main()\n",
        "import doctest\ndoctest.testmod()\n",  # it clears the tracing hook (sys.settrace(None)) and restores it
        "import atexit, os\natexit.register(lambda: os._exit(3))\n",  # after the verdict nothing of it runs
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n",  # nor its threads
        "import io, sys\nprint('FAILED')\nprint('FAILED', file=sys.stderr)\nsys.stdout = io.StringIO()\n",
    ],
)
def test_a_correct_program_passes_whatever_it_does_besides(clean_host, tail) -> None:
    result = run(humaneval_program(HUMANEVAL["canonical_solution"] + "\n" + tail), timeout_s=5.0)
    assert result == sandbox.ExecutionResult(True, "passed", 0)


# ---------------------------------------------------------------------------------------------------------
# The evaluating process keeps a bounded tail of the output; a sandbox that cannot start a program raises.


def test_the_output_kept_is_a_bounded_tail(clean_host) -> None:
    program = (
        "import sys\nfor _ in range(25):\n    sys.stdout.write('o' * 2**20)\n    sys.stderr.write('e' * 2**20)\n"
        "sys.stderr.write('the end')\nraise SystemExit(3)\n"
    )
    tracemalloc.start()
    try:
        result = run(program, timeout_s=10.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.returncode == 3 and result.reason.endswith("the end"), result.reason[-100:]
    assert peak < 4 * 2**20, peak  # 50 MB printed; the evaluating process kept a few KB of it


@pytest.mark.parametrize("how", ["interpreter_that_fails", "memory_too_small_to_start"])
def test_a_sandbox_that_cannot_start_the_program_raises(clean_host, monkeypatch, how) -> None:
    limits = None
    if how == "interpreter_that_fails":
        monkeypatch.setenv(sandbox.PYTHON_ENV, "/bin/false")
    else:
        limits = sandbox.SandboxLimits(memory_mb=4)
    with pytest.raises(sandbox.SandboxUnavailable, match="could not start the program"):
        run("pass", limits=limits)
    with pytest.raises(sandbox.SandboxUnavailable, match="could not start the program"):
        sandbox.execute_many(["pass"] * 3, 3.0, workers=2, limits=limits, allow=True)


# ---------------------------------------------------------------------------------------------------------
# Only what a program needs is visible.


def test_a_unix_socket_of_the_host_cannot_be_reached(clean_host) -> None:
    folder = Path(tempfile.mkdtemp(prefix="distmatch-test-sock-"))
    folder.chmod(0o777)
    path = folder / "listener.sock"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(str(path))
            path.chmod(0o777)
            server.listen(1)
            server.settimeout(0.5)
            program = (
                f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(path)!r})\n"
                "s.sendall(b'hello from sandbox')\n"
            )
            result = run(program)
            with pytest.raises(TimeoutError):
                server.accept()  # nothing ever connected
        assert not result.passed and "No such file or directory" in result.reason, result
    finally:
        shutil.rmtree(folder)


def _readable_by_others(path: Path) -> bool:
    return bool(path.stat().st_mode & 0o004) and all(p.stat().st_mode & 0o001 for p in path.parents)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not os.path.exists("/usr/bin/python3"),
    reason="needs root, setpriv and /usr/bin/python3 to start the harness as another user",
)
def test_started_as_another_user_the_sandbox_uses_a_user_namespace() -> None:
    """The path the other tests (run as root) do not take: `unshare --map-root-user`, the same verdict and root."""
    if not all(_readable_by_others(path) for path in (REPO_ROOT / "eval_tasks" / "sandbox").glob("*.py")):
        pytest.skip("the checkout is not readable by nobody")
    script = (
        "from eval_tasks import sandbox\n"
        'ok = sandbox.execute(\'import os\\nassert os.getuid() == 0 and sorted(os.listdir("/tmp")) == '
        "[os.path.basename(os.getcwd())]\\n', 5, allow=True)\n"
        "early = sandbox.execute('import sys\\nsys.exit(0)\\nassert False\\n', 5, allow=True)\n"
        "print(ok.passed, early.passed, ok.reason)\n"
    )
    command = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "/usr/bin/python3",
        "-c",
        script,
    ]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd="/", timeout=60, check=False)
    if "SandboxUnavailable" in proc.stderr:
        pytest.skip(f"no unprivileged user namespaces here: {proc.stderr[-300:]}")
    assert proc.returncode == 0 and proc.stdout.split()[:2] == ["True", "False"], (proc.stdout, proc.stderr)


# ---------------------------------------------------------------------------------------------------------
# Bounded resources on the host.


def test_the_scratch_space_as_a_whole_is_capped(clean_host) -> None:
    limits = sandbox.SandboxLimits(file_size_mb=4, scratch_mb=8)
    many = run("for i in range(4):\n    open(f'f{i}', 'wb').write(b'0' * (3 * 2**20))\n", limits=limits)
    assert not many.passed and "No space left on device" in many.reason, many
    shm = run(
        "open('/dev/shm/x', 'wb').write(b'0' * (3 * 2**20))\nopen('y', 'wb').write(b'0' * (3 * 2**20))\n"
        "open('/dev/shm/z', 'wb').write(b'0' * (3 * 2**20))\n",
        limits=limits,
    )
    assert not shm.passed and "No space left on device" in shm.reason, shm
    files = run("for i in range(5000):\n    open(f'f{i}', 'w').close()\n", limits=limits)
    assert not files.passed and "No space left on device" in files.reason, files


# ---------------------------------------------------------------------------------------------------------
# Parallel sandboxes do not share a process budget.

HOLD_PROCESSES = (
    "import os, time\nchildren = []\nfor _ in range(2):\n    pid = os.fork()\n    if pid == 0:\n"
    "        time.sleep(0.5)\n        os._exit(0)\n    children.append(pid)\n"
    "assert all(os.waitpid(pid, 0)[1] == 0 for pid in children)\n"
)


def test_parallel_sandboxes_each_have_their_own_process_budget(clean_host) -> None:
    # the program and its two children, in each of 12 sandboxes at once
    limits = sandbox.SandboxLimits(processes=3)
    results = sandbox.execute_many([HOLD_PROCESSES] * 12, 10.0, workers=12, limits=limits, allow=True)
    assert [r.reason for r in results] == ["passed"] * 12


# ---------------------------------------------------------------------------------------------------------
# Bad input: one line before any work.


@pytest.mark.parametrize(
    "timeout",
    [math.inf, 1e10, 10**10, sandbox.MAX_TIMEOUT_S + 1, math.nan, True, -1, 0, 1e-9, 0.09, "3", None],
)
def test_a_timeout_out_of_range_is_refused_before_anything_runs(clean_host, timeout) -> None:
    for call in (
        lambda: sandbox.execute("pass", timeout, allow=True),
        lambda: sandbox.execute_many(["pass"], timeout, allow=True),
    ):
        with pytest.raises(
            DistMatchConfigError, match=r"timeout_s must be a number of seconds from 0\.1 to 600, got"
        ) as err:
            call()
        assert "\n" not in str(err.value)


def test_the_longest_timeout_is_accepted(clean_host) -> None:
    assert run("pass", timeout_s=sandbox.MAX_TIMEOUT_S).passed
    # The shortest runs the program too (whether it passes in 0.1 s depends on the machine's load).
    assert isinstance(run("pass", timeout_s=sandbox.MIN_TIMEOUT_S), sandbox.ExecutionResult)


@pytest.mark.parametrize("field", ["memory_mb", "file_size_mb", "processes", "scratch_mb"])
def test_bad_limits_are_refused(field) -> None:
    maximum = sandbox.LIMIT_MAXIMA[field]
    for value in (0, -1, 1.5, True, "8", maximum + 1, 10**7):
        with pytest.raises(
            DistMatchConfigError, match=f"SandboxLimits: {field} must be an integer from 1 to {maximum}, got"
        ) as err:
            sandbox.SandboxLimits(**{field: value})
        assert "\n" not in str(err.value)
    with pytest.raises(DistMatchConfigError, match="execute_many: workers must be a positive integer, got 0"):
        sandbox.execute_many(["pass"], 3.0, workers=0, allow=True)


def test_the_largest_limits_are_accepted_and_set(clean_host) -> None:
    """Each field's maximum is a limit the kernel takes: the program meets exactly those limits and the scratch size."""
    top = sandbox.LIMIT_MAXIMA
    program = (
        "import os, resource as r\n"
        f"assert r.getrlimit(r.RLIMIT_AS) == ({top['memory_mb']} * 2**20,) * 2\n"
        f"assert r.getrlimit(r.RLIMIT_FSIZE) == ({top['file_size_mb']} * 2**20,) * 2\n"
        f"assert r.getrlimit(r.RLIMIT_NPROC) == ({top['processes']},) * 2\n"
        "v = os.statvfs('.')\n"
        f"assert v.f_blocks * v.f_frsize == {top['scratch_mb']} * 2**20, v\n"
    )
    result = sandbox.execute_many([program], 5.0, limits=sandbox.SandboxLimits(**top), allow=True)[0]
    assert result.passed, result.reason
