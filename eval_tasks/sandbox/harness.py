"""The sandbox's host side: :func:`execute` / :func:`execute_many` (the code tasks' only way to run a sample).

What a program can and cannot see or do, and what a pass means, is the contract in :mod:`eval_tasks.sandbox` (the
package's docstring); this module checks the input, writes the program, starts ``init.py`` under ``unshare`` with an
:class:`~eval_tasks.sandbox.config.InitConfig`, watches its pipes within the time limit and gives the verdict.
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
from eval_tasks.sandbox.config import PROGRAM_FILE, UID_BASE, InitConfig
from eval_tasks.sandbox.runner import STARTED

__all__ = [
    "ALLOW_ENV",
    "LIMIT_MAXIMA",
    "MAX_TIMEOUT_S",
    "MIN_TIMEOUT_S",
    "OUTPUT_TAIL",
    "PYTHON_ENV",
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
_INIT = Path(__file__).with_name("init.py")
_TAIL = 400  #: characters of the stderr tail a failure's reason shows


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
        f"tasks, or set {ALLOW_ENV}=1 (eval_tasks.sandbox runs it in a sandbox, see docs/evaluation.md)."
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


def _layout(pieces: tuple[str, ...]) -> tuple[str, tuple[tuple[int, int], ...]]:
    """program.py's text (the pieces joined by newlines) and, for the runner, each piece's length and its first
    line's number less one: a piece parsed alone keeps its line numbers in the file."""
    text, layout = "", []
    for piece in pieces:
        layout.append((len(piece), len(_LINE_BREAK.findall(text))))
        text += piece + "\n"
    return text[:-1], tuple(layout)


def _interpreter(real_root: bool) -> str:
    """The interpreter of the programs: ``$DISTMATCH_SANDBOX_PYTHON``; as root (programs run as a user of their own,
    who may not read this venv's interpreter) the system ``/usr/bin/python3`` when present; else this interpreter."""
    chosen = os.environ.get(PYTHON_ENV)
    if chosen:
        return chosen
    if real_root and os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3"
    return sys.executable


def _packages() -> tuple[str, ...]:
    """This interpreter's site-packages, for a sandbox interpreter of the same Python version (the system one when
    started as root): EvalPlus's tests import numpy."""
    import sysconfig

    paths = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    return tuple(p for p in paths if os.path.isdir(p))


def _prefixes(python: str) -> tuple[str, ...]:
    """The folders the interpreter needs besides /usr (shown read-only): its prefix and, for a venv, the base one."""
    if python == sys.executable:
        found = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    else:
        found = [
            os.path.dirname(os.path.dirname(p)) for p in (os.path.abspath(python), os.path.realpath(python))
        ]
    return tuple(dict.fromkeys(p for p in found if p not in ("", "/")))


def _launcher(
    host_dir: str,
    timeout_s: float,
    limits: SandboxLimits,
    real_root: bool,
    fds: tuple[int, int],
    pieces: tuple[tuple[int, int], ...],
) -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SandboxUnavailable(
            "eval_tasks.sandbox needs util-linux's `unshare` (network, mount and PID namespaces); it is "
            "not on PATH, so no generated code is run."
        )
    namespaces = ["--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
    if not real_root:
        namespaces.insert(0, "--map-root-user")  # a user namespace gives the other namespaces without root
    cpu = max(1, math.ceil(timeout_s)) + 1
    python = _interpreter(real_root)
    try:
        config = InitConfig(
            host_dir=host_dir,
            cpu_s=cpu,
            memory_bytes=limits.memory_mb * 2**20,
            file_bytes=limits.file_size_mb * 2**20,
            processes=limits.processes,
            scratch_bytes=limits.scratch_mb * 2**20,
            real_root=real_root,
            python=python,
            prefixes=_prefixes(python),
            packages=_packages() if python != sys.executable else (),
            nonce_fd=fds[0],
            verdict_fd=fds[1],
            pieces=pieces,
        )
    except ValueError as err:  # e.g. a relative DISTMATCH_SANDBOX_PYTHON
        raise SandboxUnavailable(
            f"the sandbox could not start the program: {err} (nothing was run)"
        ) from None
    return [unshare, *namespaces, "--", sys.executable, "-I", "-B", str(_INIT), config.to_json()]


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
    room = len(STARTED) + len(nonce) + 1  # more than this is not a verdict: keep no more
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
            if not seen.started and seen.verdict.startswith(STARTED):
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
    sandbox; passed = its code ran to its end within `timeout_s` seconds (the contract: :mod:`eval_tasks.sandbox`).
    Raises
    :class:`SandboxUnavailable` when the sandbox could not start it."""
    check_allowed(allow)
    timeout = check_timeout(timeout_s)
    source, pieces = _layout(_pieces(program))
    if limits is not None and not isinstance(limits, SandboxLimits):
        raise DistMatchConfigError(f"execute: limits must be a SandboxLimits, got {type(limits).__name__}.")
    limits = limits or SandboxLimits()
    real_root = os.geteuid() == 0
    nonce = secrets.token_hex(16).encode("ascii")
    host_dir = tempfile.mkdtemp(prefix=scratch_prefix())
    fds: list[int] = []
    proc: subprocess.Popen[bytes] | None = None
    try:
        Path(host_dir, PROGRAM_FILE).write_bytes(source.encode("utf-8"))
        nonce_r, nonce_w = os.pipe()
        fds += [nonce_r, nonce_w]
        os.write(nonce_w, nonce)
        os.close(fds.pop())
        verdict_r, verdict_w = os.pipe()
        fds += [verdict_r, verdict_w]
        command = _launcher(host_dir, timeout, limits, real_root, (nonce_r, verdict_w), pieces)
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
        if code == 0 and bytes(seen.verdict) == STARTED + nonce:
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
