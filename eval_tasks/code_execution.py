"""Run one generated Python program in a sandbox: :func:`execute` (the code tasks' only way to run a sample).

``execute(program, timeout_s)`` writes `program` into a fresh scratch folder and runs it with the interpreter in
new Linux namespaces (``unshare``: network, mount, PID, IPC, UTS; a user namespace too when not run as root):

* **no network**: the new network namespace has only a loopback that is down (a connection even to a listener on
  the host's 127.0.0.1 fails);
* **no writes outside the scratch folder**: every mount point is remounted read-only in the sandbox's mount
  namespace, except the scratch folder (the program's working directory, ``HOME`` and ``TMPDIR``); the folder is
  removed afterwards;
* **limits**: CPU seconds, address space, file size and process count (``RLIMIT_CPU``, ``RLIMIT_AS``,
  ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``); as root the program runs as ``nobody`` (the kernel does not apply the
  process limit to root), without capabilities and with ``no_new_privs``;
* **stripped environment**: only ``PATH``, ``HOME``, ``TMPDIR`` and ``LANG``; ``/proc`` shows only the sandbox's
  own processes, so the parent's environment cannot be read there either;
* **time limit**: the launcher runs in its own session / process group; at ``timeout_s`` (wall clock) the whole
  group is killed, and the program is PID 1 of its PID namespace, so every process it started dies with it.

A sample passes when the program exits with status 0 within the time limit. Where ``unshare`` is missing or the
namespaces cannot be created, :func:`execute` refuses (:class:`SandboxUnavailable`) instead of running the program
unsandboxed. Generated code runs only after an explicit opt-in: ``allow=True`` (the lm-eval code tasks pass it
once lm-eval has checked ``--confirm_run_unsafe_code``) or ``DISTMATCH_ALLOW_CODE_EXECUTION=1``.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

from distmatch.errors import DistMatchConfigError

__all__ = [
    "ALLOW_ENV",
    "ExecutionResult",
    "SandboxLimits",
    "SandboxUnavailable",
    "MAX_TIMEOUT_S",
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
#: The longest time limit of one program, in seconds (``timeout_s``, the code tasks' ``code_timeout``).
MAX_TIMEOUT_S = 600
_INIT = Path(__file__).with_name("_sandbox_init.py")
_SETUP_FAILED = 125
_TAIL = 400


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be built here (no ``unshare``, no namespaces): nothing was run."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run (defaults sized for HumanEval / MBPP test programs); positive integers."""

    memory_mb: int = 1024  #: address space (RLIMIT_AS)
    file_size_mb: int = 16  #: largest file the program may write (RLIMIT_FSIZE)
    processes: int = 32  #: processes of the sandbox user (RLIMIT_NPROC)

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DistMatchConfigError(
                    f"SandboxLimits: {field.name} must be a positive integer, got {value!r}."
                )


@dataclass(frozen=True)
class ExecutionResult:
    """The outcome of one program: ``passed`` (exit status 0 within the time limit) and why not."""

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
    """`timeout_s` as seconds, or a one-line refusal: a number (not a bool) above 0 and at most
    :data:`MAX_TIMEOUT_S` (``inf``, ``nan`` and ``1e10`` are refused)."""
    ok = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
    if not (ok and 0 < timeout_s <= MAX_TIMEOUT_S):  # type: ignore[operator]  # nan fails both comparisons
        raise DistMatchConfigError(
            f"execute: timeout_s must be a positive number of seconds, at most {MAX_TIMEOUT_S}, got {timeout_s!r}."
        )
    return float(timeout_s)  # type: ignore[arg-type]


def _interpreter(real_root: bool) -> str:
    """The interpreter of the programs: ``$DISTMATCH_SANDBOX_PYTHON``; as root (programs run as ``nobody``, who may
    not read this venv's interpreter) the system ``/usr/bin/python3`` when present; else this interpreter."""
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


