"""The first process inside the sandbox's namespaces (run by :mod:`eval_tasks.code_execution`, not imported).

``unshare --net --mount --pid --ipc --uts --fork --kill-child python -I _sandbox_init.py ARGS`` starts it as PID 1
of a new PID namespace, with its own network namespace (only a down loopback: no network at all), its own mount
table and IPC objects. Here, still privileged, it builds the only file system the program will see and starts it:

1. the program's user: as the real root, uid = gid = ``UID_BASE`` + the host PID of the ``unshare`` launcher, a user
   no other process has, so that the process limit (counted per user by the kernel) is this sandbox's own;
2. a new root: a small tmpfs mounted over the (host) scratch folder, holding only

   * ``/usr`` and the top-level ``/bin``, ``/sbin``, ``/lib*`` (symlinks or read-only binds of the host's), the
     interpreter's own prefix when it is not under ``/usr``, and the launcher's site-packages, all read-only;
   * ``/etc`` with ``passwd``, ``group`` and ``hosts`` written here (root and nobody, localhost), the host's
     ``ld.so.cache`` and ``localtime`` (read-only);
   * ``/dev/null``, ``zero``, ``full``, ``random``, ``urandom`` (binds of the host's nodes) and the ``fd``,
     ``stdin``, ``stdout``, ``stderr``, ``shm`` links;
   * a fresh read-only ``/proc`` of the sandbox's PID namespace;
   * ``/tmp/<scratch name>``: the program's scratch folder, its own tmpfs capped at the scratch size (and at
     ``SCRATCH_INODES`` files), owned by the program's user, holding ``program.py``;

   every mount of it but the scratch folder and ``/proc`` read-only; then ``pivot_root`` into it and the old root
   detached, so nothing of the host's ``/tmp``, ``/run``, ``/home``, ``/root``, sockets or the project exists there;
3. the resource limits: CPU seconds, address space, file size, processes, open files, no core files; and the
   highest ``oom_score_adj`` (1000), so that a host out of memory kills the sandbox's processes before any other;
4. the privileges dropped: every capability leaves the bounding set, the user becomes the sandbox's own (as root),
   ``no_new_privs`` is set, the parent-death signal set again, and a seccomp filter refuses a few system calls
   (``_SECCOMP``: memory outside every limit, new user namespaces, kernel surface no test program needs);
5. ``_sandbox_runner.py`` is exec'ed (as this PID 1: when it exits, the kernel kills every process left in the
   namespace) with the interpreter, and runs the program's pieces (the layout is passed on as it came).

Any failure before the exec exits with status 125 and one line on stderr: the program never runs half-sandboxed
(the harness sees that the runner never started, and raises ``SandboxUnavailable``). Standard library only (it runs
with ``python -I``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import sys

SETUP_FAILED = 125
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
# statvfs f_flag bits -> mount flags that must be kept on a remount (locked flags in a user namespace)
_KEEP = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME, 4096: MS_RELATIME}
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG = 38, 24, 1
#: the program's user (as root) is UID_BASE + the launcher's host PID: above the ranges Linux distributions and
#: container runtimes hand out (systemd's container range ends at 0x6FFFFFFF); PIDs stay below 2**22.
UID_BASE = 0x70000000
SCRATCH_INODES = 4096  #: files and folders the program may create (tmpfs inodes cost kernel memory)
OPEN_FILES = 256  #: RLIMIT_NOFILE
OOM_SCORE_ADJ = 1000  #: when the host runs out of memory, the kernel kills the sandbox's processes first
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
#: seccomp, per machine: (audit arch, system calls refused with EPERM, clone3, clone and unshare). Refused: memory
#: outside every limit (memfd_create and memfd_secret files are bounded by no rlimit and no tmpfs size; SysV shared
#: memory and message queues outlive their processes), kernel surface a test program never needs (userfaultfd, bpf,
#: perf_event_open, the key rings, io_uring), and new user namespaces (clone / unshare with CLONE_NEWUSER: they
#: would give the program capabilities there). clone3 answers ENOSYS: its flags cannot be read by a filter, and
#: glibc then falls back to clone.
_SECCOMP = {
    "x86_64": (0xC000003E, (319, 447, 29, 68, 323, 321, 298, 248, 249, 250, 425), 435, 56, 272),
    "aarch64": (0xC00000B7, (279, 447, 194, 186, 282, 280, 241, 217, 218, 219, 425), 435, 220, 97),
}
CLONE_NEWUSER = 0x10000000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
_TOP = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_PASSWD = "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"

_libc = ctypes.CDLL(None, use_errno=True)


def _fail(message: str) -> None:
    sys.stderr.write(f"sandbox setup failed: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def _mount(
    source: str | None, target: str, flags: int, fstype: str | None = None, data: str | None = None
) -> None:
    args = [s.encode() if s is not None else None for s in (source, target, fstype)]
    options = data.encode() if data is not None else None
    if _libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), options) != 0:
        _fail(f"mount {target}: {os.strerror(ctypes.get_errno())}")


def _mounts_under(root: str) -> list[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")  # octal escapes (\040 = space)
            if point == root or point.startswith(root + "/"):
                points.append(point)
    return points


def _remount_read_only(point: str) -> None:
    kept = sum(flag for bit, flag in _KEEP.items() if os.statvfs(point).f_flag & bit)
    _mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | kept)


def _bind(root: str, path: str) -> None:
    """`path` of the host at the same path under `root` (a folder or a file; read-only later)."""
    target = root + path
    if os.path.isdir(path):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        with open(target, "wb"):
            pass
    _mount(path, target, MS_BIND | MS_REC)


def _covered(path: str, bound: list[str]) -> bool:
    return any(path == b or path.startswith(b.rstrip("/") + "/") for b in bound)


def _new_root(root: str, inside: str, source: bytes, uid: int, scratch_bytes: int, extra: list[str]) -> None:
    """Build the sandbox's file system under `root` (see the module docstring) and pivot into it."""
    _mount(None, "/", MS_REC | MS_PRIVATE)  # nothing of what follows propagates to the host
    _mount("tmpfs", root, MS_NOSUID | MS_NODEV, "tmpfs", "size=4m,nr_inodes=4096,mode=0755")
    bound = []
    for top in _TOP:
        path = "/" + top
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path):
            _bind(root, path)
            bound.append(path)
    for path in extra:  # the interpreter's prefix and the launcher's site-packages, when not under /usr
        path = os.path.realpath(path)
        if os.path.isdir(path) and path != "/" and not _covered(path, bound):
            _bind(root, path)
            bound.append(path)
    os.mkdir(root + "/etc", 0o755)
    passwd, group = _PASSWD, _GROUP
    if uid:  # the program's own user (getpass.getuser, pwd)
        passwd += f"sandbox:x:{uid}:{uid}:sandbox:{inside}:/usr/sbin/nologin\n"
        group += f"sandbox:x:{uid}:\n"
    for name, text in (("passwd", passwd), ("group", group), ("hosts", "127.0.0.1 localhost\n")):
        with open(f"{root}/etc/{name}", "w", encoding="ascii") as f:
            f.write(text)
    for name in ("ld.so.cache", "localtime"):
        path = "/etc/" + name
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isfile(path):
            _bind(root, path)
    os.mkdir(root + "/dev", 0o755)
    for name in _DEVICES:
        _bind(root, "/dev/" + name)
    links = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1"}
    links.update(stderr="/proc/self/fd/2", shm=inside)
    for name, target in links.items():
        os.symlink(target, f"{root}/dev/{name}")
    os.mkdir(root + "/proc", 0o555)
    _mount("proc", root + "/proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "proc")
    os.makedirs(root + inside, mode=0o755)
    scratch = f"size={scratch_bytes},nr_inodes={SCRATCH_INODES},mode=0700,uid={uid},gid={uid}"
    _mount("tmpfs", root + inside, MS_NOSUID | MS_NODEV, "tmpfs", scratch)
    program = root + inside + "/program.py"
    with open(program, "wb") as f:
        f.write(source)
    os.chown(program, uid, uid)
    for point in reversed(_mounts_under(root)):  # the submounts first, the root's tmpfs last
        if point not in (root + inside, root + "/proc"):
            _remount_read_only(point)
    os.chdir(root)
    number = _PIVOT_ROOT.get(platform.machine())
    if number is None:
        _fail(f"pivot_root: unknown system call number on {platform.machine()}")
    if _libc.syscall(ctypes.c_long(number), b".", b".") != 0:
        _fail(f"pivot_root: {os.strerror(ctypes.get_errno())}")
    if _libc.umount2(b".", MNT_DETACH) != 0:  # the old root, stacked on the new one by pivot_root(".", ".")
        _fail(f"detaching the old root: {os.strerror(ctypes.get_errno())}")
    os.chdir(inside)


def _seccomp() -> None:
    """Install the filter of `_SECCOMP` (after no_new_privs; inherited by every process the program starts)."""
    machine = platform.machine()
    if machine not in _SECCOMP:
        _fail(f"no system call filter for {machine}")
    arch, refused, clone3, clone, unshare = _SECCOMP[machine]
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    program = [
        (load, 0, 0, 4),
        (jeq, 1, 0, arch),
        (ret, 0, 0, eperm),
        (load, 0, 0, 0),
    ]  # another ABI: refused
    if machine == "x86_64":
        program += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]  # the x32 ABI
    for number in refused:
        program += [(jeq, 0, 1, number), (ret, 0, 0, eperm)]
    program += [(jeq, 0, 1, clone3), (ret, 0, 0, enosys)]
    program += [
        (jeq, 1, 0, clone),
        (jeq, 0, 3, unshare),
        (load, 0, 0, 16),
    ]  # their flags: args[0], low 32 bits
    program += [(jset, 0, 1, CLONE_NEWUSER), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    filters = (ctypes.c_uint64 * len(program))(
        *(c | jt << 16 | jf << 24 | k << 32 for c, jt, jf, k in program)
    )

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(program), ctypes.addressof(filters))
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        _fail("seccomp: " + os.strerror(ctypes.get_errno()))


