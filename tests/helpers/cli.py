"""Running our command-line entry points in subprocesses: a wheel of the working tree installed in a fresh venv
(`build_wheel_venv`), the offline environment for such runs (`cli_env`), a runner that stops the whole process tree on
time-out (`run_cli`), and the output tail for assertion messages (`tail`)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.env import OFFLINE_ENV, REPO_ROOT

TIMEOUT = 600


#: What the wheel is built from (copied out of the working tree, so that builds never write into it).
def wheel_sources() -> list[str]:
    import tomllib

    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {name.split(".")[0] for name in setuptools["packages"]["find"]["include"]}
    modules = [f"{name}.py" for name in setuptools.get("py-modules", [])]
    return ["pyproject.toml", "setup.py", "README.md", *modules, *sorted(packages)]


@dataclass
class WheelVenv:
    wheel: Path
    root: Path
    python: Path
    site_packages: Path
    trl: Path  # the `trl` console script (as TRL's own wheel would install it)
    distmatch_trl: Path  # installed by our wheel


def build_wheel_venv(base: Path) -> WheelVenv:
    """Our wheel built from a copy of the working tree, installed into a fresh venv under `base` that also sees the
    running venv's packages (torch, trl, ...); a `trl` console script as TRL's own wheel would install it."""
    src = base / "src"
    for name in wheel_sources():
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(source, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "-q",
            "-w",
            str(base / "dist"),
            str(src),
        ],
        check=True,
        timeout=TIMEOUT,
    )
    (wheel,) = (base / "dist").glob("distmatch-*.whl")

    root = base / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=TIMEOUT)
    python = root / "bin" / "python"
    # Installed before the venv sees ours: pip then finds no `distmatch` (e.g. our editable one) already there; nor
    # through a PYTHONPATH pointing at a checkout (its distmatch.egg-info would count as installed).
    subprocess.run(
        [*pip, "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        timeout=TIMEOUT,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    site_packages = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    # A path line: the running venv's packages (torch, trl, ...) become importable, its .pth files stay unprocessed.
    # Named to be read before distmatch_hooks.trl.pth (alphabetical order), so that PyYAML is importable by then, as
    # in a real install where it sits in the same site-packages.
    (site_packages / "_parent_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    trl = root / "bin" / "trl"
    trl.write_text(
        f"#!{python}\nimport sys\n\nfrom trl.cli import main\n\nif __name__ == '__main__':\n    sys.exit(main())\n"
    )
    trl.chmod(0o755)
    return WheelVenv(wheel, root, python, site_packages, trl, root / "bin" / "distmatch-trl")


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTMATCH_", "ACCELERATE_", "PYTHON"))}
    env.update(OFFLINE_ENV)
    # Own caches: no accelerate default config of this machine, no datasets cache outside the test.
    env.update(HF_HOME=str(tmp / "hf_home"), DISTMATCH_DEBUG="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run_cli(
    command: list[Path | str], cwd: Path, timeout: float = TIMEOUT, **env: str
) -> subprocess.CompletedProcess:
    """Run to completion; on time-out stop the whole process tree (torchrun's workers get SIGTERM from it)."""
    with subprocess.Popen(
        [str(c) for c in command],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(cwd, **env),
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                stdout, stderr = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                stdout, stderr = process.communicate()
            out = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
            pytest.fail(f"timed out after {timeout} s\n{tail(out)}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


#: What a process that died in native code leaves on stderr (the C++ runtime, glibc, CPython's fatal-error handler).
ABNORMAL_END_SIGNS = (
    "terminate called",
    "Aborted",
    "core dumped",
    "Fatal Python error",
    "Segmentation fault",
)


def assert_every_rank_ended_cleanly(
    out: subprocess.CompletedProcess, ranks: int, threads_left: bool = False
) -> None:
    """A multi-process launch: exit status 0 (the launcher's is 0 only if every rank's is), no rank died in native
    code, and every rank released its process groups at exit (`trl_ext.teardown`; the line is printed under
    DISTMATCH_DEBUG, which `cli_env` sets) with no communication thread left. `threads_left=True` only for a launch
    whose groups torch itself keeps referenced from C++ (FSDP2's `fully_shard`: docs/distributed.md)."""
    from trl_ext.teardown import RELEASED_LINE

    assert out.returncode == 0, tail(out)
    for sign in ABNORMAL_END_SIGNS:
        assert sign not in out.stderr, tail(out)
    prefix = RELEASED_LINE.split("{left}")[0]
    released = sorted(line for line in out.stderr.splitlines() if line.startswith(prefix))
    assert [line.rsplit("(", 1)[1] for line in released] == [f"rank {rank})" for rank in range(ranks)], tail(
        out
    )
    if not threads_left:
        assert released == [f"{RELEASED_LINE.format(left=0)} (rank {rank})" for rank in range(ranks)], tail(
            out
        )


def tiny_sft_args(tiny: dict[str, Path], output_dir: Path, max_steps: int, *extra: str) -> list[str]:
    """`trl sft` arguments for the tiny model and data (`tiny["model"]`, `tiny["data"]`): a log entry and a
    checkpoint every step, CPU, seed 0; `extra` appended."""
    # Kept as written (fmt: skip): one flag and its value per line, as the command reads.
    return [
        "--model_name_or_path", str(tiny["model"]),
        "--dataset_name", str(tiny["data"]),
        "--output_dir", str(output_dir),
        "--max_steps", str(max_steps),
        "--per_device_train_batch_size", "4",
        "--max_length", "64",
        "--logging_steps", "1",
        "--save_strategy", "steps",
        "--save_steps", "1",
        "--report_to", "none",
        "--use_cpu",
        "--seed", "0",
        "--disable_tqdm", "true",
        *extra,
    ]  # fmt: skip


#: where a native failure says why (the C++ exception's message comes before the stacks that end stderr)
FIRST_FAILURE_SIGNS = (*ABNORMAL_END_SIGNS, "what():", "Error", "error:")


def tail(out: subprocess.CompletedProcess) -> str:
    """The end of both streams, and, when stderr is longer than its shown tail, the first lines that say why a
    process failed, each with the 2 lines before and 6 after (a rank's abort message is followed by every thread's
    stack and the launcher's report, which push it out of the tail)."""
    shown = out.stderr[-6000:]
    lines = out.stderr[: len(out.stderr) - len(shown)].splitlines()
    hits: list[int] = []
    for i, line in enumerate(lines):
        if any(sign in line for sign in FIRST_FAILURE_SIGNS) and (not hits or i > hits[-1] + 6):
            hits.append(i)
    first = "\n...\n".join("\n".join(lines[max(0, i - 2) : i + 7]) for i in hits[:3])
    cause = f"\n--- stderr, first failure lines before the tail\n{first[:3000]}" if first else ""
    return f"rc={out.returncode}{cause}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{shown}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
