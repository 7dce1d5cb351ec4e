"""The sandbox's runner: the interpreter's main code inside the sandbox, which runs the program and gives the
verdict the contract (:mod:`eval_tasks.sandbox`, "A pass") describes. ``init.py`` passes this file's source:

    python -s -B -c <this source> '{"path": ..., "nonce_fd": ..., "verdict_fd": ..., "pieces": [[length, line], ...]}'

(the arguments of :func:`_run`, as JSON; a malformed one ends it before it writes :data:`STARTED`, so the harness
raises ``SandboxUnavailable``). In order:

1. it writes :data:`STARTED` to the verdict pipe: from here on, what happens is the program's doing;
2. it decodes the program as UTF-8 and parses each piece alone (``pieces``: each one's length in characters and its
   first line's number less one in the file, which holds the pieces joined by newlines), and makes their statements
   one code object: no state of this runner lies between the pieces for the program to change;
3. it runs that once in a fresh module named :data:`MODULE`, with an audit hook and ``sys.settrace`` /
   ``sys.setprofile`` wrappers that refuse every hook but ``None``;
4. only when that returns normally, in this process: it reads the nonce from ``nonce_fd`` and writes it to the
   verdict pipe;
5. it ends the process with ``os._exit`` (a program that raised: status 1 and the traceback without this runner's
   frames on stderr, printed here; ``SystemExit``: its code).

Every function it needs is bound before the program runs, so a program that replaces ``os._exit``, ``exec`` or
``sys.stderr`` does not change what this code does. Standard library only (the project is not in the sandbox); the
harness imports it for :data:`STARTED`.
"""

import json
import os
import sys

#: The program's module name: not ``__main__``, as in the reference harnesses (openai/human-eval and EvalPlus exec
#: the program in a fresh namespace), so a completion's ``if __name__ == "__main__":`` block does not run.
MODULE = "__program__"
#: The first bytes on the verdict pipe: the harness's time limit counts from them, and without them the sandbox
#: never started the program.
STARTED = b"started\n"


def _run(path: str, nonce_fd: int, verdict_fd: int, pieces: list[list[int]]) -> None:
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

    def build(text: str, filename: str, mode: str) -> types.CodeType:
        """The program's code: each piece parsed alone (padded to its lines in the file), their statements in one
        module."""
        body, start = [], 0
        for size, line in pieces:
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
    write(verdict_fd, STARTED)
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
    _run(**json.loads(sys.argv[1]))
