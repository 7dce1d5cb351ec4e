"""What the harness hands the sandbox's first process: one frozen :class:`InitConfig`, as JSON in one argument.

The constants both sides need are defined here, once. Standard library only, and nothing of the project: ``init.py``
runs as a script under ``python -I`` and loads this file by its path (importing ``eval_tasks`` would import more
than the standard library before the sandbox is built). A configuration that is not exactly the fields below, each
of its type, is refused (:func:`InitConfig.from_json` raises ``ValueError``; the init then exits
:data:`SETUP_FAILED` and nothing runs).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

#: The init's exit status for any failure before the program starts (the harness raises SandboxUnavailable).
SETUP_FAILED = 125
#: As root, the program's user is UID_BASE + the launcher's host PID: above the ranges Linux distributions and
#: container runtimes hand out (systemd's container range ends at 0x6FFFFFFF); PIDs stay below 2**22.
UID_BASE = 0x70000000
#: The program's file in its scratch folder (the harness writes it; the init copies it into the sandbox's tmpfs).
PROGRAM_FILE = "program.py"


def _count(value: object) -> bool:
    return type(value) is int and value >= 0  # type() and not isinstance(): a bool is no count


def _path(value: object) -> bool:
    return type(value) is str and value.startswith("/") and "\0" not in value


def _pieces(value: object) -> bool:
    pairs = type(value) is tuple and len(value) > 0 and all(type(p) is tuple and len(p) == 2 for p in value)
    return pairs and all(_count(n) for p in value for n in p)  # type: ignore[union-attr]


#: Each field's type as written in the class (the annotations are strings here) -> its check, and the words for it.
_CHECKS = {
    "str": (_path, "an absolute path"),
    "int": (_count, "an integer >= 0"),
    "bool": (lambda value: type(value) is bool, "true or false"),
    "tuple[str, ...]": (
        lambda value: type(value) is tuple and all(_path(v) for v in value),
        "absolute paths",
    ),
    "tuple[tuple[int, int], ...]": (_pieces, "[length, line] pairs of integers >= 0, at least one"),
}


@dataclass(frozen=True)
class InitConfig:
    """One sandbox's settings, as the init reads them (sizes in bytes, paths absolute)."""

    host_dir: (
        str  #: the scratch folder on the host, holding PROGRAM_FILE; the sandbox's root is built over it
    )
    cpu_s: int  #: RLIMIT_CPU
    memory_bytes: int  #: RLIMIT_AS, per process
    file_bytes: int  #: RLIMIT_FSIZE
    processes: int  #: RLIMIT_NPROC
    scratch_bytes: int  #: the size of the scratch tmpfs: everything the program writes
    real_root: bool  #: started as root: the program runs as UID_BASE + the launcher's PID (else: in a user namespace)
    python: str  #: the programs' interpreter
    prefixes: tuple[str, ...]  #: the interpreter's prefixes, shown read-only when not under /usr
    #: the launcher's site-packages (read-only and PYTHONPATH) for another interpreter
    packages: tuple[str, ...]
    nonce_fd: (
        int  #: the inherited pipe holding this run's nonce (read by the runner after the program returned)
    )
    verdict_fd: int  #: the inherited pipe the runner writes "started" and then the nonce to
    #: each piece of the program: its length, its first line's number less one
    pieces: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            check, words = _CHECKS[str(field.type)]
            if not check(value):
                raise ValueError(f"InitConfig: {field.name} must be {words}, got {value!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> InitConfig:
        """The configuration `text` holds, or ``ValueError`` (one line): not JSON, not an object, a field missing or
        unknown, or a value not of its field's type (JSON arrays become tuples)."""
        try:
            data = json.loads(text)
        except ValueError as err:
            raise ValueError(f"InitConfig: not JSON ({err})") from None
        names = [field.name for field in fields(cls)]
        if type(data) is not dict or sorted(data) != sorted(names):
            got = sorted(data) if type(data) is dict else type(data).__name__
            raise ValueError(f"InitConfig: expected an object with exactly {names}, got {got}")
        return cls(**{name: _tuples(data[name]) for name in names})


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if type(value) is list else value
