"""Run one generated Python program in a sandbox: :func:`execute` (the code tasks' only way to run a sample).

**A pass is decided by the harness.** ``execute(program, timeout_s)`` passes only when the program's code ran to its
end: a runner inside the sandbox (``_sandbox_runner.py``) runs the program (as module ``__program__``: like the
reference harnesses, which exec it in a fresh namespace, a completion's ``if __name__ == "__main__":`` block does
not run), and only when that returns normally, in the sandbox's first process, does it read a random nonce of this run from an inherited pipe and write it
to a second pipe; the harness counts a pass only when that pipe holds exactly the nonce and the process then ended
with status 0 within the time limit. The nonce is in no file, argument, environment variable or output the program
can read before its code has returned, so neither output nor a way of ending the interpreter early counts:
``sys.exit(0)``, ``exit()``, ``os._exit(0)``, ``unittest.main()``, ``SystemExit`` raised inside the checks, an
``atexit`` handler, a ``sys.excepthook``, a signal handler or a thread that ends the process, a forked child that
runs to the end: all fail. After the verdict nothing of the program runs (``os._exit``: no ``atexit`` handler,
finalizer or thread join). Tracing and profiling hooks (``sys.settrace``, ``sys.setprofile``, ``sys.monitoring``,
the C API's ``PyEval_SetTrace``), which could jump over a failing ``assert``, are refused (clearing them still
works); the source is decoded as UTF-8 by the runner (a coding cookie cannot re-read the checks).

**Pieces.** `program` may be a list or tuple of pieces (the code tasks pass the prompt with the completion, the
tests, and the entry point's call): program.py holds them joined by newlines, and the runner parses each piece on
its own, then runs all their statements, in order, as one module (one code object: nothing between the pieces that
the program could change at run time to skip one). So a completion cannot reach across its end into the tests: a
completion ending with a dangling decorator (which would turn the tests' ``def check`` into a no-op), an open
bracket, string, backslash or ``if`` / ``def`` header fails with its ``SyntaxError``, as does any piece that parses
only together with the next one. Line numbers are those of program.py. A program given as one string is one piece.

**What the program sees** (new Linux namespaces from ``unshare``: network, mount, PID, IPC, UTS; a user namespace
too when not run as root; then ``pivot_root`` into a root built for it, the host's root detached):

* ``/usr`` and the top-level ``/bin``, ``/sbin``, ``/lib*`` links or folders (the interpreter, its standard library
  and shared libraries), the interpreter's prefix when it is elsewhere and the launcher's site-packages when the
  programs run with another interpreter: all read-only, at their own paths (whose parent folders hold nothing else);
* ``/etc`` with only ``passwd``, ``group``, ``hosts`` (written for the sandbox), ``ld.so.cache`` and ``localtime``;
  ``/dev`` with only ``null``, ``zero``, ``full``, ``random``, ``urandom`` and links; a read-only ``/proc`` of its
  own PID namespace (only the sandbox's processes);
* its scratch folder ``/tmp/distmatch-sandbox-<pid>-*`` (``<pid>``: the evaluating process; working directory,
  ``HOME``, ``TMPDIR``, ``/dev/shm``; on the host it is made in the evaluating process's ``TMPDIR``, wherever that
  is): the only writable place, a tmpfs of its own capped at ``SandboxLimits.scratch_mb`` and 4,096 files; gone
  with the sandbox.

Nothing else exists there: not the host's ``/tmp`` (a prefix or site-packages under ``/tmp``, as in a checkout
cloned there, shows in the sandbox's ``/tmp`` beside the scratch folder), ``/run``, ``/var``, ``/home``, ``/root``,
the project, any Unix-domain socket file or other ``/etc`` file. **No network**: the network namespace has only a
loopback that is down. **Limits**: CPU seconds, address space, file size, processes, 256 open files, no core files
(``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE``); as root the
program runs as a user of its own (uid ``0x70000000`` + the launcher's PID), so its process budget is its own and
parallel sandboxes do not share it; ``oom_score_adj`` 1000 (a host out of memory kills the sandbox first). **No
privileges**: no capabilities (empty bounding set), ``no_new_privs``, and a seccomp filter refusing
``memfd_create`` / ``memfd_secret`` (memory no limit bounds), SysV shared memory and message queues, new user
namespaces, ``userfaultfd``, ``bpf``, ``perf_event_open``, the key rings and ``io_uring``. **Environment**: only
``PATH``, ``HOME``, ``TMPDIR``, ``LANG``, one BLAS/OpenMP thread and ``PYTHONPATH`` (the launcher's site-packages
when another interpreter runs the programs). **Time**: ``timeout_s`` (:data:`MIN_TIMEOUT_S` to
:data:`MAX_TIMEOUT_S`) counts from the moment the runner starts the program; then the sandbox's PID 1 is killed,
and the kernel kills every process of its PID namespace. **Output**: only the last :data:`OUTPUT_TAIL` bytes of
stderr are kept (stdout is read and dropped), however much the program prints.

**Refusals** (one line, before anything runs): ``timeout_s`` must be a number from :data:`MIN_TIMEOUT_S` (0.1 s) to
:data:`MAX_TIMEOUT_S` (600 s): ``1e-9``, ``inf``, ``nan``, ``1e10`` and ``True`` are refused; each
:class:`SandboxLimits` field an integer from 1 to its :data:`LIMIT_MAXIMA` (``memory_mb`` 65,536, ``file_size_mb``
1,024, ``processes`` 1,024, ``scratch_mb`` 1,024: the scratch folder is the host's memory); `program` a string or a
non-empty list or tuple of strings. Where ``unshare`` is missing, the namespaces or the root cannot be built, or the
interpreter cannot be started (the runner never reported that it started the program), :func:`execute` raises
:class:`SandboxUnavailable`: a sample is never failed, nor run unsandboxed, because of the sandbox. Generated code
runs only after an explicit opt-in: ``allow=True`` (the lm-eval code tasks pass it once lm-eval has checked
``--confirm_run_unsafe_code``) or ``DISTMATCH_ALLOW_CODE_EXECUTION=1``.

**Not guaranteed**: the checks run in the program's own interpreter, and the program's functions run during them,
so a program written against this harness can still forge a pass: by reading the nonce pipe itself, by changing the
checks' objects through ``ctypes``, ``gc`` or a thread of its own, or by returning an object whose ``__eq__`` is
always true (as in the reference harnesses). The memory limit is per process (all of them: processes x
``memory_mb``). Started as another user than root, the sandboxes share that user's process limit. The kernel is
shared: no defence against kernel exploits. Linux on x86-64 or ARM64 only (the system call numbers of
``pivot_root`` and the seccomp filter).
"""

