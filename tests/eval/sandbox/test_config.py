"""What the harness hands the sandbox's init: an InitConfig, as JSON in one argument. The harness's limits arrive in
it as the init applies them; a malformed one is refused, by the class and by the init itself (exit SETUP_FAILED, one
line, before anything is built); the init reads it with the standard library only; each shared constant is defined in
one module of the package."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eval_tasks.sandbox import config, harness
from eval_tasks.sandbox.config import InitConfig

PACKAGE = Path(harness.__file__).parent
INIT = PACKAGE / "init.py"

GOOD = InitConfig(
    host_dir="/tmp/distmatch-sandbox-1-x",
    cpu_s=4,
    memory_bytes=300 * 2**20,
    file_bytes=2 * 2**20,
    processes=7,
    scratch_bytes=8 * 2**20,
    real_root=True,
    python="/usr/bin/python3",
    prefixes=("/opt/venv",),
    packages=(),
    nonce_fd=5,
    verdict_fd=6,
    pieces=((10, 0), (3, 2)),
)


def test_a_configuration_survives_its_json() -> None:
    assert InitConfig.from_json(GOOD.to_json()) == GOOD
    assert "\n" not in GOOD.to_json()


def test_the_harness_hands_over_its_limits_in_bytes_and_cpu_seconds(monkeypatch) -> None:
    monkeypatch.setattr(harness.shutil, "which", lambda name: "/usr/bin/unshare")
    limits = harness.SandboxLimits(memory_mb=300, file_size_mb=2, processes=7, scratch_mb=8)
    command = harness._launcher("/tmp/x", 2.5, limits, True, (5, 6), ((10, 0), (3, 2)))
    assert command[0] == "/usr/bin/unshare" and command[-5:-1] == [sys.executable, "-I", "-B", str(INIT)]
    got = InitConfig.from_json(command[-1])
    assert (got.cpu_s, got.memory_bytes, got.file_bytes, got.processes, got.scratch_bytes) == (
        4,  # the time limit rounded up, plus 1 s
        300 * 2**20,
        2 * 2**20,
        7,
        8 * 2**20,
    )
    assert (got.host_dir, got.real_root, got.nonce_fd, got.verdict_fd) == ("/tmp/x", True, 5, 6)
    assert got.pieces == ((10, 0), (3, 2))


BAD = {
    "not json": "{",
    "an array": "[]",
    "a field missing": json.dumps({k: v for k, v in json.loads(GOOD.to_json()).items() if k != "python"}),
    "an unknown field": json.dumps({**json.loads(GOOD.to_json()), "extra": 1}),
    "a bool for a count": json.dumps({**json.loads(GOOD.to_json()), "processes": True}),
    "a negative count": json.dumps({**json.loads(GOOD.to_json()), "cpu_s": -1}),
    "a string for a count": json.dumps({**json.loads(GOOD.to_json()), "memory_bytes": "300"}),
    "a relative path": json.dumps({**json.loads(GOOD.to_json()), "python": "python3"}),
    "a count for a flag": json.dumps({**json.loads(GOOD.to_json()), "real_root": 1}),
    "no pieces": json.dumps({**json.loads(GOOD.to_json()), "pieces": []}),
    "a piece of three numbers": json.dumps({**json.loads(GOOD.to_json()), "pieces": [[1, 2, 3]]}),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_malformed_configuration_is_refused_in_one_line(case) -> None:
    with pytest.raises(ValueError, match=r"^InitConfig: ") as err:
        InitConfig.from_json(BAD[case])
    assert "\n" not in str(err.value)


def test_the_class_refuses_a_wrong_field_too() -> None:
    with pytest.raises(ValueError, match=r"InitConfig: scratch_bytes must be an integer >= 0, got 1.5"):
        dataclasses.replace(GOOD, scratch_bytes=1.5)


def _init(*args: str) -> subprocess.CompletedProcess[str]:
    """The init as the harness starts it, in a mount namespace of its own when unshare is there (a host's mounts stay
    untouched even if it went on), but not as the first process of a new PID namespace."""
    prefix = []
    if sys.platform.startswith("linux") and shutil.which("unshare"):
        prefix = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    command = [*prefix, sys.executable, "-I", "-B", "-X", "importtime", str(INIT), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, cwd="/")


@pytest.mark.launches
@pytest.mark.parametrize("case", ["not json", "a field missing", "a relative path", "no argument"])
def test_the_init_refuses_a_malformed_configuration_before_anything(case) -> None:
    done = _init() if case == "no argument" else _init(BAD[case])
    if "unshare failed" in done.stderr:
        pytest.skip(f"no mount namespace here: {done.stderr[-200:]}")
    lines = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == config.SETUP_FAILED and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("sandbox setup failed: ValueError: "), lines
    # Read with the standard library only: after the interpreter's start (`site`, which runs the activation hooks'
    # .pth files), nothing of the project is imported (config.py and syscalls.py load by their paths).
    imported = re.findall(r"^import time:.*\|( *)(\S+)$", done.stderr, re.M)
    after_site = [
        name for _, name in imported[[i for i, (_, name) in enumerate(imported) if name == "site"][-1] :]
    ]
    assert (
        "json" in after_site
        and [m for m in after_site if m.split(".")[0] in ("eval_tasks", "distmatch")] == []
    )


@pytest.mark.launches
def test_the_init_builds_nothing_outside_a_new_pid_namespace(tmp_path) -> None:
    settings = dataclasses.replace(GOOD, host_dir=str(tmp_path), real_root=False)
    (tmp_path / config.PROGRAM_FILE).write_text("pass\n")
    done = _init(settings.to_json())
    if "unshare failed" in done.stderr:
        pytest.skip(f"no mount namespace here: {done.stderr[-200:]}")
    assert done.returncode == config.SETUP_FAILED, done.stderr[-2000:]
    assert "not the first process of a new PID namespace" in done.stderr
    assert sorted(os.listdir(tmp_path)) == [config.PROGRAM_FILE]


def _assigned(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            for name in ast.walk(target) if target is not None else ():
                if isinstance(name, ast.Name):
                    names.add(name.id)
    return names


def test_each_shared_constant_is_defined_in_one_module() -> None:
    """The values harness, init and runner agree on are assigned once in the package; the others import them."""
    modules = {path.name: _assigned(path) for path in PACKAGE.glob("*.py")}
    for name in ("UID_BASE", "SETUP_FAILED", "PROGRAM_FILE", "STARTED", "MODULE", "CLONE_NEWUSER", "REFUSED"):
        assert [module for module, names in modules.items() if name in names] != [], name
        assert len([module for module, names in modules.items() if name in names]) == 1, name
    assert harness.UID_BASE is config.UID_BASE


def test_the_config_module_needs_only_the_standard_library() -> None:
    imported = re.findall(r"^(?:from|import) (\w+)", Path(config.__file__).read_text(), re.M)
    assert sorted(set(imported)) == ["__future__", "dataclasses", "json"]
