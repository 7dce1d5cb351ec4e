"""The harness's side of the sandbox's contract (eval_tasks.sandbox's docstring and harness.py's docstrings), at its
edges: the one-line refusals (limits, time limit, program, workers, opt-in) with what they name, the verdicts and the
reasons each ending gives (passed, timed out, killed by a signal, exit status N, ended before its code ran to the
end), what a program sees of its limits, interpreter, environment and input, `SandboxUnavailable` where the sandbox
cannot start the program (no `unshare`, a relative interpreter, one that never starts it), how many sandboxes
`execute_many` runs at a time, and the harness's helpers: the stderr tail, signal names, the interpreter and the
folders shown for it, and the wait for the sandbox user's processes.

The helpers and refusals are checked directly (nothing starts); the rest with a few real sandboxed runs (about 0.2 s
each), several at a time.
"""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks import sandbox
from eval_tasks.sandbox import harness
from eval_tasks.sandbox.config import UID_BASE, InitConfig

LINUX = sys.platform.startswith("linux")
needs_sandbox = pytest.mark.skipif(
    not LINUX or shutil.which("unshare") is None, reason="needs Linux and unshare"
)
needs_root = pytest.mark.skipif(
    not LINUX or os.geteuid() != 0, reason="as root (the machine's tests run as root)"
)
R = sandbox.ExecutionResult


def scratch_folders() -> set[str]:
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith(harness.scratch_prefix())}


@pytest.fixture(autouse=True)
def _no_scratch_left():
    before = scratch_folders()
    yield
    assert scratch_folders() - before == set()


# --- refusals: one line, before anything runs --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(sandbox.LIMIT_MAXIMA))
def test_each_limit_is_an_integer_from_one_to_its_maximum(name) -> None:
    maximum = sandbox.LIMIT_MAXIMA[name]
    for value in (1, maximum):
        assert getattr(sandbox.SandboxLimits(**{name: value}), name) == value
    for value in (0, -1, maximum + 1, True, 2.0, "2", None):
        with pytest.raises(DistMatchConfigError) as err:
            sandbox.SandboxLimits(**{name: value})
        assert (
            str(err.value) == f"SandboxLimits: {name} must be an integer from 1 to {maximum}, got {value!r}."
        )


@pytest.mark.parametrize("seconds", [0.1, 1, 2.5, 600, 600.0])
def test_a_time_limit_in_range_is_taken_as_seconds(seconds) -> None:
    got = sandbox.check_timeout(seconds)
    assert type(got) is float and got == seconds


@pytest.mark.parametrize(
    "seconds", [0.0999, 0, -1, 1e-9, 600.001, 1e10, math.inf, -math.inf, math.nan, True, False, "1", None]
)
def test_a_time_limit_out_of_range_or_not_a_number_is_refused(seconds) -> None:
    with pytest.raises(DistMatchConfigError) as err:
        sandbox.check_timeout(seconds)
    assert (
        str(err.value) == f"execute: timeout_s must be a number of seconds from 0.1 to 600, got {seconds!r}."
    )


@pytest.mark.parametrize("value", ["1", "true", "yes", "TRUE", " Yes\n", "True"])
def test_the_environment_opt_in_accepts_one_true_yes(monkeypatch, value) -> None:
    monkeypatch.setenv(sandbox.ALLOW_ENV, value)
    sandbox.check_allowed()
    sandbox.check_allowed(None)


@pytest.mark.parametrize("value", [None, "", "0", "no", "false", "on", "y", "XXXX", "11"])
def test_without_the_opt_in_generated_code_is_refused(monkeypatch, value) -> None:
    if value is None:
        monkeypatch.delenv(sandbox.ALLOW_ENV, raising=False)
    else:
        monkeypatch.setenv(sandbox.ALLOW_ENV, value)
    with pytest.raises(DistMatchConfigError) as err:
        sandbox.check_allowed()
    assert str(err.value) == (
        "Refusing to run model-generated code: pass --confirm_run_unsafe_code to lm_eval for the distmatch code "
        "tasks, or set DISTMATCH_ALLOW_CODE_EXECUTION=1 (eval_tasks.sandbox runs it in a sandbox, see "
        "docs/evaluation.md)."
    )
    sandbox.check_allowed(True)  # the explicit opt-in