from __future__ import annotations

import math
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

from distmatch.errors import DistMatchConfigError

__all__ = [
    "ALLOW_ENV",
    "LIMIT_MAXIMA",
    "MAX_TIMEOUT_S",
    "MIN_TIMEOUT_S",
    "ExecutionResult",
    "SandboxLimits",
    "SandboxUnavailable",
    "check_allowed",
    "check_timeout",
    "execute",
    "execute_many",
]

#: The environment variable that allows :func:`execute` to run generated code (``1``).
ALLOW_ENV = "DISTMATCH_ALLOW_CODE_EXECUTION"
#: Environment variable naming the interpreter the programs run with (default: see :func:`_interpreter`).
PYTHON_ENV = "DISTMATCH_SANDBOX_PYTHON"
SCRATCH_PREFIX = "distmatch-sandbox-"


def scratch_prefix() -> str:
    """The name prefix of this process's scratch folders, ``distmatch-sandbox-<pid>-``: a folder names the process
    that evaluates, so a left-over one is traced to its run, and runs side by side tell their own apart."""
    return f"{SCRATCH_PREFIX}{os.getpid()}-"


#: The longest time limit of one program, in seconds (``timeout_s``, the code tasks' ``code_timeout``).
MAX_TIMEOUT_S = 600
#: The shortest one: below it no program could run its checks (the time counts from the runner's start).
MIN_TIMEOUT_S = 0.1
#: The largest value of each :class:`SandboxLimits` field (the smallest is 1): the scratch tmpfs and the files in it
#: are kernel memory of the host, per sandbox; the address space is per process.
LIMIT_MAXIMA = {"memory_mb": 65536, "file_size_mb": 1024, "processes": 1024, "scratch_mb": 1024}
#: Bytes of the program's stderr kept (its last ones); its stdout is read and dropped.
OUTPUT_TAIL = 8192
#: Seconds the sandbox may take to start the program (namespaces, root, interpreter) before it counts as unavailable.
SETUP_LIMIT_S = 60.0
_INIT = Path(__file__).with_name("_sandbox_init.py")
_STARTED = b"started\n"
_TAIL = 400
#: The program's user as root: UID_BASE + the launcher's PID (kept equal to _sandbox_init.UID_BASE).
UID_BASE = 0x70000000


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be built here, or could not start the program (no ``unshare``, no namespaces, an
    interpreter that does not start): the program was not run."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run (defaults sized for HumanEval / MBPP test programs); integers from 1 to the
    field's :data:`LIMIT_MAXIMA`."""

    memory_mb: int = 1024  #: address space of each process (RLIMIT_AS)
    file_size_mb: int = 16  #: largest file the program may write (RLIMIT_FSIZE)
    processes: int = 32  #: processes and threads of the sandbox's user (RLIMIT_NPROC)
    scratch_mb: int = 64  #: everything the program writes, all files together (the scratch tmpfs's size)

    def __post_init__(self) -> None:
        for field in fields(self):
            value, maximum = getattr(self, field.name), LIMIT_MAXIMA[field.name]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
                raise DistMatchConfigError(
                    f"SandboxLimits: {field.name} must be an integer from 1 to {maximum}, got {value!r}."
                )


