"""System call numbers by name, per machine, and the seccomp filter built from them (as bytes; ``init.py`` installs
it). Which calls the filter refuses, and why, is part of the contract (:mod:`eval_tasks.sandbox`).

Standard library only, and nothing of the project: ``init.py`` loads this file by its path (see ``config.py``).
The names follow the kernel's headers: ``linux/filter.h`` and ``linux/bpf_common.h`` (the BPF instruction fields),
``linux/seccomp.h`` (``seccomp_data`` and the return values), ``linux/audit.h`` (the architectures).
"""

from __future__ import annotations

import errno
import struct
from typing import NamedTuple

# BPF instruction classes, sizes, modes, jump tests and sources (linux/bpf_common.h).
BPF_LD, BPF_JMP, BPF_RET = 0x00, 0x05, 0x06
BPF_W, BPF_ABS = 0x00, 0x20
BPF_JEQ, BPF_JGE, BPF_JSET = 0x10, 0x30, 0x40
BPF_K = 0x00

# Offsets in struct seccomp_data: the call's number, its architecture, its first argument (the low 32 bits on a
# little-endian machine, where the flags of clone and unshare are).
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16

SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000  #: | the errno the call returns
REFUSE = SECCOMP_RET_ERRNO | errno.EPERM
#: clone3's flags are behind a pointer a filter cannot read: "no such call" makes glibc fall back to clone.
NO_SUCH_CALL = SECCOMP_RET_ERRNO | errno.ENOSYS

_AUDIT_ARCH_64BIT, _AUDIT_ARCH_LE = 0x80000000, 0x40000000
AUDIT_ARCH_X86_64 = 62 | _AUDIT_ARCH_64BIT | _AUDIT_ARCH_LE  # EM_X86_64
AUDIT_ARCH_AARCH64 = 183 | _AUDIT_ARCH_64BIT | _AUDIT_ARCH_LE  # EM_AARCH64
#: The x32 ABI's calls reach the x86-64 kernel with this bit set in their number: refused as a whole.
X32_SYSCALL_BIT = 0x40000000
CLONE_NEWUSER = 0x10000000

#: Refused with EPERM, in the filter's order.
REFUSED = (
    "memfd_create",  # memory files that no rlimit and no tmpfs size bounds
    "memfd_secret",
    "shmget",  # SysV shared memory and message queues outlive their processes
    "msgget",
    "userfaultfd",  # kernel surface no test program needs
    "bpf",
    "perf_event_open",
    "add_key",  # the key rings
    "request_key",
    "keyctl",
    "io_uring_setup",
)


class Machine(NamedTuple):
    audit_arch: int  #: seccomp_data.arch of this machine's native calls
    numbers: dict[str, int]  #: name -> number of each call the sandbox names
    x32: bool = False  #: whether another ABI's calls arrive with X32_SYSCALL_BIT


#: platform.machine() -> its numbers (x86-64: arch/x86/entry/syscalls/syscall_64.tbl; ARM64: the generic table,
#: include/uapi/asm-generic/unistd.h).
MACHINES = {
    "x86_64": Machine(
        AUDIT_ARCH_X86_64,
        {
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
            "clone3": 435,
            "clone": 56,
            "unshare": 272,
            "pivot_root": 155,
        },
        x32=True,
    ),
    "aarch64": Machine(
        AUDIT_ARCH_AARCH64,
        {
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
            "clone3": 435,
            "clone": 220,
            "unshare": 97,
            "pivot_root": 41,
        },
    ),
}


class Instruction(NamedTuple):
    """struct sock_filter: the operation, the instructions to skip when a jump's test holds or not, the operand."""

    code: int
    true: int
    false: int
    k: int


#: struct sock_filter's layout (u16, u8, u8, u32, in the machine's byte order) and size.
INSTRUCTION_FORMAT = "=HBBI"
INSTRUCTION_BYTES = struct.calcsize(INSTRUCTION_FORMAT)


def _load(offset: int) -> Instruction:
    return Instruction(BPF_LD | BPF_W | BPF_ABS, 0, 0, offset)


def _jump(test: int, k: int, true: int, false: int) -> Instruction:
    return Instruction(BPF_JMP | test | BPF_K, true, false, k)


def _return(action: int) -> Instruction:
    return Instruction(BPF_RET | BPF_K, 0, 0, action)


def machine(name: str) -> Machine:
    """`name`'s numbers, or ``ValueError`` naming the machines the sandbox knows."""
    if name not in MACHINES:
        raise ValueError(f"no system call numbers for {name} (known: {', '.join(MACHINES)})")
    return MACHINES[name]


def instructions(name: str) -> list[Instruction]:
    """The filter for machine `name`: another ABI refused, the REFUSED calls refused, clone3 "no such call",
    clone and unshare refused with CLONE_NEWUSER in their flags, everything else allowed."""
    arch = machine(name)
    numbers = arch.numbers
    program = [_load(ARCH_OFFSET), _jump(BPF_JEQ, arch.audit_arch, 1, 0), _return(REFUSE), _load(NR_OFFSET)]
    if arch.x32:
        program += [_jump(BPF_JGE, X32_SYSCALL_BIT, 0, 1), _return(REFUSE)]
    for call in REFUSED:
        program += [_jump(BPF_JEQ, numbers[call], 0, 1), _return(REFUSE)]
    program += [_jump(BPF_JEQ, numbers["clone3"], 0, 1), _return(NO_SUCH_CALL)]
    # clone: to the flags check; unshare: likewise; any other call: past it, allowed.
    program += [_jump(BPF_JEQ, numbers["clone"], 1, 0), _jump(BPF_JEQ, numbers["unshare"], 0, 3)]
    program += [_load(ARG0_OFFSET), _jump(BPF_JSET, CLONE_NEWUSER, 0, 1), _return(REFUSE)]
    return [*program, _return(SECCOMP_RET_ALLOW)]


def assemble(name: str) -> bytes:
    """The filter for machine `name` as the kernel reads it: an array of struct sock_filter."""
    return b"".join(struct.pack(INSTRUCTION_FORMAT, *instruction) for instruction in instructions(name))