def test_an_explicit_allow_false_is_refused_whatever_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(sandbox.ALLOW_ENV, "1")
    with pytest.raises(DistMatchConfigError, match="^Refusing to run model-generated code"):
        sandbox.check_allowed(False)


@pytest.mark.parametrize(
    ("program", "kind"), [([], "list"), (("pass", 1), "tuple"), (b"pass", "bytes"), (7, "int")]
)
def test_a_program_refusal_names_what_it_got(program, kind) -> None:
    with pytest.raises(DistMatchConfigError) as err:
        sandbox.execute(program, 2.0, allow=True)
    assert str(err.value) == (
        "execute: program must be Python source (str) or a non-empty list or tuple of its pieces (str), "
        f"got {kind}."
    )


@pytest.mark.parametrize(("limits", "kind"), [({"memory_mb": 64}, "dict"), (64, "int")])
def test_limits_that_are_no_sandbox_limits_are_refused(limits, kind) -> None:
    with pytest.raises(DistMatchConfigError) as err:
        sandbox.execute("pass", 2.0, limits=limits, allow=True)
    assert str(err.value) == f"execute: limits must be a SandboxLimits, got {kind}."


@pytest.mark.parametrize("workers", [0, -1, True, False, 1.5, "2"])
def test_workers_must_be_a_positive_integer(workers) -> None:
    with pytest.raises(DistMatchConfigError) as err:
        sandbox.execute_many(["pass"], 2.0, workers=workers, allow=True)
    assert str(err.value) == f"execute_many: workers must be a positive integer, got {workers!r}."


def test_one_worker_is_accepted() -> None:
    assert sandbox.execute_many([], 2.0, workers=1, allow=True) == []


# --- the harness's helpers -----------------------------------------------------------------------------------------


def test_the_stderr_tail_is_its_last_400_characters_on_one_line() -> None:
    """A failure's reason shows the last 400 characters of stderr (decoded as UTF-8), its line breaks as " | "."""
    assert (
        harness._tail(b"  Traceback\nValueError: bad \xff byte\n\n")
        == "Traceback | ValueError: bad \ufffd byte"
    )
    long = ("x" * 1000 + "\nthe end").encode()
    assert harness._tail(bytearray(long)) == ("x" * 1000 + "\nthe end")[-400:].replace("\n", " | ")
    assert harness._tail(b"\xe2\x82") == "\ufffd"  # a cut multi-byte character: replaced, never raises


def test_a_signal_is_named_and_an_unnamed_one_is_its_number() -> None:
    assert harness._signal_name(9) == "SIGKILL"
    assert harness._signal_name(int(signal.SIGSEGV)) == "SIGSEGV"
    realtime = int(signal.SIGRTMIN) + 1
    assert harness._signal_name(realtime) == str(realtime)


def test_the_programs_interpreter(monkeypatch) -> None:
    """``$DISTMATCH_SANDBOX_PYTHON``; as root the system ``/usr/bin/python3`` when present; else this interpreter."""
    monkeypatch.delenv(sandbox.PYTHON_ENV, raising=False)
    assert harness._interpreter(False) == sys.executable
    system = os.path.exists("/usr/bin/python3")
    assert harness._interpreter(True) == ("/usr/bin/python3" if system else sys.executable)
    monkeypatch.setenv(sandbox.PYTHON_ENV, "/opt/python/bin/python3")
    assert harness._interpreter(True) == harness._interpreter(False) == "/opt/python/bin/python3"