@dataclass(frozen=True)
class ExecutionResult:
    """The outcome of one program: ``passed`` (its code ran to its end within the time limit) and why not."""

    passed: bool
    reason: str  #: "passed", "timed out after Xs", "exit status N: <stderr tail>", "killed by signal S", ...
    returncode: int | None = None


def check_allowed(allow: bool | None = None) -> None:
    """Refuse (one line) unless the user allowed generated code to run: `allow` or ``DISTMATCH_ALLOW_CODE_EXECUTION``."""
    if allow is True:
        return
    if allow is None and os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes"):
        return
    raise DistMatchConfigError(
        "Refusing to run model-generated code: pass --confirm_run_unsafe_code to lm_eval for the distmatch code "
        f"tasks, or set {ALLOW_ENV}=1 (eval_tasks.code_execution runs it in a sandbox, see docs/evaluation.md)."
    )


def check_timeout(timeout_s: object) -> float:
    """`timeout_s` as seconds, or a one-line refusal: a number (not a bool) from :data:`MIN_TIMEOUT_S` to
    :data:`MAX_TIMEOUT_S` (``1e-9``, ``inf``, ``nan`` and ``1e10`` are refused)."""
    ok = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
    ok = ok and timeout_s >= MIN_TIMEOUT_S  # type: ignore[operator]
    if not (ok and 0 < timeout_s <= MAX_TIMEOUT_S):  # type: ignore[operator]  # nan fails both comparisons
        raise DistMatchConfigError(
            f"execute: timeout_s must be a number of seconds from {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S}, "
            f"got {timeout_s!r}."
        )
    return float(timeout_s)  # type: ignore[arg-type]


def _pieces(program: object) -> tuple[str, ...]:
    """`program` as its pieces (one for a str), or a one-line refusal."""
    if isinstance(program, str):
        return (program,)
    if isinstance(program, list | tuple) and program and all(isinstance(p, str) for p in program):
        return tuple(program)
    raise DistMatchConfigError(
        "execute: program must be Python source (str) or a non-empty list or tuple of its pieces (str), "
        f"got {type(program).__name__}."
    )


_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # as the tokenizer and linecache count lines


def _layout(pieces: tuple[str, ...]) -> tuple[str, str]:
    """program.py's text (the pieces joined by newlines) and, for the runner, each piece's length and its first
    line's number less one, ``"length:line,..."``: a piece parsed alone keeps its line numbers in the file."""
    text, layout = "", []
    for piece in pieces:
        layout.append(f"{len(piece)}:{len(_LINE_BREAK.findall(text))}")
        text += piece + "\n"
    return text[:-1], ",".join(layout)