def _launcher(scratch: str, timeout_s: float, limits: SandboxLimits, real_root: bool) -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SandboxUnavailable(
            "eval_tasks.code_execution needs util-linux's `unshare` (network, mount and PID namespaces); it is "
            "not on PATH, so no generated code is run."
        )
    namespaces = ["--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--mount-proc", "--kill-child"]
    if not real_root:
        namespaces.insert(0, "--map-root-user")  # a user namespace gives the other namespaces without root
    cpu = max(1, math.ceil(timeout_s)) + 1
    python = _interpreter(real_root)
    args = [
        scratch,
        str(cpu),
        str(limits.memory_mb * 2**20),
        str(limits.file_size_mb * 2**20),
        str(limits.processes),
        "1" if real_root else "0",
        os.path.join(scratch, "program.py"),
        python,
        _packages() if python != sys.executable else "",
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


def _sandbox_pids(scratch: str) -> list[int]:
    """Host processes whose working directory is inside `scratch` (every sandboxed process starts there)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd == scratch or cwd.startswith(scratch + "/"):
                found.append(int(entry))
    return found


def _wait_gone(scratch: str, limit_s: float = 10.0) -> None:
    """Wait until the kernel has reaped every process of the sandbox (its PID namespace dies with its PID 1)."""
    deadline = time.monotonic() + limit_s
    while (pids := _sandbox_pids(scratch)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def _tail(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text[-_TAIL:].replace("\n", " | ")


def execute(
    program: str,
    timeout_s: float,
    *,
    limits: SandboxLimits | None = None,
    allow: bool | None = None,
) -> ExecutionResult:
    """Run `program` (Python source) in the sandbox; passed = exit status 0 within `timeout_s` seconds."""
    check_allowed(allow)
    timeout_s = check_timeout(timeout_s)
    if not isinstance(program, str):
        raise DistMatchConfigError(
            f"execute: program must be Python source (str), got {type(program).__name__}."
        )
    if limits is not None and not isinstance(limits, SandboxLimits):
        raise DistMatchConfigError(f"execute: limits must be a SandboxLimits, got {type(limits).__name__}.")
    limits = limits or SandboxLimits()
    real_root = os.geteuid() == 0
    scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    try:
        Path(scratch, "program.py").write_text(program, encoding="utf-8")
        if real_root:
            os.chown(scratch, 65534, 65534)
            os.chown(os.path.join(scratch, "program.py"), 65534, 65534)
        command = _launcher(scratch, timeout_s, limits, real_root)
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own session and process group: killed as a whole
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
            cwd=scratch,
        )
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_sandbox(proc)
            try:
                proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.communicate()
            return ExecutionResult(False, f"timed out after {timeout_s:g}s", None)
        finally:
            _kill_group(proc)  # anything left in the group (the namespace's PID 1 takes the rest with it)
        code = proc.returncode
        if code == 0:
            return ExecutionResult(True, "passed", 0)
        if code == _SETUP_FAILED and b"sandbox setup failed" in err:
            raise SandboxUnavailable(_tail(err) + " (nothing was run)")
        if code == 1 and b"unshare:" in err and b"Traceback" not in err:
            raise SandboxUnavailable(
                f"cannot create the sandbox's namespaces: {_tail(err)} (nothing was run)"
            )
        if code < 0:
            return ExecutionResult(False, f"killed by signal {signal.Signals(-code).name}", code)
        return ExecutionResult(False, f"exit status {code}: {_tail(err)}", code)
    finally:
        _wait_gone(scratch)
        shutil.rmtree(scratch, ignore_errors=True)


def execute_many(
    programs: Sequence[str],
    timeout_s: float,
    *,
    workers: int | None = None,
    limits: SandboxLimits | None = None,
    allow: bool | None = None,
) -> list[ExecutionResult]:
    """:func:`execute` over `programs` with `workers` sandboxes at a time (default: the CPU count); in order."""
    check_allowed(allow)
    timeout_s = check_timeout(timeout_s)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise DistMatchConfigError(f"execute_many: workers must be a positive integer, got {workers!r}.")
    workers = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results: Iterable[ExecutionResult] = pool.map(
            lambda p: execute(p, timeout_s, limits=limits, allow=True), programs
        )
        return list(results)
