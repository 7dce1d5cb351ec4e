#!/usr/bin/env python
"""`make gpu-kit`: the wheels a lent GPU machine's image lacks, for `tools/gpu_check.sh` (docs/benchmarks.md).

The image has Python 3.12 (x86-64) with torch 2.11 + CUDA 13, Triton 3.6, transformers 5.17, accelerate, peft and
pyarrow, and no network. The kit is what the GPU check needs beyond that: this project's wheel (built here), TRL,
`datasets`, Liger-Kernel, Cut Cross Entropy, pytest, and every dependency of theirs the image does not hold.

The set is computed, not listed by hand: pip resolves (metadata only, `--dry-run --report`) once what the image has
and once the image plus the kit's requirements, for the image's platform; the kit is the difference (a package both
hold at different versions is carried too: it shadows the image's). torch and triton resolve to local stub wheels
(`<version>+image`, no dependencies) so that no CUDA wheel is ever looked at. Then `pip download --no-deps` fetches
each kit wheel at its resolved version (`--only-binary :all:`), and the size check fails unless the wheels plus the
working tree stay under `--limit-mib` (the machine carries at most 64 MiB). Last, the optional sets of the `axolotl`
and `lm_eval` steps (tools/gpu_kit_extras.py), carried where they fit, kit.json saying what does not (`--no-extras`:
without them).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if (
    str(REPO_ROOT / "tools") not in sys.path
):  # gpu_kit_extras beside this file, also when loaded under another name
    sys.path.insert(0, str(REPO_ROOT / "tools"))
DEFAULT_DIR = REPO_ROOT / "build" / "gpu-kit"
# What the GPU image holds: exact versions where known; the rest resolve to their newest release.
IMAGE_PINS = {"torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0"}
IMAGE_OTHERS = ("accelerate", "peft", "pyarrow")
# What the GPU check needs beyond the image (our own wheel is added with --no-deps: it asks for torch >= 2.13).
KIT_REQUIREMENTS = ("trl", "datasets", "liger-kernel", "cut-cross-entropy", "pytest", "pytest-timeout")
# Kept as written (fmt: skip): flags with their values, as pip reads them.
PLATFORM_ARGS = (
    "--only-binary", ":all:", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
    "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
)  # fmt: skip
# torch's own dependencies, which the image holds (the stubs declare them, without the CUDA ones).
STUB_REQUIRES = {
    "torch": ("filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec", "setuptools")
}
NEVER_CARRIED = ("torch", "triton")
# Carried even where the image may hold them: pure Python, and `datasets` needs a newer hub client than an image of
# transformers 5.17's time may have (its version there is not known here).
ALWAYS_CARRIED = ("huggingface-hub",)  # nor any nvidia-* / cuda-* package
CARRY_LIMIT_MIB = 64
DEFAULT_LIMIT_MIB = 48.0  # "well under" the carry limit


def log(message: str) -> None:
    print(f"[gpu-kit] {message}", file=sys.stderr, flush=True)


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def write_wheel(
    out_dir: Path,
    name: str,
    version: str,
    files: dict[str, str] | None = None,
    requires: tuple[str, ...] = (),
) -> Path:
    """A minimal valid wheel (py3-none-any) holding `files` (path -> text) with dependencies `requires`."""
    dist = f"{name.replace('-', '_')}-{version}"
    contents = dict(files or {})
    contents[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {req}\n" for req in requires)
    )
    contents[f"{dist}.dist-info/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: gpu_kit\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    contents[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in contents.items():
            zf.writestr(path, text)
    return wheel


def resolve(requirements: list[str], stubs: Path, work: Path, tag: str) -> dict[str, str]:
    """{canonical name: version} pip installs for `requirements` on the image's platform (metadata only)."""
    report = work / f"resolve-{tag}.json"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--dry-run",
        "--ignore-installed",
        "--report",
        str(report),
        "--find-links",
        str(stubs),
        "--target",
        str(work / "unused"),
        *PLATFORM_ARGS,
        *requirements,
    ]
    subprocess.run(cmd, check=True)
    install = json.loads(report.read_text())["install"]
    return {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in install}