def _interpreter(real_root: bool) -> str:
    """The interpreter of the programs: ``$DISTMATCH_SANDBOX_PYTHON``; as root (programs run as a user of their own,
    who may not read this venv's interpreter) the system ``/usr/bin/python3`` when present; else this interpreter."""
    chosen = os.environ.get(PYTHON_ENV)
    if chosen:
        return chosen
    if real_root and os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3"
    return sys.executable


def _packages() -> str:
    """This interpreter's site-packages, for a sandbox interpreter of the same Python version (the system one when
    started as root): EvalPlus's tests import numpy."""
    import sysconfig

    paths = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    return os.pathsep.join(p for p in paths if os.path.isdir(p))


def _prefixes(python: str) -> str:
    """The folders the interpreter needs besides /usr (shown read-only): its prefix and, for a venv, the base one."""
    if python == sys.executable:
        found = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    else:
        found = [
            os.path.dirname(os.path.dirname(p)) for p in (os.path.abspath(python), os.path.realpath(python))
        ]
    return os.pathsep.join(dict.fromkeys(p for p in found if p not in ("", "/")))


def _launcher(
    host_dir: str, timeout_s: float, limits: SandboxLimits, real_root: bool, fds: tuple[int, int], layout: str
) -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SandboxUnavailable(
            "eval_tasks.code_execution needs util-linux's `unshare` (network, mount and PID namespaces); it is "
            "not on PATH, so no generated code is run."
        )
    namespaces = ["--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
    if not real_root:
        namespaces.insert(0, "--map-root-user")  # a user namespace gives the other namespaces without root
    cpu = max(1, math.ceil(timeout_s)) + 1
    python = _interpreter(real_root)
    args = [
        host_dir,
        str(cpu),
        str(limits.memory_mb * 2**20),
        str(limits.file_size_mb * 2**20),
        str(limits.processes),
        str(limits.scratch_mb * 2**20),
        "1" if real_root else "0",
        python,
        _prefixes(python),
        _packages() if python != sys.executable else "",
        f"{fds[0]},{fds[1]}",
        layout,
    ]
    return [unshare, *namespaces, "--", sys.executable, "-I", "-B", str(_INIT), *args]


def _kill_sandbox(proc: subprocess.Popen[bytes]) -> None:
    """Kill the sandbox's PID 1 (the program): the kernel then kills every process of its PID namespace, and the
    launcher, still alive, reaps it (killing the launcher first would leave the program a zombie of the host)."""
    try:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children", encoding="ascii") as f:
            children = [int(pid) for pid in f.read().split()]
    except OSError:
        children = []
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if not children:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_gone(uid: int, limit_s: float = 10.0) -> None:
    """Kill and wait for any process of the sandbox's user (as root; its PID namespace dies with its PID 1, so this
    finds something only when the launcher itself was killed)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid == uid:
                        found.append(int(entry))
                except OSError:
                    continue
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def _signal_name(number: int) -> str:
    """SIGKILL, ...; the number for a signal the enum does not name (the real-time ones between SIGRTMIN and MAX),
    so that no exit of the program can raise in the harness."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _tail(data: bytes | bytearray) -> str:
    text = bytes(data).decode("utf-8", errors="replace").strip()
    return text[-_TAIL:].replace("\n", " | ")


@dataclass
class _Watch:
    """What the harness saw of one run: the verdict pipe's bytes, the stderr tail, when the program started."""

    verdict: bytearray
    stderr: bytearray
    started: bool = False
    timed_out: bool = False


def _watch(proc: subprocess.Popen[bytes], verdict_fd: int, timeout_s: float, nonce: bytes) -> _Watch:
    """Read the program's stdout (dropped), stderr (its last OUTPUT_TAIL bytes) and the verdict pipe until they
    close, within SETUP_LIMIT_S for the start and `timeout_s` from the start; kill the sandbox at the limit."""
    assert proc.stdout is not None and proc.stderr is not None
    seen = _Watch(bytearray(), bytearray())
    room = len(_STARTED) + len(nonce) + 1  # more than this is not a verdict: keep no more
    deadline = time.monotonic() + SETUP_LIMIT_S
    with selectors.DefaultSelector() as selector:
        for fd in (proc.stdout.fileno(), proc.stderr.fileno(), verdict_fd):
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen.timed_out = True
                break
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fd)
                elif key.fd == verdict_fd:
                    seen.verdict += data[: max(0, room - len(seen.verdict))]
                elif key.fd == proc.stderr.fileno():
                    seen.stderr += data
                    del seen.stderr[:-OUTPUT_TAIL]
            if not seen.started and seen.verdict.startswith(_STARTED):
                seen.started = True
                deadline = time.monotonic() + timeout_s
    if not seen.timed_out:
        try:  # every pipe closed: the program has ended, or closed them and goes on
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            seen.timed_out = True
    if seen.timed_out:
        _kill_sandbox(proc)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
    return seen


