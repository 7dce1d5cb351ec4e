"""The interpreter's main code inside the sandbox (passed with ``python -c`` by ``_sandbox_init.py``; not imported).

It runs the program and tells the harness whether the program's code ran to its end:

    python -s -B -c <this source> PROGRAM NONCE_FD VERDICT_FD LAYOUT

1. it writes ``started`` to the verdict pipe (``VERDICT_FD``): from here on, what happens is the program's doing;
2. it compiles PROGRAM (decoded as UTF-8 here, so a coding cookie cannot re-read the harness's checks) piece by
   piece: ``LAYOUT`` gives each piece's length in characters and its first line's number less one (the file holds
   the pieces joined by newlines); each is parsed on its own, so one that parses only together with the next fails
   the program (a completion cannot reach across its end into the checks: a dangling decorator, bracket, string,
   backslash or ``if`` header), and their statements make one code object, run once (no state of this runner
   between the pieces that the program could change to skip one);
3. it runs that in a fresh module named ``__program__`` (also ``sys.modules["__main__"]``; not named ``__main__``,
   as in the reference harnesses, so a completion's ``if __name__ == "__main__":`` block does not run), with
   tracing and profiling hooks refused (``sys.settrace`` / ``setprofile`` / ``sys.monitoring`` could jump over a
   failing ``assert``; an audit hook; ``sys.settrace(None)`` / ``sys.setprofile(None)``, which doctest calls, still
   clear them);
4. only when that ``exec`` returns normally in this process (not in a forked child): it reads the harness's nonce
   from ``NONCE_FD`` (the nonce is in no file, argument or environment variable, and nothing of it is in this
   process before this point) and writes it to the verdict pipe;
5. it ends the process at once with ``os._exit``: no ``atexit`` handler, thread join or finalizer of the program
   runs after the verdict. A program that raised ends with status 1 (``SystemExit``: its code) and the traceback
   on stderr, printed here (the program's ``sys.excepthook`` is not used).

Every function it needs is bound before the program runs, so a program that replaces ``os._exit``, ``exec`` or
``sys.stderr`` does not change what this code does. Standard library only.
"""

import os
import sys

#: The program's module name: not ``__main__``, as in the reference harnesses (openai/human-eval and EvalPlus exec
#: the program in a fresh namespace), so a completion's ``if __name__ == "__main__":`` block does not run.
MODULE = "__program__"


def _run(path: str, nonce_fd: int, verdict_fd: int, layout: str) -> None:
    read, write, exit_now, getpid = os.read, os.write, os._exit, os.getpid
    run = exec
    import ast
    import builtins
    import traceback
    import types

    format_exception = traceback.format_exception
    streams = (sys.stdout, sys.stderr)
    me = getpid()
    blocked = frozenset(
        {"sys.settrace", "sys.setprofile", "sys._settraceallthreads", "sys._setprofileallthreads"}
    )
    clearing = [False]  # set while `without_hook` clears a hook: the one case the audit hook lets through

    def refuse_tracing(event: str, args: tuple) -> None:
        if (event in blocked and not clearing[0]) or event.startswith("sys.monitoring"):
            raise RuntimeError(f"the sandbox refuses {event}: tracing hooks could skip the program's checks")

    def without_hook(original: object, name: str) -> object:
        """`sys.settrace` / `sys.setprofile` that accept only None (doctest saves and restores the hook)."""

        def clear(function: object) -> None:
            if function is not None:
                raise RuntimeError(
                    f"the sandbox refuses sys.{name}: tracing hooks could skip the program's checks"
                )
            clearing[0] = True
            try:
                original(None)  # type: ignore[operator]
            finally:
                clearing[0] = False

        return clear

    spans = [tuple(map(int, item.split(":"))) for item in layout.split(",")]

    def build(text: str, filename: str, mode: str) -> types.CodeType:
        """The program's code: each piece parsed alone (padded to its lines in the file), their statements in one
        module."""
        body, start = [], 0
        for size, line in spans:
            body += ast.parse("\n" * line + text[start : start + size], filename, mode).body
            start += size + 1
        return compile(ast.Module(body, []), filename, mode)

    def flush() -> None:
        for stream in {id(s): s for s in (*streams, sys.stdout, sys.stderr)}.values():
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001, S110 - nothing of the program may stop the exit
                pass

    def report(err: BaseException) -> None:
        try:
            tb = err.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != path:  # this runner's frames, build's
                tb = tb.tb_next
            text = "".join(format_exception(type(err), err, tb))
        except BaseException:  # noqa: BLE001 - the program's exception could not be formatted
            text = f"{type(err).__name__} (its message could not be formatted)\n"
        try:
            write(2, text.encode("utf-8", "backslashreplace"))
        except BaseException:  # noqa: BLE001, S110
            pass

    with open(path, "rb") as f:
        source = f.read()
    main = types.ModuleType(MODULE)
    main.__file__ = path
    main.__builtins__ = builtins
    sys.modules[MODULE] = sys.modules["__main__"] = main
    sys.argv[:] = [path]
    sys.path[0] = os.path.dirname(path)
    sys.addaudithook(refuse_tracing)
    sys.settrace = without_hook(sys.settrace, "settrace")
    sys.setprofile = without_hook(sys.setprofile, "setprofile")
    write(verdict_fd, b"started\n")
    status = 1
    try:
        run(build(source.decode("utf-8"), path, "exec"), main.__dict__)
    except SystemExit as err:
        code = err.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code & 0xFF
        else:
            try:
                write(2, (str(code) + "\n").encode("utf-8", "backslashreplace"))
            except BaseException:  # noqa: BLE001, S110
                pass
    except BaseException as err:  # noqa: BLE001 - every other way out is a failure, printed
        report(err)
    else:
        if getpid() == me:  # a forked child that ran to the end gives no verdict
            try:
                write(verdict_fd, read(nonce_fd, 64))
                status = 0
            except BaseException:  # noqa: BLE001 - no verdict
                status = 1
        else:
            status = 0
    flush()
    exit_now(status)


if __name__ == "__main__":
    _run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
