"""What a sandboxed program sees, wherever the checkout, the venvs and TMPDIR live.

The expected view is derived from the host paths the harness binds (the interpreter's prefix, the launcher's
site-packages), never from where this checkout happens to be. Each test runs in three layouts, for real: as this run
is laid out; with the programs' interpreter in a venv under /tmp (a fresh clone's venv there: its folder is bound at
its own path, so the sandbox's /tmp holds more than the scratch folder); and with TMPDIR in a folder outside /tmp
(usual on cluster nodes: the scratch folder is made there on the host, and is still /tmp/distmatch-sandbox-* inside).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from eval_tasks import sandbox
from eval_tasks.sandbox import harness
from tests.eval.sandbox.conftest import run, sandbox_processes, scratch_folders
from tests.helpers.env import REPO_ROOT

pytestmark = [
    pytest.mark.launches,
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or shutil.which("unshare") is None,
        reason="needs Linux and unshare",
    ),
]

TOP = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")  # the host's top-level folders or links shown


@pytest.fixture(params=["as_run", "interpreter_under_tmp", "tmpdir_elsewhere"])
def layout(request, monkeypatch) -> Iterator[str]:
    """Sets the layout up; after the test, no scratch folder (in that layout's TMPDIR) and no sandboxed process is
    left."""
    made = None
    if request.param == "interpreter_under_tmp":
        made = tempfile.mkdtemp(prefix="distmatch-test-venv-", dir="/tmp")
        venv = Path(made, "venv")
        # the one the sandbox would run: its venv, under /tmp
        python = harness._interpreter(os.geteuid() == 0)
        subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
        monkeypatch.setenv(sandbox.PYTHON_ENV, str(venv / "bin" / "python"))
    elif request.param == "tmpdir_elsewhere":
        base = next((d for d in ("/var/tmp", "/dev/shm") if os.access(d, os.W_OK)), None)
        if base is None:
            pytest.skip("no writable folder outside /tmp for TMPDIR")
        made = tempfile.mkdtemp(prefix="distmatch-test-tmpdir-", dir=base)
        monkeypatch.setenv("TMPDIR", made)
        monkeypatch.setattr(tempfile, "tempdir", made)  # what execute's mkdtemp reads
    before = scratch_folders()
    try:
        yield request.param
        assert scratch_folders() - before == set()
        assert sandbox_processes() == []
    finally:
        if made is not None:
            shutil.rmtree(made)


def _covered(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f + "/") for f in folders)


def _binds() -> list[str]:
    """The host folders the sandbox shows at their own paths: the top-level folders (links are copied), then the
    interpreter's prefix and the launcher's site-packages when another interpreter runs the programs (real paths,
    those inside an earlier one left out)."""
    python = harness._interpreter(os.geteuid() == 0)
    extra = list(harness._prefixes(python))
    if python != sys.executable:
        extra += harness._packages()
    binds = [f"/{top}" for top in TOP if os.path.isdir(f"/{top}") and not os.path.islink(f"/{top}")]
    for path in filter(None, extra):
        real = os.path.realpath(path)
        if os.path.isdir(real) and real != "/" and not _covered(real, binds):
            binds.append(real)
    return binds


def _views(binds: list[str]) -> dict[str, set[str]]:
    """Each folder of the sandbox's own root (not in a bind) -> what it holds; /tmp also holds the scratch folder."""
    views = {"/": {t for t in TOP if os.path.lexists(f"/{t}")} | {"etc", "dev", "proc", "tmp"}, "/tmp": set()}
    for bind in binds:
        parts = bind.strip("/").split("/")
        for depth in range(len(parts)):
            folder = "/" + "/".join(parts[:depth])
            if not _covered(folder, binds):
                views.setdefault(folder, set()).add(parts[depth])
    return views


def _exists_inside(path: str) -> bool:
    binds = _binds()
    return path in _views(binds) or _covered(path, binds)


def test_only_the_interpreter_and_the_scratch_folder_are_visible(layout, tmp_path) -> None:
    readable = tmp_path / "world-readable.txt"
    readable.write_text("host data")
    readable.chmod(0o644)
    for folder in (tmp_path, *tmp_path.parents):
        folder.chmod(folder.stat().st_mode | 0o005)
    binds = _binds()
    views = _views(binds)
    files = [f"/etc/{n}" for n in ("ld.so.cache", "localtime") if os.path.isfile(f"/etc/{n}")]
    mounts = [*binds, *files, "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]
    absent = [
        str(readable),
        str(REPO_ROOT / "pyproject.toml"),
        "/run",
        "/home",
        "/var",
        "/mnt",
        "/etc/shadow",
    ]
    absent = [p for p in absent if p not in views and not _covered(p, binds)]  # the way to a venv under /home
    program = (
        "import os\n"
        f"views = {views!r}\n"
        "views['/tmp'].add(os.path.basename(os.getcwd()))\n"
        # The folders of its root (the way to each bind included) hold exactly the list: nothing of the host.
        "for folder, names in views.items():\n"
        "    assert set(os.listdir(folder)) == names, (folder, sorted(os.listdir(folder)))\n"
        "assert set(os.listdir('/etc')) <= {'passwd', 'group', 'hosts', 'ld.so.cache', 'localtime'}\n"
        "assert set(os.listdir('/dev')) <= {'null', 'zero', 'full', 'random', 'urandom', 'fd', 'stdin', 'stdout', "
        "'stderr', 'shm'}\n"
        "assert os.listdir('.') == ['program.py']\n"
        # Nothing is stacked over the root (the host's root, left there by pivot_root, shows at '/tmp/..').
        "assert sorted(os.listdir('/tmp/..')) == sorted(os.listdir('/'))\n"
        "points = [line.split()[4] for line in open('/proc/self/mountinfo')]\n"
        f"shown = {mounts!r} + [os.getcwd()]\n"
        "assert points.count('/') == 1, points\n"
        "assert all(p in ('/', '/proc') or any(p == s or p.startswith(s + '/') for s in shown) for p in points), "
        "points\n"
        "open('/dev/null', 'w').write('x')\n"
        "import sys, json\n"  # the standard library works
        f"for path in {absent!r}:\n"
        "    assert not os.path.exists(path), path\n"
    )
    result = run(program)
    assert result.passed, (layout, result.reason)


@pytest.mark.parametrize("where", ["sandbox_tmp", "host_tmpdir", "world_writable_folder"])
def test_write_outside_scratch_fails_and_leaves_no_file(layout, where) -> None:
    """/tmp (inside: read-only, its own), the host's TMPDIR (the same folder, or one the sandbox does not have), and
    a folder everyone may write to: the write fails, and no file appears on the host."""
    folder = {"sandbox_tmp": "/tmp", "host_tmpdir": tempfile.gettempdir()}.get(where)
    if folder is None:
        folder = tempfile.mkdtemp(prefix="distmatch-test-open-")
        os.chmod(folder, 0o777)
    target = Path(folder, f"distmatch-escape-{uuid.uuid4().hex}")
    try:
        result = run(f"open({str(target)!r}, 'w').write('escaped')\n")
        expected = "Read-only file system" if _exists_inside(folder) else "No such file or directory"
        assert not result.passed and expected in result.reason, (layout, result)
        assert not target.exists()
    finally:
        if where == "world_writable_folder":
            shutil.rmtree(folder)


def test_the_scratch_folder_is_made_in_the_hosts_tmpdir(layout) -> None:
    """On the host, where TMPDIR says (inside it is /tmp/distmatch-sandbox-*, whatever the layout); gone after."""
    seen: set[str] = set()
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(
            run, "import os, time\nassert os.path.dirname(os.getcwd()) == '/tmp'\ntime.sleep(0.3)\n"
        )
        while not future.done():
            seen |= scratch_folders()
            time.sleep(0.01)
    assert future.result().passed, future.result().reason
    assert len(seen) == 1, (layout, tempfile.gettempdir(), seen)
