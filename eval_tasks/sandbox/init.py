"""The sandbox's first process: it builds what the contract (:mod:`eval_tasks.sandbox`) says a program sees and
may do, then execs the runner (``runner.py``). Run by the harness, never imported by it:

    unshare --net --mount --pid --ipc --uts --fork --kill-child [--map-root-user] python -I -B init.py CONFIG

CONFIG is an :class:`~eval_tasks.sandbox.config.InitConfig` as JSON; one that is not exactly its fields is refused,
and so is any start but as PID 1 of a new PID namespace. There, still privileged, in this order:

1. the program's user: as the real root, ``UID_BASE`` + the host PID of the ``unshare`` launcher, a user no other
   process has (the kernel counts the process limit per user);
2. a new root: a small tmpfs mounted over the host's scratch folder, holding the binds, files, device nodes, links,
   ``/proc`` and the scratch tmpfs the contract lists, every mount of it read-only but the scratch folder and
   ``/proc``; then ``pivot_root`` into it and the old root detached;
3. the resource limits and the highest ``oom_score_adj``;
4. the privileges dropped: the capability bounding set emptied (before the user changes: that needs CAP_SETPCAP),
   the user changed (as root), ``no_new_privs``, the parent-death signal set again, the seccomp filter of
   ``syscalls.py`` installed;
5. the runner exec'ed with the programs' interpreter, as this PID 1: when it exits, the kernel kills every process
   left in the namespace.

Any failure before the exec exits with ``SETUP_FAILED`` and one line on stderr: the program never runs
half-sandboxed (the runner never wrote "started": the harness raises ``SandboxUnavailable``). Standard library only:
``config.py`` and ``syscalls.py`` are loaded by their paths (``python -I`` does not put this folder on sys.path).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import platform
import resource
import signal
import sys
import types


def _sibling(name: str) -> types.ModuleType:
    """A module of this folder, run as a script: loaded by its path (nothing but the standard library is
    imported)."""
    spec = importlib.util.spec_from_file_location(
        f"_distmatch_sandbox_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building the class
    spec.loader.exec_module(module)
    return module


if __package__:  # imported as part of the package (the tests): the package's own modules
    from eval_tasks.sandbox import config, syscalls
else:
    config = _sibling("config")
    syscalls = _sibling("syscalls")

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
# statvfs flags -> the mount flags a remount must keep (a user namespace locks them: dropping one fails the remount)
_KEEP = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_PDEATHSIG = 38, 24, 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
ROOT_TMPFS = "size=4m,nr_inodes=4096,mode=0755"  #: the new root: only folders, links and mount points
SCRATCH_INODES = 4096  #: files and folders the program may create (tmpfs inodes cost kernel memory)
OPEN_FILES = 256  #: RLIMIT_NOFILE
OOM_SCORE_ADJ = 1000  #: when the host runs out of memory, the kernel kills the sandbox's processes first
_TOP = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_PASSWD = "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")

_libc = ctypes.CDLL(None, use_errno=True)


def _fail(message: str) -> None:
    sys.stderr.write(f"sandbox setup failed: {message}\n")
    sys.stderr.flush()
    os._exit(config.SETUP_FAILED)


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
    _mount("tmpfs", root, MS_NOSUID | MS_NODEV, "tmpfs", ROOT_TMPFS)
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
    program = f"{root}{inside}/{config.PROGRAM_FILE}"
    with open(program, "wb") as f:
        f.write(source)
    os.chown(program, uid, uid)
    for point in reversed(_mounts_under(root)):  # the submounts first, the root's tmpfs last
        if point not in (root + inside, root + "/proc"):
            _remount_read_only(point)
    os.chdir(root)
    number = syscalls.machine(platform.machine()).numbers["pivot_root"]
    if _libc.syscall(ctypes.c_long(number), b".", b".") != 0:
        _fail(f"pivot_root: {os.strerror(ctypes.get_errno())}")
    if _libc.umount2(b".", MNT_DETACH) != 0:  # the old root, stacked on the new one by pivot_root(".", ".")
        _fail(f"detaching the old root: {os.strerror(ctypes.get_errno())}")
    os.chdir(inside)


def _seccomp() -> None:
    """Install syscalls.py's filter (after no_new_privs; inherited by every process the program starts)."""
    code = syscalls.assemble(platform.machine())
    filters = (ctypes.c_char * len(code)).from_buffer_copy(code)

    class Program(ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(code) // syscalls.INSTRUCTION_BYTES, ctypes.addressof(filters))
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
    _libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    _seccomp()


def main(argv: list[str]) -> None:
    try:
        if len(argv) != 1:
            raise ValueError(f"expected one argument (the configuration as JSON), got {len(argv)}")
        settings = config.InitConfig.from_json(argv[0])
        if os.getpid() != 1:  # never build a root or drop privileges in the caller's own namespaces
            raise ValueError(
                "not the first process of a new PID namespace (the harness starts it with unshare)"
            )
        real_root = settings.real_root
        packages = os.pathsep.join(os.path.realpath(p) for p in settings.packages)  # as bound
        with open(os.path.join(settings.host_dir, config.PROGRAM_FILE), "rb") as f:
            source = f.read()
        with open(_RUNNER, encoding="utf-8") as f:
            runner = f.read()
        uid = config.UID_BASE + _launcher_pid() if real_root else 0
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as f:
            f.write(str(OOM_SCORE_ADJ))  # inherited; lowering it again needs CAP_SYS_RESOURCE
        inside = "/tmp/" + os.path.basename(settings.host_dir)
        shown = [*settings.prefixes, *settings.packages]
        _new_root(settings.host_dir, inside, source, uid, settings.scratch_bytes, shown)
        _limits(settings.cpu_s, settings.memory_bytes, settings.file_bytes, settings.processes)
        _drop_privileges(real_root, uid)
        python = settings.python
        if not os.access(python, os.X_OK):
            _fail(f"the sandbox user cannot run the interpreter {python} (set DISTMATCH_SANDBOX_PYTHON)")
    except SystemExit:
        raise
    except Exception as err:  # noqa: BLE001 - any setup error: refuse to run the program
        _fail(f"{type(err).__name__}: {err}")
    env = {"PATH": "/usr/bin:/bin", "HOME": inside, "TMPDIR": inside, "LANG": "C.UTF-8"}
    # One BLAS / OpenMP thread: threads count against the process limit (numpy would start one per core).
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    # The launcher's site-packages (numpy for EvalPlus's tests) when the interpreter is another one.
    if packages:
        env["PYTHONPATH"] = packages
    run = {
        "path": f"{inside}/{config.PROGRAM_FILE}",
        "nonce_fd": settings.nonce_fd,
        "verdict_fd": settings.verdict_fd,
        "pieces": settings.pieces,
    }
    command = [python, "-s", "-B", "-c", runner, json.dumps(run)]  # runner.py's _run, by keyword
    try:
        os.execve(python, command, env)
    except OSError as err:  # e.g. EAGAIN: the process limit; the harness raises SandboxUnavailable
        _fail(f"cannot start the interpreter {python}: {err}")


if __name__ == "__main__":
    main(sys.argv[1:])
