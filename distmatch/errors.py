"""The error of a refused setting and how entry points print it: one line, exit status 2, no traceback."""

from __future__ import annotations

import sys

__all__ = [
    "CONFIG_ERROR_STATUS",
    "DistMatchConfigError",
    "config_errors",
    "print_config_errors_as_one_line",
    "stderr_line",
]

#: Exit status of a command refused for a setting (argparse's status for a bad argument).
CONFIG_ERROR_STATUS = 2


class DistMatchConfigError(ValueError):
    """A setting distmatch refuses (the message names it and says what to do); entry points print it as one line."""


def stderr_line(text: str) -> None:
    """`text` and its newline on stderr in one write: the ranks of a multi-process launch share one stderr, and
    `print` writes the text and the newline separately when stderr is unbuffered (PYTHONUNBUFFERED, `-u`), so two
    ranks' lines could run together."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def config_errors(err: BaseException) -> list[str]:
    """The DistMatchConfigError messages in `err`: itself, its cause/context chain, or a pydantic error's items."""
    found: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DistMatchConfigError):
            return [str(current)]
        errors = getattr(current, "errors", None)  # pydantic.ValidationError: the validators' exceptions
        if callable(errors) and type(current).__name__ == "ValidationError":
            try:
                items = errors()
            except Exception:
                items = []
            for item in items:
                inner = (item.get("ctx") or {}).get("error") if isinstance(item, dict) else None
                if isinstance(inner, DistMatchConfigError):
                    found.append(str(inner))
            if found:
                return found
        current = current.__cause__ or current.__context__
    return found


def print_config_errors_as_one_line() -> None:
    """`sys.excepthook` that prints an uncaught DistMatchConfigError as `error: <message>` (no traceback) and ends
    the process with status 2, as argparse does for a bad argument: CPython honours a SystemExit raised by the
    excepthook. Any other exception keeps the previous hook."""
    previous = sys.excepthook
    if getattr(previous, "_distmatch", False):
        return

    def hook(kind: type, err: BaseException, tb: object) -> None:
        messages = config_errors(err)
        if not messages:
            previous(kind, err, tb)
            return
        for message in messages:
            stderr_line(f"error: {message}")
        raise SystemExit(CONFIG_ERROR_STATUS)

    hook._distmatch = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def one_edit_apart(a: str, b: str) -> bool:
    """Whether `a` becomes `b` by changing, adding or removing one character (not equal): `gem_betta` for
    `gem_beta`, a typo the frameworks would ignore."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))
