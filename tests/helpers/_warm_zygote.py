"""The process behind `tests/helpers/warm_cli.py` (run by the interpreter under test, standard library only).

    python _warm_zygote.py '["torch", "transformers", ...]'

Imports the listed libraries once, prints `ready`, then reads one JSON request per line from stdin: `argv` (as a
shell would start it: an interpreter with `-m MODULE` / `-c CODE`, or a script: `script` true), `cwd`, `env`, `stdout`, `stderr`
(files), `timeout`. For each it forks a child that becomes that command as a fresh interpreter would: its working
folder, its whole environment, its `sys.argv`, stdout / stderr on the files, and the activation hooks' `.pth` lines
executed again (so a hook decides on this command's `sys.argv` and environment, as at interpreter start); then runs
the program, and ends as the interpreter ends a program (an uncaught exception goes to `sys.excepthook`, whose
`SystemExit` sets the status; `atexit` handlers run). The reply is the child's exit status.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
import signal
import site
import sys
import time
import traceback

HOOK_LINE_PREFIX = "import distmatch_hooks"


def hook_lines() -> list[str]:
    """The activation hooks' `.pth` lines of this interpreter's site-packages."""
    lines = []
    for folder in site.getsitepackages():
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if name.endswith(".pth") and name.startswith("distmatch_hooks"):
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    lines += [line.strip() for line in handle if line.startswith(HOOK_LINE_PREFIX)]
    return lines


def _status(err: SystemExit) -> int:
    code = err.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _program(argv: list[str]) -> int:
    """Run `argv` (after the interpreter) as `python ...` would; the exit status."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as err:
        return _status(err)
    except BaseException as err:  # what the interpreter does with an uncaught exception
        try:
            sys.excepthook(type(err), err, err.__traceback__)
        except SystemExit as hook_exit:
            return _status(hook_exit)
        return 1


def _child(request: dict) -> None:
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.excepthook = sys.__excepthook__
        argv = request["argv"]
        # sys.argv as the interpreter has it while the .pth files run: the script and its arguments, or `-m` / `-c`
        # and the program's arguments
        sys.argv = list(argv) if request["script"] else [argv[1], *argv[3:]]
        sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("distmatch_hooks")]
        for line in hook_lines():  # interpreter start, again: each hook decides on this command
            sys.modules.pop(line.split()[1], None)
            exec(line, {})
        code = _program(argv if request["script"] else argv[1:])
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -signal.SIGKILL
        time.sleep(0.02)


def main() -> None:
    for name in json.loads(sys.argv[1]):
        importlib.import_module(name)
    # The preloaded libraries live as long as every child: out of the cyclic collector's scans (each framework's
    # gc.collect() then costs what it does in a small process), and their pages stay shared after the fork.
    gc.collect()
    gc.freeze()
    print(json.dumps({"ready": sorted(sys.modules)}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)  # its own process group: a time-out stops it and whatever it started
            _child(request)
        print(json.dumps({"returncode": _wait(pid, request["timeout"])}), flush=True)


if __name__ == "__main__":
    main()
