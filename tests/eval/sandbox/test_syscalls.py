"""The system call filter: the same bytes as before its numbers had names, names that match the kernel's headers, and
each call the contract lists refused inside the sandbox for real (threads, processes and numpy still work)."""

from __future__ import annotations

import errno
import platform
import re
import shutil
import sys
from pathlib import Path

import pytest

from eval_tasks.sandbox import init, syscalls
from tests.eval.sandbox.conftest import run

needs_sandbox = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("unshare") is None, reason="needs Linux and unshare"
)

#: The filter as the code assembled it before the numbers and instruction fields had names (eval_tasks/
#: _sandbox_init.py at d9c2673, its `_seccomp` run with prctl captured), one struct sock_filter per 16 hex digits.
FILTER_BEFORE_THE_NAMES = {
    "x86_64": "2000000004000000150001003e0000c0060000000100050020000000000000003500000100000040060000000100"
    "0500150000013f010000060000000100050015000001bf0100000600000001000500150000011d00000006000000010005"
    "00150000014400000006000000010005001500000143010000060000000100050015000001410100000600000001000500"
    "150000012a010000060000000100050015000001f8000000060000000100050015000001f900000006000000010005001500"
    "0001fa000000060000000100050015000001a9010000060000000100050015000001b3010000060000002600050015000100"
    "380000001500000310010000200000001000000045000001000000100600000001000500060000000000ff7f",
    "aarch64": "200000000400000015000100b70000c00600000001000500200000000000000015000001170100000600000001000500"
    "15000001bf010000060000000100050015000001c2000000060000000100050015000001ba00000006000000010005001500"
    "00011a01000006000000010005001500000118010000060000000100050015000001f1000000060000000100050015000001"
    "d9000000060000000100050015000001da000000060000000100050015000001db000000060000000100050015000001a901"
    "0000060000000100050015000001b3010000060000002600050015000100dc00000015000003610000002000000010000000"
    "45000001000000100600000001000500060000000000ff7f",
}


@pytest.mark.parametrize("machine", sorted(FILTER_BEFORE_THE_NAMES))
def test_the_filter_is_the_one_assembled_before_the_names(machine) -> None:
    assert syscalls.assemble(machine).hex() == FILTER_BEFORE_THE_NAMES[machine]
    assert len(syscalls.assemble(machine)) == syscalls.INSTRUCTION_BYTES * len(syscalls.instructions(machine))


def test_a_machine_without_numbers_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"no system call numbers for riscv64 \(known: x86_64, aarch64\)"):
        syscalls.assemble("riscv64")


def _defines(header: Path) -> dict[str, int]:
    """``#define NAME value`` lines of a kernel header whose value is a number, ``0x...U`` or ``(1<<n)``."""
    found = {}
    for name, value in re.findall(
        r"^#define\s+(\w+)\s+(\(1\s*<<\s*\d+\)|0x[0-9a-fA-F]+U?|\d+)(?!\w)", header.read_text(), re.M
    ):
        shift = re.fullmatch(r"\(1\s*<<\s*(\d+)\)", value)
        found[name] = 1 << int(shift.group(1)) if shift else int(value.rstrip("U"), 0)
    return found