def test_the_folders_shown_for_an_interpreter() -> None:
    """Its prefix and, for a venv, the base one; never the host's root."""
    own = harness._prefixes(sys.executable)
    assert sys.prefix in own and sys.base_prefix in own
    assert "/" not in own and "" not in own
    if os.path.realpath("/usr/bin/python3").startswith("/usr/"):
        assert set(harness._prefixes("/usr/bin/python3")) <= {"/usr"}
    if os.path.realpath("/bin") == "/usr/bin" and os.path.exists("/bin/python3"):
        assert "/" not in harness._prefixes("/bin/python3")  # /bin/python3's prefix by its path is the root


@needs_sandbox
@pytest.mark.parametrize("real_root", [False, True])
def test_the_launch_command(monkeypatch, tmp_path, real_root) -> None:
    """init.py's docstring: ``unshare --net --mount --pid --ipc --uts --fork --kill-child [--map-root-user] python -I
    -B init.py CONFIG``: new network, mount, PID, IPC and UTS namespaces, a user namespace too when not run as root;
    the launcher's site-packages (PYTHONPATH) only when another interpreter runs the programs. Nothing is started."""
    monkeypatch.delenv(sandbox.PYTHON_ENV, raising=False)
    command = harness._launcher(str(tmp_path), 1.0, sandbox.SandboxLimits(), real_root, (3, 4), ((0, 0),))
    end = command.index("--")
    assert command[0] == shutil.which("unshare")
    options = {"--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child"}
    assert sorted(command[1:end]) == sorted(options | (set() if real_root else {"--map-root-user"}))
    init = str(Path(harness.__file__).with_name("init.py"))
    assert command[end + 1 : -1] == [sys.executable, "-I", "-B", init]
    config = InitConfig.from_json(command[-1])
    assert config.real_root is real_root and config.python == harness._interpreter(real_root)
    if config.python == sys.executable:
        assert config.packages == ()
    else:
        assert config.packages and all(os.path.isdir(p) for p in config.packages)


@needs_root
@pytest.mark.launches
def test_the_wait_kills_the_sandbox_users_processes_and_returns_once_they_are_gone() -> None:
    """`_wait_gone(uid)`: kill and wait for any process of the sandbox's user (a uid below the sandboxes' range)."""
    uid = UID_BASE - 1000 - os.getpid() % 100000
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a process of that user, waiting
        try:
            os.close(ready_r)
            os.setgid(uid)
            os.setuid(uid)
            ctypes.CDLL(None).prctl(
                4, 1, 0, 0, 0
            )  # PR_SET_DUMPABLE: /proc/<pid> shows its user, as after an exec
            os.write(ready_w, b"1")
            while True:
                time.sleep(60)
        finally:
            os._exit(1)
    os.close(ready_w)
    status: list[int] = []
    reaper = threading.Thread(target=lambda: status.append(os.waitpid(pid, 0)[1]), daemon=True)
    reaper.start()
    try:
        assert os.read(ready_r, 1) == b"1"
        start = time.monotonic()
        harness._wait_gone(uid, limit_s=20.0)
        took = time.monotonic() - start
        reaper.join(timeout=5)
        assert status and os.WIFSIGNALED(status[0]) and os.WTERMSIG(status[0]) == signal.SIGKILL, status
        assert took < 10.0  # returned because it was gone, not at its limit
    finally:
        os.close(ready_r)
        if not status:
            os.kill(pid, signal.SIGKILL)
            reaper.join(timeout=5)


# --- SandboxUnavailable: the program was not run --------------------------------------------------------------------