def _launcher_pid() -> int:
    """The host PID of `unshare` (this process's parent), from the host's /proc, still mounted here."""
    with open("/proc/self/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _limits(cpu_s: int, memory_bytes: int, file_bytes: int, processes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_privileges(real_root: bool, uid: int) -> None:
    for cap in range(64):  # before the user changes: dropping needs CAP_SETPCAP
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability the kernel knows (EINVAL)
    if real_root:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail("no_new_privs: " + os.strerror(ctypes.get_errno()))
    # Changing the user clears the parent-death signal: set it again (the sandbox dies with its launcher).
    _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    _seccomp()


def main(argv: list[str]) -> None:
    try:
        (
            host_dir,
            cpu_s,
            memory_bytes,
            file_bytes,
            processes,
            scratch_bytes,
            root_flag,
            python,
            prefixes,
            packages,
            fds,
            layout,
        ) = argv
        real_root = root_flag == "1"
        packages = os.pathsep.join(os.path.realpath(p) for p in packages.split(os.pathsep) if p)  # as bound
        with open(os.path.join(host_dir, "program.py"), "rb") as f:
            source = f.read()
        with open(
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_runner.py"), encoding="utf-8"
        ) as f:
            runner = f.read()
        uid = UID_BASE + _launcher_pid() if real_root else 0
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as f:
            f.write(str(OOM_SCORE_ADJ))  # inherited; lowering it again needs CAP_SYS_RESOURCE
        inside = "/tmp/" + os.path.basename(host_dir)
        shown = [p for p in (prefixes + os.pathsep + packages).split(os.pathsep) if p]
        _new_root(host_dir, inside, source, uid, int(scratch_bytes), shown)
        _limits(int(cpu_s), int(memory_bytes), int(file_bytes), int(processes))
        _drop_privileges(real_root, uid)
        if not os.access(python, os.X_OK):
            _fail(f"the sandbox user cannot run the interpreter {python} (set DISTMATCH_SANDBOX_PYTHON)")
    except SystemExit:
        raise
    except Exception as err:  # noqa: BLE001 - any setup error: refuse to run the program
        _fail(f"{type(err).__name__}: {err}")
    env = {"PATH": "/usr/bin:/bin", "HOME": inside, "TMPDIR": inside, "LANG": "C.UTF-8"}
    # One BLAS / OpenMP thread: threads count against the process limit (numpy would start one per core).
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if (
        packages
    ):  # the launcher's site-packages (numpy for EvalPlus's tests) when the interpreter is another one
        env["PYTHONPATH"] = packages
    nonce_fd, verdict_fd = fds.split(",")
    command = [python, "-s", "-B", "-c", runner, inside + "/program.py", nonce_fd, verdict_fd, layout]
    try:
        os.execve(python, command, env)
    except OSError as err:  # e.g. EAGAIN: the process limit; the harness raises SandboxUnavailable
        _fail(f"cannot start the interpreter {python}: {err}")


if __name__ == "__main__":
    main(sys.argv[1:])
