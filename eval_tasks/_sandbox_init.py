"""The first process inside the sandbox's namespaces (run by :mod:`eval_tasks.code_execution`, not imported).

``unshare --net --mount --pid --ipc --uts --fork --mount-proc --kill-child python -I _sandbox_init.py ARGS`` starts
it as PID 1 of a new PID namespace, with its own network namespace (only a down loopback: no network at all), its
own mount table (a fresh ``/proc`` that shows only the sandbox's processes) and IPC objects. Here, still privileged:

1. the scratch folder is bind-mounted onto itself (its own, writable mount point);
2. every other mount point is remounted read-only (in this namespace only; the host's mounts are untouched);
3. the resource limits are set (CPU seconds, address space, file size, processes);
4. the privileges are dropped: when running as the real root, the user and group become ``nobody`` (so that the
   process-count limit applies: the kernel does not enforce it for root), every capability leaves the bounding set
   and ``no_new_privs`` is set, so nothing can remount or leave the namespaces;
5. ``_sandbox_runner.py`` is exec'ed with the interpreter (as this PID 1: when it exits, the kernel kills every
   process left in the namespace), and runs the program.

Any failure before the exec exits with status 125 and one line on stderr: the program never runs half-sandboxed.
Standard library only (it runs with ``python -I``).
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys

SETUP_FAILED = 125
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
# statvfs f_flag bits -> mount flags that must be kept on a remount (locked flags in a user namespace)
_KEEP = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME, 4096: MS_RELATIME}
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG = 38, 24, 1
NOBODY = 65534

_libc = ctypes.CDLL(None, use_errno=True)


def _fail(message: str) -> None:
    sys.stderr.write(f"sandbox setup failed: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def _mount(source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source else None
    if _libc.mount(src, target.encode(), None, ctypes.c_ulong(flags), None) != 0:
        err = ctypes.get_errno()
        _fail(f"mount {target}: {os.strerror(err)}")


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            raw = line.split()[4]
            points.append(raw.encode().decode("unicode_escape"))  # octal escapes (\040 = space)
    return points


def _read_only_except(scratch: str) -> None:
    _mount(scratch, scratch, MS_BIND)
    for point in _mount_points():
        if point == scratch or not os.path.isdir(point):
            continue
        try:
            kept = sum(flag for bit, flag in _KEEP.items() if os.statvfs(point).f_flag & bit)
        except OSError:
            continue  # a mount point hidden under another mount
        _mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def _limits(cpu_s: int, memory_bytes: int, file_bytes: int, processes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_privileges(real_root: bool) -> None:
    if real_root:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0 and cap < 64:
        cap += 1
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail("no_new_privs: " + os.strerror(ctypes.get_errno()))
    # Changing the user clears the parent-death signal: set it again (the sandbox dies with its launcher).
    _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)


def main(argv: list[str]) -> None:
    try:
        scratch, cpu_s, memory_bytes, file_bytes, processes, real_root, program, python, packages, fds = argv
        with open(
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_runner.py"), encoding="utf-8"
        ) as f:
            runner = f.read()
        _read_only_except(scratch)
        _limits(int(cpu_s), int(memory_bytes), int(file_bytes), int(processes))
        os.chdir(scratch)
        _drop_privileges(real_root == "1")
        if not os.access(python, os.X_OK):
            _fail(f"the sandbox user cannot run the interpreter {python} (set DISTMATCH_SANDBOX_PYTHON)")
    except SystemExit:
        raise
    except Exception as err:  # noqa: BLE001 - any setup error: refuse to run the program
        _fail(f"{type(err).__name__}: {err}")
    env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}
    # One BLAS / OpenMP thread: threads count against the process limit (numpy would start one per core).
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if (
        packages
    ):  # the launcher's site-packages (numpy for EvalPlus's tests) when the interpreter is another one
        env["PYTHONPATH"] = packages
    nonce_fd, verdict_fd = fds.split(",")
    command = [python, "-s", "-B", "-c", runner, program, nonce_fd, verdict_fd]
    try:
        os.execve(python, command, env)
    except OSError as err:  # e.g. EAGAIN: the process limit; the harness raises SandboxUnavailable
        _fail(f"cannot start the interpreter {python}: {err}")


if __name__ == "__main__":
    main(sys.argv[1:])