def test_without_unshare_on_path_the_sandbox_is_unavailable(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a folder without unshare
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        sandbox.execute("pass", 2.0, allow=True)
    assert str(err.value) == (
        "eval_tasks.sandbox needs util-linux's `unshare` (network, mount and PID namespaces); it is not on PATH, "
        "so no generated code is run."
    )


def test_a_relative_interpreter_is_unavailable(monkeypatch) -> None:
    monkeypatch.setenv(sandbox.PYTHON_ENV, "python3")
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        sandbox.execute("pass", 2.0, allow=True)
    message = str(err.value)
    assert message.startswith(
        "the sandbox could not start the program: InitConfig: python must be an absolute"
    )
    assert message.endswith("'python3' (nothing was run)") and "\n" not in message


@needs_sandbox
@pytest.mark.launches
def test_an_interpreter_the_sandbox_user_cannot_run_is_unavailable_with_its_exit_status(monkeypatch) -> None:
    monkeypatch.setenv(sandbox.PYTHON_ENV, "/nonexistent/python3")
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        sandbox.execute("pass", 2.0, allow=True)
    message = str(err.value)
    assert message.startswith("the sandbox could not start the program (exit status "), message
    assert message.endswith(
        "sandbox setup failed: the sandbox user cannot run the interpreter /nonexistent/python3 "
        "(set DISTMATCH_SANDBOX_PYTHON) (nothing was run)"
    ), message


@needs_sandbox
@pytest.mark.launches
def test_an_interpreter_that_never_starts_the_program_is_unavailable_at_the_setup_limit(
    monkeypatch, tmp_path
) -> None:
    """The start's own limit (SETUP_LIMIT_S, here 1 s): an 'interpreter' that hangs is stopped, nothing was run."""
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\nexec sleep 30\n")
    for path in (tmp_path, python.parent, python):
        path.chmod(0o755)  # the sandbox's user runs it
    monkeypatch.setenv(sandbox.PYTHON_ENV, str(python))
    monkeypatch.setattr(harness, "SETUP_LIMIT_S", 1.0)
    start = time.monotonic()
    with pytest.raises(sandbox.SandboxUnavailable) as err:
        sandbox.execute("pass", 2.0, allow=True)
    assert str(err.value).startswith("the sandbox could not start the program (did not start it within 1s): ")
    assert str(err.value).endswith(" (nothing was run)")
    assert time.monotonic() - start < 6.0  # the hanging start was killed, not waited for


# --- verdicts, what the program sees, sandboxes at a time ----------------------------------------------------------


def _launchers() -> list[int]:
    """This process's sandbox launchers (`unshare`, whose configuration names the scratch folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if os.path.basename(argv[0]) == b"unshare" and harness.scratch_prefix().encode() in argv[-2]:
                try:
                    parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if parent == os.getpid():  # not unshare's own child before it starts init.py
                    found.append(int(entry))
    return found


def _run_watched(
    programs: list, timeout_s: float, **kwargs
) -> tuple[list[sandbox.ExecutionResult], int, dict]:  # noqa: ANN003
    """execute_many in a thread, watched: the most scratch folders at once, each launcher's session and group."""
    before = scratch_folders()
    results: list = []
    thread = threading.Thread(
        target=lambda: results.append(sandbox.execute_many(programs, timeout_s, allow=True, **kwargs)),
        daemon=True,
    )
    most, sessions = 0, {}
    thread.start()
    while thread.is_alive():
        most = max(most, len(scratch_folders() - before))
        for pid in _launchers():
            try:
                sessions[pid] = (os.getsid(pid), os.getpgid(pid))
            except OSError:
                pass
        time.sleep(0.005)
    thread.join()
    assert results, "execute_many raised"
    return results[0], most, sessions


@needs_root
@needs_sandbox
@pytest.mark.launches
def test_verdicts_reasons_and_what_a_program_sees(monkeypatch) -> None:
    """Each ending's verdict and reason; the limits, interpreter, environment and (empty) input a program gets; and
    `workers` (default: the CPU count) sandboxes at a time, each launcher in a session and process group of its own.

    The evaluating process here has an environment of its own (a loader variable that would print to any program
    started with it, a marker) and a stdin with data that never ends: neither may reach the sandbox."""
    monkeypatch.delenv(sandbox.PYTHON_ENV, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/distmatch-preload.so")
    monkeypatch.setenv("DISTMATCH_HOST_MARKER", "host")
    limits = sandbox.SandboxLimits(memory_mb=512, file_size_mb=3, processes=7, scratch_mb=5)
    system = os.path.exists("/usr/bin/python3")
    sees = (
        "import os, resource, sys\n"
        "assert sys.stdin.read() == '', 'stdin'\n"
        f"assert sys.executable == {'/usr/bin/python3' if system else sys.executable!r}, sys.executable\n"
        # CPU seconds: the time limit (1 s) rounded up, plus 1 s; the others from SandboxLimits (MB: 2**20 bytes)
        "assert resource.getrlimit(resource.RLIMIT_CPU) == (2, 2), resource.getrlimit(resource.RLIMIT_CPU)\n"
        "assert resource.getrlimit(resource.RLIMIT_AS)[0] == 512 * 2**20\n"
        "assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == 3 * 2**20\n"
        "assert resource.getrlimit(resource.RLIMIT_NPROC)[0] == 7\n"
        "st = os.statvfs('.')\n"
        "assert st.f_blocks * st.f_frsize == 5 * 2**20, st  # the scratch tmpfs: scratch_mb\n"
        "assert sorted(os.environ) == sorted({'PATH', 'HOME', 'TMPDIR', 'LANG', 'OMP_NUM_THREADS', "
        "'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'} | ({'PYTHONPATH'} if sys.executable != "
        + repr(sys.executable)
        + " else set())), sorted(os.environ)\n"
    )
    if system and not sys.prefix.startswith("/usr/"):
        # another interpreter: this venv shows only its site-packages (parents hold nothing else), its base not at all
        sees += f"assert os.listdir({sys.prefix!r}) == ['lib'], os.listdir({sys.prefix!r})\n"
        if not sys.base_prefix.startswith("/usr/"):
            sees += f"assert not os.path.exists({sys.base_prefix!r})\n"
    programs = [
        "import time\ntime.sleep(30)\n",
        sees,
        "import ctypes\nctypes.string_at(0)\n",
        "import sys\nsys.stderr.buffer.write(b'bad \\xff byte\\n')\nsys.stderr.flush()\nraise SystemExit(3)\n",
    ]
    host_input_r, host_input_w = os.pipe()
    os.write(host_input_w, b"host input\n")
    saved_stdin = os.dup(0)
    os.dup2(host_input_r, 0)
    try:
        results, most, sessions = _run_watched(programs, 1.0, limits=limits)
        # each of the others ends within milliseconds; one timed out on a loaded machine runs once more, alone
        for i in range(1, len(programs)):
            if results[i] == R(False, "timed out after 1s", None):
                results[i] = sandbox.execute(programs[i], 1.0, limits=limits, allow=True)
    finally:
        os.dup2(saved_stdin, 0)
        for fd in (saved_stdin, host_input_r, host_input_w):
            os.close(fd)
    assert results == [
        R(False, "timed out after 1s", None),
        R(True, "passed", 0),
        R(False, "killed by signal SIGSEGV", -int(signal.SIGSEGV)),
        R(False, "exit status 3: bad \ufffd byte", 3),
    ]
    cpus = os.cpu_count() or 1
    if cpus >= 2:
        assert 2 <= most <= min(cpus, len(programs)), most
    assert sessions and all(sid == pid and group == pid for pid, (sid, group) in sessions.items()), sessions
    assert os.getpgrp() not in sessions


@needs_sandbox
@pytest.mark.launches
def test_one_worker_runs_one_sandbox_at_a_time_and_an_early_exit_0_fails(monkeypatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/distmatch-preload.so")
    programs = ["import os, sys\nsys.stderr.write('bye\\n')\nsys.stderr.flush()\nos._exit(0)\n", "pass"]
    results, most, _ = _run_watched(programs, 2.0, workers=1)
    assert results == [
        R(False, "ended before its code ran to the end (exit status 0): bye", 0),
        R(True, "passed", 0),
    ]
    assert most == 1


@needs_sandbox
@pytest.mark.launches
def test_a_program_runs_without_path_in_the_evaluating_processs_environment(monkeypatch) -> None:
    monkeypatch.delenv("PATH", raising=False)
    assert sandbox.execute("pass", 2.0, allow=True) == R(True, "passed", 0)
