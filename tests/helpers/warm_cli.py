"""Command lines run without paying for the interpreter's imports each time.

A refusal test of `trl sft`, `lm_eval run` or `axolotl train` spends 5 - 15 s importing torch, transformers and the
framework, and about a second on what it checks; the `trl sft` process of a training run only parses and starts
`accelerate launch` (whose training process starts cold, as always). `WarmCli` keeps one process of the interpreter
under test that has imported the libraries the frameworks import (never the frameworks the activation hooks wait
for: `trl`, `lm_eval`, `axolotl`), and forks it for each command (`tests/helpers/_warm_zygote.py`). The forked child
is a real process of that interpreter: it takes the command's working folder, environment and `sys.argv`, runs the
activation hooks' `.pth` lines again (each hook decides on this command, as at interpreter start), then the real
console script or `-m` module, and exits as the interpreter would (the hooks' `sys.excepthook`, the exit status,
`atexit`). Output and exit status come back as from `run_cli` (`run`) or `subprocess.run` with a whole environment
(`run_in`).

What a warm run cannot show is interpreter start itself, so the first refused command of each program (the `trl`
script, `distmatch-trl`, `python -m lm_eval`, ...) in a session also runs cold, as a plain subprocess, and the two must
agree: the same exit status and the same `error:` lines (a refusal writes nothing, so it can run twice). A command
whose environment differs from the warm process's in what only interpreter start reads (`PYTHONPATH`,
`PYTHONSTARTUP`, ...) runs cold. The first process of the multi-process runs of tests/distributed/test_trl_distributed.py
is forked too (it parses and starts `accelerate launch`; the ranks are fresh interpreters, as always); the two-process
hook launch of tests/trl/cli/test_trl_sft.py, the killed, refused and disk-filling runs of the fault tests and the
documented commands run cold (`run_cli`).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.helpers.cli import TIMEOUT, cli_env, tail

ZYGOTE = Path(__file__).with_name("_warm_zygote.py")
#: what the frameworks import that no activation hook waits for (the warm process imports these once)
PRELOAD = ("torch", "transformers", "transformers.trainer", "accelerate", "datasets", "peft")
#: what must not be imported before a command starts: the modules the activation hooks patch on import
HOOKED = ("trl", "lm_eval", "axolotl")
#: read by the interpreter at start only
START_ONLY = (
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
)


def _run_cold(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _error_lines(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (out.stdout + out.stderr).splitlines() if "error: " in line]


class WarmCli:
    """One warm interpreter (`python`); `run` is `run_cli` for a command of that interpreter."""

    def __init__(
        self, python: Path, base: Path, preload: tuple[str, ...] = PRELOAD, hooked: tuple[str, ...] = HOOKED
    ) -> None:
        """`hooked`: the packages that must not be imported before a command starts (`trl` may be preloaded for
        `axolotl train`, whose process the TRL hook leaves alone)."""
        self.python = Path(python)
        self.base = base
        self.env = cli_env(base)
        self.checked: set[str] = set()
        self.process = subprocess.Popen(
            [str(self.python), str(ZYGOTE), json.dumps(list(preload))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
            cwd=base,
            start_new_session=True,
        )
        ready = self.process.stdout.readline()  # type: ignore[union-attr]
        assert ready, f"the warm interpreter {self.python} did not start (exit {self.process.poll()})"
        imported = json.loads(ready)["ready"]
        early = [name for name in imported if name.split(".")[0] in hooked]
        assert not early, f"the warm interpreter imported what a hook waits for: {early[:5]}"

    def run(
        self, command: list[Path | str], cwd: Path, timeout: float = TIMEOUT, **env: str
    ) -> subprocess.CompletedProcess:
        """`run_cli(command, cwd, timeout, **env)`, forked from the warm interpreter."""
        return self.run_in(command, cwd, cli_env(cwd, **env), timeout)

    def run_in(
        self, command: list[Path | str], cwd: Path, full_env: dict[str, str], timeout: float = TIMEOUT
    ) -> subprocess.CompletedProcess:
        """The same with the command's whole environment given (`subprocess.run(command, env=full_env)`)."""
        argv = [str(c) for c in command]
        if any(full_env.get(name) != self.env.get(name) for name in START_ONLY):
            return _run_cold(argv, cwd, full_env, timeout)  # what only interpreter start reads differs
        script = argv[0] != str(self.python)
        if script:  # a console script of this interpreter
            assert Path(argv[0]).read_text(errors="replace").startswith(f"#!{self.python}"), argv[0]
            program = argv[0]
        else:
            assert argv[1] in ("-m", "-c"), argv
            program = " ".join(argv[:3] if argv[1] == "-m" else argv[:2])
        warm = self._fork(argv, script, cwd, full_env, timeout)
        # Once per program, the cold start must agree; on a refusal, which wrote nothing, so that it runs again the
        # same way.
        if program not in self.checked and warm.returncode != 0:
            self.checked.add(program)
            cold = _run_cold(argv, cwd, full_env, timeout)
            assert (cold.returncode, _error_lines(cold)) == (warm.returncode, _error_lines(warm)), (
                f"warm and cold runs of {program} differ\n--- warm\n{tail(warm)}\n--- cold\n{tail(cold)}"
            )
        return warm

    def _fork(
        self, argv: list[str], script: bool, cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(dir=self.base) as folder:
            stdout, stderr = Path(folder, "stdout"), Path(folder, "stderr")
            request = {"argv": argv, "script": script, "cwd": str(cwd), "env": env, "timeout": timeout}
            request.update(stdout=str(stdout), stderr=str(stderr))
            self.process.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
            self.process.stdin.flush()  # type: ignore[union-attr]
            reply = self.process.stdout.readline()  # type: ignore[union-attr]
            assert reply, f"the warm interpreter {self.python} ended (exit {self.process.poll()})"
            out = subprocess.CompletedProcess(
                argv, json.loads(reply)["returncode"], stdout.read_text(), stderr.read_text()
            )
        if out.returncode == -9:
            pytest.fail(f"timed out after {timeout} s\n{tail(out)}")
        return out

    def close(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()