def kit_plan(image: dict[str, str], full: dict[str, str]) -> dict[str, str]:
    """The packages to carry: those the image lacks or holds at another version, never torch / triton / CUDA."""
    plan = {}
    for name, version in sorted(full.items()):
        if name in NEVER_CARRIED or name.startswith(("nvidia-", "cuda-")) or "+image" in version:
            continue
        if image.get(name) != version or name in ALWAYS_CARRIED:
            plan[name] = version
    return plan


def tree_bytes(root: Path) -> int:
    """Bytes of the working tree as carried: tracked files plus untracked files git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    return sum((root / p).stat().st_size for p in out.decode().split("\0") if p and (root / p).is_file())


def size_check(wheels: Path, root: Path, limit_mib: float) -> tuple[bool, str]:
    kit = sum(p.stat().st_size for p in wheels.glob("*.whl")) / 2**20
    tree = tree_bytes(root) / 2**20
    total = kit + tree
    verdict = "fits" if total <= limit_mib else "TOO BIG"
    line = (
        f"gpu-kit size: wheels {kit:.1f} MiB + working tree {tree:.1f} MiB = {total:.1f} MiB; "
        f"limit {limit_mib:.0f} MiB (carry limit {CARRY_LIMIT_MIB} MiB): {verdict}"
    )
    return total <= limit_mib, line


def build_own_wheel(wheels: Path) -> Path:
    for old in wheels.glob("distmatch-*.whl"):
        old.unlink()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(wheels),
        ".",
    ]
    subprocess.run(cmd, cwd=REPO_ROOT, check=True)
    return next(wheels.glob("distmatch-*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help="kit folder (wheels/ and kit.json inside)"
    )
    parser.add_argument("--limit-mib", type=float, default=DEFAULT_LIMIT_MIB)
    parser.add_argument("--check-only", action="store_true", help="only the size check of an existing kit")
    parser.add_argument(
        "--no-extras",
        action="store_true",
        help="without the Axolotl and lm-eval sets (tools/gpu_kit_extras.py: traced by a CPU dry run, minutes)",
    )
    args = parser.parse_args(argv)
    wheels, work = args.dir / "wheels", args.dir / "work"
    if not args.check_only:
        wheels.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        stubs = work / "stubs"
        for name, version in IMAGE_PINS.items():
            if name in NEVER_CARRIED:
                write_wheel(stubs, name, f"{version}+image", requires=STUB_REQUIRES.get(name, ()))
        image_reqs = [f"{name}=={version}" for name, version in IMAGE_PINS.items()] + list(IMAGE_OTHERS)
        log("resolving the image's packages")
        image = resolve(image_reqs, stubs, work, "image")
        log("resolving the image plus the kit")
        full = resolve(image_reqs + list(KIT_REQUIREMENTS), stubs, work, "full")
        plan = kit_plan(image, full)
        log(f"{len(plan)} wheels to carry: " + ", ".join(f"{n}=={v}" for n, v in plan.items()))
        keep = set()
        for name, version in plan.items():
            have = [
                p
                for p in wheels.glob("*.whl")
                if canonical(p.name.split("-")[0]) == name and p.name.split("-")[1] == version
            ]
            if not have:
                cmd = [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    *PLATFORM_ARGS,
                    "-d",
                    str(wheels),
                    f"{name}=={version}",
                ]
                subprocess.run(cmd, check=True)
                have = [
                    p
                    for p in wheels.glob("*.whl")
                    if canonical(p.name.split("-")[0]) == name and p.name.split("-")[1] == version
                ]
            keep.update(have)
        own = build_own_wheel(wheels)
        keep.add(own)
        for stale in set(wheels.glob("*.whl")) - keep:
            stale.unlink()
        manifest = {
            "image": image,
            "kit": plan,
            "own_wheel": own.name,
            "wheels": sorted(p.name for p in keep),
        }
        if not args.no_extras:
            from gpu_kit_extras import add_extras

            tree = tree_bytes(REPO_ROOT) / 2**20
            manifest["extras"] = add_extras(args.dir, wheels, manifest, args.limit_mib, tree)
            manifest["wheels"] = sorted(p.name for p in wheels.glob("*.whl"))
        (args.dir / "kit.json").write_text(json.dumps(manifest, indent=1) + "\n")
    ok, line = size_check(wheels, REPO_ROOT, args.limit_mib)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
