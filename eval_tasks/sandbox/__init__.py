"""The code sandbox: run one generated Python program, :func:`execute` (the code tasks' only way to run a sample).

This docstring is the sandbox's contract: what a program can and cannot see or do, and what a pass means. The
modules state only how they keep it: ``harness.py`` (the host side: refusals, start, time limit, verdict),
``config.py`` (what the harness hands the first process inside: a typed configuration), ``init.py`` (that first
process: namespaces, root, limits, privileges), ``syscalls.py`` (the system call numbers and the seccomp filter),
``runner.py`` (the program's interpreter: the run and the verdict's nonce). docs/evaluation.md shows each guarantee
with its test.

**A pass.** ``execute(program, timeout_s)`` passes only when the program's code ran to its end, as the harness, not
the program, decides: the runner runs the program as module ``__program__`` (like the reference harnesses, which exec
it in a fresh namespace, a completion's ``if __name__ == "__main__":`` block does not run), and only when that returns
normally, in the sandbox's first process, does it read a random nonce of this run from an inherited pipe and write it
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
only together with the next one. Line numbers are those of program.py; tracebacks leave out the runner's frames. A
program given as one string is one piece.

**What the program sees** (new Linux namespaces from ``unshare``: network, mount, PID, IPC, UTS; a user namespace
too when not run as root; then ``pivot_root`` into a root built for it, the host's root detached):

* ``/usr`` and the top-level ``/bin``, ``/sbin``, ``/lib*`` links or folders (the interpreter, its standard library
  and shared libraries), the interpreter's prefix when it is elsewhere and the launcher's site-packages when the
  programs run with another interpreter: all read-only, at their own paths (whose parent folders hold nothing else);
* ``/etc`` with only ``passwd``, ``group``, ``hosts`` (written for the sandbox: root, nobody, the sandbox's user;
  localhost), ``ld.so.cache`` and ``localtime``; ``/dev`` with only ``null``, ``zero``, ``full``, ``random``,
  ``urandom`` and the ``fd``, ``stdin``, ``stdout``, ``stderr``, ``shm`` links; a read-only ``/proc`` of its own
  PID namespace (only the sandbox's processes);
* its scratch folder ``/tmp/distmatch-sandbox-<pid>-*`` (``<pid>``: the evaluating process; working directory,
  ``HOME``, ``TMPDIR``, ``/dev/shm``, holding ``program.py``; on the host it is made in the evaluating process's
  ``TMPDIR``, wherever that is): the only writable place, a tmpfs of its own capped at ``SandboxLimits.scratch_mb``
  and 4,096 files; gone with the sandbox.

Nothing else exists there: not the host's ``/tmp`` (a prefix or site-packages under ``/tmp``, as in a checkout
cloned there, shows in the sandbox's ``/tmp`` beside the scratch folder), ``/run``, ``/var``, ``/home``, ``/root``,
the project, any Unix-domain socket file or other ``/etc`` file.

**What it cannot do.** *Network*: none; the network namespace has only a loopback that is down. *Limits*: CPU
seconds (the time limit rounded up, plus 1 s), address space per process, file size, processes, 256 open files, no
core files (``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE``,
from :class:`SandboxLimits`); as root the program runs as a user of its own (uid ``0x70000000`` + the launcher's
PID), so its process budget is its own and parallel sandboxes do not share it; ``oom_score_adj`` 1000 (a host out of
memory kills the sandbox first). *Privileges*: no capabilities (empty bounding set), ``no_new_privs``, and a seccomp
filter refusing with EPERM ``memfd_create`` / ``memfd_secret`` (memory no limit bounds), SysV shared memory and
message queues (they outlive their processes), new user namespaces (``clone`` / ``unshare`` with
``CLONE_NEWUSER``: capabilities there), ``userfaultfd``, ``bpf``, ``perf_event_open``, the key rings and
``io_uring``, and every call of another ABI (x32, 32-bit); ``clone3`` answers ENOSYS (a filter cannot read its
flags; glibc then falls back to ``clone``), so threads, ``fork``, ``subprocess`` and ``multiprocessing`` work.
*Environment*: only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG``, one BLAS/OpenMP thread (``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``: threads count against the process limit) and ``PYTHONPATH`` (the
launcher's site-packages when another interpreter runs the programs). *Time*: ``timeout_s`` (:data:`MIN_TIMEOUT_S`
to :data:`MAX_TIMEOUT_S`) counts from the moment the runner starts the program; then the sandbox's PID 1 is killed,
and the kernel kills every process of its PID namespace. *Output*: only the last :data:`OUTPUT_TAIL` bytes of stderr
are kept (stdout is read and dropped), however much the program prints.

**Refusals** (one line, before anything runs): ``timeout_s`` must be a number from :data:`MIN_TIMEOUT_S` (0.1 s) to
:data:`MAX_TIMEOUT_S` (600 s): ``1e-9``, ``inf``, ``nan``, ``1e10`` and ``True`` are refused; each
:class:`SandboxLimits` field an integer from 1 to its :data:`LIMIT_MAXIMA` (``memory_mb`` 65,536, ``file_size_mb``
1,024, ``processes`` 1,024, ``scratch_mb`` 1,024: the scratch folder is the host's memory); `program` a string or a
non-empty list or tuple of strings. Where ``unshare`` is missing, the namespaces, the root or the seccomp filter
cannot be built, or the interpreter cannot be started (the runner never reported that it started the program),
:func:`execute` raises :class:`SandboxUnavailable`: a sample is never failed, nor run unsandboxed, because of the
sandbox. Generated code runs only after an explicit opt-in: ``allow=True`` (the lm-eval code tasks pass it once
lm-eval has checked ``--confirm_run_unsafe_code``) or ``DISTMATCH_ALLOW_CODE_EXECUTION=1`` (:data:`ALLOW_ENV`; an
explicit ``allow=False`` wins). ``DISTMATCH_SANDBOX_PYTHON`` (:data:`PYTHON_ENV`) picks the programs' interpreter
(as root the default is the system ``/usr/bin/python3``, which sees the launcher's site-packages).

**Not guaranteed**: the checks run in the program's own interpreter, and the program's functions run during them,
so a program written against this harness can still forge a pass: by reading the nonce pipe itself, by changing the
checks' objects through ``ctypes``, ``gc`` or a thread of its own, or by returning an object whose ``__eq__`` is
always true (as in the reference harnesses). The memory limit is per process (all of them: processes x
``memory_mb``). Started as another user than root, the sandboxes share that user's process limit. The kernel is
shared: no defence against kernel exploits. Linux on x86-64 or ARM64 only (the system call numbers of
``pivot_root`` and the seccomp filter).
"""

from __future__ import annotations

from eval_tasks.sandbox.harness import (
    ALLOW_ENV,
    LIMIT_MAXIMA,
    MAX_TIMEOUT_S,
    MIN_TIMEOUT_S,
    OUTPUT_TAIL,
    PYTHON_ENV,
    ExecutionResult,
    SandboxLimits,
    SandboxUnavailable,
    check_allowed,
    check_timeout,
    execute,
    execute_many,
)

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