def execute(
    program: str | Sequence[str],
    timeout_s: float,
    *,
    limits: SandboxLimits | None = None,
    allow: bool | None = None,
) -> ExecutionResult:
    """Run `program` (Python source, or its pieces: each parsed on its own, all run in order as one module) in the
    sandbox; passed = its code ran to its end within `timeout_s` seconds (see the module docstring). Raises
    :class:`SandboxUnavailable` when the sandbox could not start it."""
    check_allowed(allow)
    timeout = check_timeout(timeout_s)
    source, layout = _layout(_pieces(program))
    if limits is not None and not isinstance(limits, SandboxLimits):
        raise DistMatchConfigError(f"execute: limits must be a SandboxLimits, got {type(limits).__name__}.")
    limits = limits or SandboxLimits()
    real_root = os.geteuid() == 0
    nonce = secrets.token_hex(16).encode("ascii")
    host_dir = tempfile.mkdtemp(prefix=scratch_prefix())
    fds: list[int] = []
    proc: subprocess.Popen[bytes] | None = None
    try:
        Path(host_dir, "program.py").write_bytes(source.encode("utf-8"))
        nonce_r, nonce_w = os.pipe()
        fds += [nonce_r, nonce_w]
        os.write(nonce_w, nonce)
        os.close(fds.pop())
        verdict_r, verdict_w = os.pipe()
        fds += [verdict_r, verdict_w]
        command = _launcher(host_dir, timeout, limits, real_root, (nonce_r, verdict_w), layout)
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(nonce_r, verdict_w),
            start_new_session=True,  # its own session and process group: killed as a whole
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
            cwd="/",
        )
        for fd in (nonce_r, verdict_w):  # the sandbox holds them now: EOF when its last process ends
            os.close(fd)
            fds.remove(fd)
        try:
            seen = _watch(proc, verdict_r, timeout, nonce)
        finally:
            _kill_group(proc)  # anything left in the group (the namespace's PID 1 takes the rest with it)
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
        code = proc.returncode
        if not seen.started:
            why = f"did not start it within {SETUP_LIMIT_S:g}s" if seen.timed_out else f"exit status {code}"
            raise SandboxUnavailable(
                f"the sandbox could not start the program ({why}): {_tail(seen.stderr)} (nothing was run)"
            )
        if seen.timed_out:
            return ExecutionResult(False, f"timed out after {timeout:g}s", None)
        if code == 0 and bytes(seen.verdict) == _STARTED + nonce:
            return ExecutionResult(True, "passed", 0)
        if code < 0:
            return ExecutionResult(False, f"killed by signal {_signal_name(-code)}", code)
        if code == 0:
            return ExecutionResult(
                False, f"ended before its code ran to the end (exit status 0): {_tail(seen.stderr)}", 0
            )
        return ExecutionResult(False, f"exit status {code}: {_tail(seen.stderr)}", code)
    finally:
        for fd in fds:
            os.close(fd)
        if proc is not None and real_root:
            _wait_gone(UID_BASE + proc.pid)
        shutil.rmtree(host_dir, ignore_errors=True)


def execute_many(
    programs: Sequence[str | Sequence[str]],
    timeout_s: float,
    *,
    workers: int | None = None,
    limits: SandboxLimits | None = None,
    allow: bool | None = None,
) -> list[ExecutionResult]:
    """:func:`execute` over `programs` with `workers` sandboxes at a time (default: the CPU count); in order. A
    :class:`SandboxUnavailable` of one program cancels the ones not started and is raised."""
    check_allowed(allow)
    timeout = check_timeout(timeout_s)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise DistMatchConfigError(f"execute_many: workers must be a positive integer, got {workers!r}.")
    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(execute, p, timeout, limits=limits, allow=True) for p in programs]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise
