"""`make gpu-kit`'s optional sets: what the GPU check's `axolotl` and `lm_eval` steps import beyond the image and the
kit, as `--no-deps` wheels, carried only where they fit (docs/benchmarks.md "Axolotl and lm-eval on the GPU").

The set is computed, not listed: the CPU dry run of those steps (`tools/gpu_check.sh --device cpu --steps
train,axolotl,lm_eval --runs gem_ls`) runs with a one-wheel kit whose `.pth` file records, when each process ends,
the distribution of every module it imported (`importlib.metadata.packages_distributions`) and its command line.
A set is the distributions its step's processes imported (`axolotl train` in `.venv-axolotl`, `lm_eval run` in
`.venv`), at the versions they imported, less what the image holds, what the kit carries, torch, triton, CUDA and
this project. Each is downloaded for the image's platform (`--no-deps`, `--only-binary :all:`) and carried, in
order, while the kit, the working tree and the sets stay under the size limit; a set that does not fit stays out,
and `kit.json` says what it would take, with each wheel's size (the step then reads `not run` with that line).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The optional sets, in the order they are carried: each set's name is the step whose processes import it, and
#: the word that marks those processes' command lines.
EXTRAS = {"axolotl": "axolotl.cli.main", "lm_eval": "lm_eval"}
OWN = ("distmatch", "gpu-kit-trace")
TRACER = """\
# Written by tools/gpu_kit_extras.py: when this process ends, the distributions of the modules it imported.
import atexit, json, os, sys


def _record():
    try:
        import importlib.metadata as m
        owners = m.packages_distributions()
        found = {}
        for name in {module.split('.')[0] for module in list(sys.modules)}:
            for dist in owners.get(name, ()):
                try:
                    found[dist] = m.version(dist)
                except Exception:
                    pass
        path = os.path.join(os.environ['GPU_KIT_TRACE'], f'{os.getpid()}.json')
        with open(path, 'w') as f:
            json.dump({'argv': list(getattr(sys, 'orig_argv', sys.argv)), 'dists': found}, f)
    except Exception:
        pass


if os.environ.get('GPU_KIT_TRACE'):
    atexit.register(_record)
"""


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def trace(work: Path, write_wheel: Any) -> dict[str, dict[str, str]]:
    """{set: {distribution: version}} the dry run of the sets' steps imported (module docstring)."""
    traces = work / "traces"
    shutil.rmtree(work / "trace", ignore_errors=True)
    shutil.rmtree(traces, ignore_errors=True)
    traces.mkdir(parents=True)
    kit = work / "trace" / "kit"
    write_wheel(
        kit,
        "gpu-kit-trace",
        "1.0",
        {"gpu_kit_trace.py": TRACER, "gpu_kit_trace.pth": "import gpu_kit_trace\n"},
    )
    folders = {name: work / "trace" / name for name in ("out", "scratch", "site")}
    steps = ",".join(["train", *EXTRAS])
    cmd = [str(REPO_ROOT / "tools" / "gpu_check.sh"), "--device", "cpu", "--steps", steps, "--runs", "gem_ls"]
    cmd += ["--kit", str(kit), *(f"--{name}={path}" for name, path in folders.items())]
    env = {**os.environ, "GPU_KIT_TRACE": str(traces)}
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"gpu-kit: the dry run of {steps} failed (exit {done.returncode}): no set is traced")
    found: dict[str, dict[str, str]] = {name: {} for name in EXTRAS}
    for path in sorted(traces.glob("*.json")):
        record = json.loads(path.read_text())
        words = " ".join(record["argv"])
        for name, mark in EXTRAS.items():
            if mark in words:
                found[name].update({canonical(d): v for d, v in record["dists"].items()})
    return found


def extras_plan(dists: dict[str, str], have: set[str], never: tuple[str, ...]) -> dict[str, str]:
    """A set's distributions to carry: those traced, less those the image holds or the kit and the sets carried
    before it carry (`have`, canonical names), `never`, CUDA's, this project's and the tracer's."""
    return {
        dist: version
        for dist, version in sorted(dists.items())
        if dist not in have
        and dist not in never
        and dist not in OWN
        and not dist.startswith(("nvidia-", "cuda-"))
    }


def mib(path: Path) -> float:
    return path.stat().st_size / 2**20


def fit_line(sizes: dict[str, float], left: float, limit: float) -> tuple[bool, str]:
    """Whether a set of wheels (file -> MiB) fits in `left` MiB, and the kit's line for it: carried, or what does
    not fit, largest wheels first."""
    total = sum(sizes.values())
    if total <= left:
        return True, f"carried: {len(sizes)} wheels, {total:.1f} MiB"
    largest = ", ".join(f"{w} {s:.1f}" for w, s in sorted(sizes.items(), key=lambda kv: -kv[1])[:6])
    return False, (
        f"does not fit: {len(sizes)} wheels, {total:.1f} MiB (largest, MiB: {largest}), {max(left, 0):.1f} MiB left "
        f"under the {limit:.0f} MiB limit"
    )


def add_extras(
    kit_dir: Path, wheels: Path, manifest: dict[str, Any], limit_mib: float, tree_mib: float
) -> dict[str, Any]:
    """Trace, download and fit each set (module docstring); a set that fits is copied into `wheels`. Returns
    kit.json's `extras`: per set its wheels with sizes, MiB, whether carried, its line, and what had no wheel."""
    from gpu_kit import PLATFORM_ARGS, write_wheel

    work = kit_dir / "work" / "extras"
    traced = trace(work, write_wheel)
    never = ("torch", "triton", "pip", "setuptools", "wheel")
    have = {canonical(n) for n in (*manifest["image"], *manifest["kit"])}
    left = limit_mib - tree_mib - sum(mib(w) for w in wheels.glob("*.whl"))
    extras: dict[str, Any] = {}
    for name, imported in traced.items():
        dists = extras_plan(imported, have, never)
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        missing = []
        for dist, version in dists.items():
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                *PLATFORM_ARGS,
                "-d",
                str(folder),
            ]
            if subprocess.run([*cmd, f"{dist}=={version}"], capture_output=True).returncode != 0:
                missing.append(f"{dist}=={version}")
        files = [w for w in folder.glob("*.whl") if canonical(w.name.split("-")[0]) in dists]
        sizes = {w.name: round(mib(w), 2) for w in files}
        carried, line = fit_line(sizes, left, limit_mib)
        if not imported:  # its step did not run in the dry run (no .venv-axolotl, say): nothing is known
            carried, line = (
                False,
                f"not traced: the dry run's {name} step imported nothing (is it installed here?)",
            )
        if missing:
            line += f"; no wheel for the image's platform: {', '.join(missing)}"
            carried = False
        if carried:
            for w in files:
                shutil.copy2(w, wheels / w.name)
            left -= sum(sizes.values())
            have |= set(dists)
        extras[name] = {
            "dists": dists,
            "wheels": sizes,
            "mib": round(sum(sizes.values()), 1),
            "carried": carried,
            "missing": missing,
            "line": line,
        }
        print(f"gpu-kit: {name}: {line}", file=sys.stderr, flush=True)
    return extras
