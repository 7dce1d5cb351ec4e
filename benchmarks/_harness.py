"""What both benchmark scripts share: one worker process per case, library versions, the output files.

Each script re-executes itself with ``--_worker '<case JSON>'`` for every case (so no case's allocator state or peak
memory leaks into the next) and reads the result back as the last JSON line of the worker's stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def run_worker_process(
    script: str,
    case: dict,
    timeout: float | None,
    env: dict[str, str] | None = None,
    launcher: list[str] | None = None,
) -> dict:
    """Run `script --_worker <case>` in a fresh interpreter (or under `launcher`, e.g. torchrun's command line);
    its result, or the case with an "error"."""
    cmd = [*(launcher or [sys.executable]), str(Path(script).resolve()), "--_worker", json.dumps(case)]
    full_env = {**os.environ, "OMP_NUM_THREADS": str(case["threads"]), "TOKENIZERS_PARALLELISM": "false"}
    full_env.update(env or {})
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, text=True, env=full_env, timeout=timeout, cwd=REPO_ROOT
        )
    except subprocess.TimeoutExpired:
        return {**case, "error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        killed = " (killed: out of memory?)" if proc.returncode in (-9, 137) else ""
        return {**case, "error": f"exit code {proc.returncode}{killed}"}
    result = json.loads(lines[-1])
    if "error" not in result:
        result["case_wall_s"] = wall
    return result


def rss_kib() -> int:
    """This process's resident set size now (KiB, from /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def reset_peak_rss() -> bool:
    """Reset the RSS high-water mark (VmHWM, and with it ru_maxrss) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def maxrss_kib() -> int:
    """Peak resident set size since the start or the last `reset_peak_rss()` (KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def malloc_trim() -> None:
    """Give freed heap memory back to the system (glibc), so the next baseline is not inflated."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def library_versions() -> dict:
    """torch / transformers / trl versions and CUDA availability, read in a child process (no CUDA init here); a
    library that is not installed (TRL on a GPU image, say) is reported as ``"not installed"``."""
    code = (
        "import importlib.metadata as m, json, torch\n"
        "def v(name):\n"
        "    try:\n"
        "        return m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        return 'not installed'\n"
        "print(json.dumps({'torch': torch.__version__, 'transformers': v('transformers'), 'trl': v('trl'), "
        "'cuda': torch.cuda.is_available()}))"
    )
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_outputs(out_dir: str, stem: str, text: str, meta: dict, results: list[dict]) -> Path:
    """The report as `<stem>.md` and the raw results as `<stem>.json` in `out_dir`; returns the stem's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    return out / stem