HEADERS = Path("/usr/include")
UNISTD = {"x86_64": "x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "asm-generic/unistd.h"}


@pytest.mark.parametrize("machine", sorted(UNISTD))
def test_the_numbers_are_the_kernels(machine) -> None:
    """Against the installed kernel headers (an independent source): every call the sandbox names."""
    header = HEADERS / UNISTD[machine]
    if not header.is_file():
        pytest.skip(f"no {header}")
    kernel = _defines(header)
    numbers = syscalls.MACHINES[machine].numbers
    assert {name: kernel.get(f"__NR_{name}") for name in numbers} == numbers
    assert set(syscalls.REFUSED) <= set(numbers)


#: (header, the module naming some of its constants, those names)
NAMED = [
    ("linux/bpf_common.h", syscalls, "BPF_LD BPF_JMP BPF_RET BPF_W BPF_ABS BPF_JEQ BPF_JGE BPF_JSET BPF_K"),
    ("linux/seccomp.h", syscalls, "SECCOMP_RET_ALLOW SECCOMP_RET_ERRNO"),
    ("linux/sched.h", syscalls, "CLONE_NEWUSER"),
    ("linux/seccomp.h", init, "SECCOMP_MODE_FILTER"),
    ("linux/prctl.h", init, "PR_SET_SECCOMP PR_SET_NO_NEW_PRIVS PR_CAPBSET_DROP PR_SET_PDEATHSIG"),
    ("linux/mount.h", init, "MS_RDONLY MS_NOSUID MS_NODEV MS_NOEXEC MS_REMOUNT MS_BIND MS_REC MS_PRIVATE"),
    ("linux/mount.h", init, "MS_NOATIME MS_NODIRATIME MS_RELATIME"),
]


@pytest.mark.parametrize(("header", "module", "names"), NAMED)
def test_the_instruction_fields_and_flags_are_the_kernels(header, module, names) -> None:
    if not (HEADERS / header).is_file():
        pytest.skip(f"no {HEADERS / header}")
    kernel = _defines(HEADERS / header)
    assert {name: getattr(module, name) for name in names.split()} == {
        name: kernel.get(name) for name in names.split()
    }


# ---------------------------------------------------------------------------------------------------------
# At run time, inside the sandbox.

#: The kernel's numbers, typed here from its tables (not read from the module under test).
REFUSED_NUMBERS = {
    "x86_64": {
        "memfd_create": 319,
        "memfd_secret": 447,
        "shmget": 29,
        "msgget": 68,
        "userfaultfd": 323,
        "bpf": 321,
        "perf_event_open": 298,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "io_uring_setup": 425,
    },
    "aarch64": {
        "memfd_create": 279,
        "memfd_secret": 447,
        "shmget": 194,
        "msgget": 186,
        "userfaultfd": 282,
        "bpf": 280,
        "perf_event_open": 241,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "io_uring_setup": 425,
    },
}
CLONE3 = 435


@pytest.mark.launches
@needs_sandbox
@pytest.mark.parametrize(
    "call",
    [
        "os.memfd_create('x')",  # its size is bounded by no rlimit and no tmpfs: the host's memory
        "ctypes.CDLL(None, use_errno=True).shmget(0, 2**20, 0o1600)",  # SysV memory outlives its process
        "ctypes.CDLL(None, use_errno=True).unshare(0x10000000)",  # CLONE_NEWUSER: capabilities in a new user ns
        "ctypes.CDLL(None, use_errno=True).syscall(425, 8, 0)",  # io_uring_setup
    ],
)
def test_system_calls_outside_the_limits_are_refused(clean_host, call) -> None:
    program = (
        "import ctypes, os\n"
        f"try:\n    rc = {call}\nexcept PermissionError:\n    pass\n"
        "else:\n    assert rc == -1 and ctypes.get_errno() == 1, (rc, ctypes.get_errno())\n"
    )
    result = run(program)
    assert result.passed, result.reason


@pytest.mark.launches
@needs_sandbox
def test_every_listed_system_call_is_refused_with_eperm(clean_host) -> None:
    """Each call of the contract's list (arguments 0: without the filter each would fail otherwise, or succeed),
    clone3 with ENOSYS, and on x86-64 a call of the x32 ABI (getpid's number with the x32 bit)."""
    machine = platform.machine()
    if machine not in REFUSED_NUMBERS:
        pytest.skip(f"no system call numbers for {machine}")
    expected = {name: errno.EPERM for name in REFUSED_NUMBERS[machine]}
    numbers = dict(REFUSED_NUMBERS[machine], clone3=CLONE3)
    expected["clone3"] = errno.ENOSYS
    if machine == "x86_64":
        numbers["x32_getpid"], expected["x32_getpid"] = 0x40000000 | 39, errno.EPERM
    program = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "got = {}\n"
        f"for name, number in {numbers!r}.items():\n"
        "    ctypes.set_errno(0)\n"
        "    rc = libc.syscall(ctypes.c_long(number), 0, 0, 0, 0, 0)\n"
        "    got[name] = ctypes.get_errno() if rc == -1 else f'returned {rc}'\n"
        f"assert got == {expected!r}, got\n"
    )
    result = run(program)
    assert result.passed, result.reason


@pytest.mark.launches
@needs_sandbox
def test_threads_processes_and_numpy_still_work(clean_host) -> None:
    """glibc starts threads with clone3, refused with ENOSYS so that it falls back to clone."""
    pytest.importorskip("numpy")
    program = (
        "import multiprocessing, os, subprocess, sys, threading\n"
        "t = threading.Thread(target=print)\nt.start()\nt.join()\n"
        "assert subprocess.run(['/bin/true']).returncode == 0\n"
        "pid = os.fork()\nif pid == 0:\n    os._exit(7)\nassert os.waitpid(pid, 0)[1] >> 8 == 7\n"
        "with multiprocessing.Pool(2) as pool:\n    assert pool.map(abs, [-1, -2]) == [1, 2]\n"
        "import numpy\nassert numpy.arange(4).sum() == 6\n"
    )
    result = run(program, timeout_s=10.0)
    assert result.passed, result.reason


def test_the_module_needs_only_the_standard_library() -> None:
    """init.py loads it by its path under ``python -I``: nothing of the project may be imported there."""
    source = Path(syscalls.__file__).read_text()
    imported = re.findall(r"^(?:from|import) (\w+)", source, re.M)
    assert sorted(set(imported)) == ["__future__", "errno", "struct", "typing"]
