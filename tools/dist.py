"""`make dist`: build the release (wheel + sdist), check it, install the wheel into a clean venv and smoke-test it.

Steps, each printed with its time; the first failure stops the run with one line saying what is wrong (exit 1):

1. build: ``python -m build`` (isolated, as a release build is) from a copy of the files the release is made of,
   so the working tree gets no ``build/`` or ``*.egg-info``; the wheel and sdist land in ``--outdir``;
2. ``twine check`` of both (metadata, README rendering);
3. the wheel's file list (:func:`wheel_problems`): the activation hooks' ``.pth`` files at its root with their one
   line, listed in RECORD; the packages and each family's task YAMLs, templates and README; no tests, examples, benchmarks or tools; the entry
   points (console scripts, ``axolotl.plugins``, ``lm_eval.tasks``); the version of ``distmatch/__init__.py``; every
   extra of pyproject.toml; and that the sdist holds every file the wheel ships (:func:`sdist_problems`);
4. a clean venv (no access to any other venv's packages): ``--torch`` first, then ``<wheel>[eval]`` with its
   dependencies (``tools/installer.py``: uv, or pip), ``pip check``, and pip's own dry run of ``<wheel>[eval]``
   finding every requirement installed;
5. smoke tests there: ``trl sft --help`` offers ``--loss`` (the ``.pth`` hook of the wheel), lm-eval's
   ``TaskManager`` finds ``distmatch_nlu`` (without lm-eval's own tasks, so only through the hook), ``distmatch-eval --help`` runs, and the Axolotl plugin's import without Axolotl names
   the ``axolotl`` extra;
6. with ``--axolotl-venv``: a second venv holding only our wheel (``--no-deps``) that sees that venv's packages
   through a plain path line (its ``.pth`` files, among them the editable distmatch, stay unprocessed): Axolotl's
   ``prepare_plugins`` for a config with ``loss:`` and no ``plugins:`` registers the plugin of our wheel, and the
   ``axolotl.plugins`` entry point of our wheel loads it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from distmatch_hooks.pth import PTH_FILES  # noqa: E402  (the hooks' own list, as setup.py uses it)

#: What the release is made of (besides the packages pyproject.toml lists).
RELEASE_FILES = ["pyproject.toml", "setup.py", "README.md", "CHANGELOG.md", "MANIFEST.in"]
#: Top-level names a wheel must not ship.
NOT_SHIPPED = ("tests/", "examples/", "benchmarks/", "tools/", "docs/")
#: (group, name = value) lines the wheel's entry_points.txt must hold.
ENTRY_POINTS = {
    "console_scripts": ["distmatch-trl = trl_ext.cli:main", "distmatch-eval = eval_tasks.cli:main"],
    "axolotl.plugins": ["distmatch = axolotl_distmatch:DistMatchPlugin"],
    "lm_eval.tasks": ["distmatch = eval_tasks"],
}


class DistError(Exception):
    """A failed check: its message is the one line printed."""


def version() -> str:
    match = re.search(r'^__version__ = "([^"]+)"', (REPO / "distmatch" / "__init__.py").read_text(), re.M)
    if not match:
        raise DistError('distmatch/__init__.py has no __version__ = "..." line')
    return match.group(1)


def task_files() -> list[str]:
    """The lm-eval files of every benchmark family (the ``eval_tasks/<family>/`` packages that hold task YAMLs): the
    YAMLs, the ``_*_yaml`` templates they include and the family's README.md, as wheel paths."""
    root = REPO / "eval_tasks"
    families = {p.parent for p in root.rglob("*.yaml") if "__pycache__" not in p.parts}
    files = [p for family in families for p in family.iterdir() if p.is_file()]
    shipped = [p for p in files if p.suffix == ".yaml" or p.name.endswith("_yaml") or p.name == "README.md"]
    return sorted(p.relative_to(REPO).as_posix() for p in shipped)


def packages() -> list[str]:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return sorted({name.split(".")[0] for name in setuptools["packages"]["find"]["include"]})


def extras() -> list[str]:
    return sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def run(argv: list[str | Path], timeout: float = 900, **kwargs: object) -> str:
    """Run a command; on failure raise DistError with its last output lines."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise DistError(f"`{' '.join(str(a) for a in argv)}` failed (exit {done.returncode}):\n{tail}")
    return done.stdout + done.stderr


def copy_sources(target: Path) -> None:
    for name in [*RELEASE_FILES, *packages()]:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def build(work: Path, outdir: Path) -> tuple[Path, Path]:
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    copy_sources(src)
    shutil.rmtree(outdir, ignore_errors=True)
    run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", outdir, src])
    wheels, sdists = list(outdir.glob("distmatch-*.whl")), list(outdir.glob("distmatch-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise DistError(f"expected one wheel and one sdist in {outdir}, found {wheels + sdists}")
    return wheels[0], sdists[0]


def wheel_problems(wheel: Path, expected_version: str) -> list[str]:
    """What is wrong with the wheel's file list, entry points and metadata (empty: nothing)."""
    problems = []
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = f"distmatch-{expected_version}.dist-info/"
        if f"{dist_info}METADATA" not in names:
            return [f"no {dist_info}METADATA: the wheel is not distmatch {expected_version}"]
        record = archive.read(f"{dist_info}RECORD").decode()
        recorded = {row.split(",", 1)[0] for row in record.splitlines()}
        for name, line in PTH_FILES.items():
            if name not in names:
                problems.append(f"{name} is not at the wheel's root")
            elif archive.read(name).decode() != line:
                problems.append(f"{name} holds {archive.read(name).decode()!r}, not {line!r}")
            if name not in recorded:
                problems.append(f"{name} is not listed in RECORD (pip uninstall would leave it)")
        for package in packages():
            if f"{package}/__init__.py" not in names:
                problems.append(f"package {package} is missing")
            if f"{package}/py.typed" not in names and package != "distmatch_hooks":
                problems.append(f"{package}/py.typed is missing")
        if not any(n.startswith("eval_tasks/") and n.endswith(".yaml") for n in names):
            problems.append("no lm-eval task YAML under eval_tasks/")
        problems += [
            f"{name} is missing (an lm-eval task file)" for name in task_files() if name not in names
        ]
        problems += [f"{n} is shipped (not part of the release)" for n in names if n.startswith(NOT_SHIPPED)]
        entry_points = archive.read(f"{dist_info}entry_points.txt").decode()
        sections = _sections(entry_points)
        for group, lines in ENTRY_POINTS.items():
            problems += [
                f"entry point [{group}] {line} is missing"
                for line in lines
                if line not in sections.get(group, [])
            ]
        metadata = archive.read(f"{dist_info}METADATA").decode()
        declared = set(re.findall(r"^Provides-Extra: (\S+)", metadata, re.M))
        problems += [f"extra {extra} is not in METADATA" for extra in extras() if extra not in declared]
    return problems


def _sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif line:
            sections.setdefault(current, []).append(re.sub(r"\s*=\s*", " = ", line))
    return sections


def sdist_problems(sdist: Path, wheel: Path) -> list[str]:
    """Files the wheel ships that the sdist lacks (a build from the sdist would lose them), and release files."""
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz") + "/"
        members = {m.name.removeprefix(top) for m in archive.getmembers()}
    with zipfile.ZipFile(wheel) as archive:
        shipped = [n for n in archive.namelist() if "/" in n and ".dist-info/" not in n]
    problems = [f"{name} is in the wheel but not in the sdist" for name in shipped if name not in members]
    return problems + [f"{name} is not in the sdist" for name in RELEASE_FILES if name not in members]


def make_venv(python: str, root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    run([python, "-m", "venv", root])
    return root / "bin"


def smoke(bin_dir: Path, work: Path, env: dict[str, str]) -> None:
    checks = [
        (
            ["trl", "sft", "--help"],
            "--loss",
            "`trl sft --help` does not offer --loss (the wheel's .pth hook)",
        ),
        # lm-eval's TaskManager without its own ~10k task files (indexing those takes minutes on a loaded CPU): what
        # it finds then comes from include paths alone, here the one the wheel's .pth hook adds.
        (
            ["python", "-c", LM_EVAL_CHECK],
            "found distmatch_nlu",
            "lm-eval's TaskManager does not find distmatch_nlu",
        ),
        (["distmatch-eval", "--help"], "usage:", "`distmatch-eval --help` printed no usage"),
    ]
    for argv, expected, problem in checks:
        out = run([bin_dir / argv[0], *argv[1:]], cwd=work, env=env)
        if expected not in out:
            raise DistError(problem)
        print(
            f"    ok: {'lm-eval TaskManager finds distmatch_nlu' if argv[0] == 'python' else ' '.join(argv)}"
        )
    missing = subprocess.run(
        [bin_dir / "python", "-c", "from axolotl_distmatch import DistMatchPlugin"],
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
    )
    if missing.returncode == 0 or "distmatch[axolotl]" not in missing.stderr:
        raise DistError("the Axolotl plugin without Axolotl installed does not name the axolotl extra")
    print("    ok: from axolotl_distmatch import DistMatchPlugin, without Axolotl, names distmatch[axolotl]")


LM_EVAL_CHECK = """
from lm_eval.tasks import TaskManager
if "distmatch_nlu" in TaskManager(include_defaults=False).all_tasks:
    print("found distmatch_nlu")
"""

AXOLOTL_CHECK = """
import sys
from importlib.metadata import distribution
from axolotl.cli.config import prepare_plugins
from axolotl.integrations.base import PluginManager
from axolotl.utils.dict import DictDefault
import axolotl_distmatch
from axolotl_distmatch.plugin import DistMatchPlugin
assert axolotl_distmatch.__file__.startswith(sys.prefix), axolotl_distmatch.__file__
cfg = DictDefault({"base_model": "tiny", "loss": "gem_ls"})
prepare_plugins(cfg)
assert any(isinstance(p, DistMatchPlugin) for p in PluginManager.get_instance().plugins.values()), cfg.plugins
(ep,) = [e for e in distribution("distmatch").entry_points if e.group == "axolotl.plugins"]
assert ep.load() is DistMatchPlugin
print("plugins:", cfg.plugins)
"""


def axolotl_smoke(python: str, wheel: Path, axolotl_venv: Path, root: Path, env: dict[str, str]) -> None:
    bin_dir = make_venv(python, root)
    run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", wheel], env=env)
    purelib = run(
        [axolotl_venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    ).strip()
    own = run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    # A plain path line: Axolotl's venv's packages become importable, its .pth files stay unprocessed. Named to be
    # read before distmatch_hooks.*.pth.
    Path(own, "_axolotl_venv.pth").write_text(purelib + "\n")
    out = run([bin_dir / "python", "-c", AXOLOTL_CHECK], cwd=root, env=env)
    plugins = [line for line in out.splitlines() if line.startswith("plugins:")]
    print(f"    ok: Axolotl ({axolotl_venv}) registers the wheel's plugin for `loss:` alone ({plugins[-1]})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outdir", type=Path, default=REPO / "dist", help="where the wheel and sdist go")
    parser.add_argument("--work", type=Path, default=REPO / "build" / "dist-check", help="scratch folder")
    parser.add_argument("--python", default="python3.11", help="interpreter of the clean venvs")
    parser.add_argument("--torch", default="torch==2.13.0", help="torch requirement installed first")
    parser.add_argument("--torch-pip-args", default="", help="extra pip arguments for the torch install only")
    parser.add_argument("--axolotl-venv", type=Path, help="an Axolotl venv whose plugin discovery to check")
    parser.add_argument("--build-only", action="store_true", help="steps 1-3 only (no venv)")
    args = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "DISTMATCH_"))}
    env.update(
        HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", AXOLOTL_DO_NOT_TRACK="1"
    )
    env.update(DO_NOT_TRACK="1", HF_HOME=str(args.work / "hf_home"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()

    def step(name: str) -> None:
        print(f"==> dist [{time.monotonic() - start:5.0f}s] {name}", flush=True)

    try:
        step(f"build distmatch {version()} (wheel + sdist) into {args.outdir}")
        wheel, sdist = build(args.work, args.outdir)
        step("twine check")
        run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist])
        step("wheel file list, entry points, metadata; sdist contents")
        problems = wheel_problems(wheel, version()) + sdist_problems(sdist, wheel)
        if problems:
            raise DistError("; ".join(problems))
        if args.build_only:
            step(f"done: {wheel.name} {sdist.name}")
            return 0
        step(f"clean venv: {args.torch}, then {wheel.name}[eval] with its dependencies")
        bin_dir = make_venv(args.python, args.work / "venv")
        install = [sys.executable, REPO / "tools" / "installer.py", bin_dir / "python", "-q"]
        run([*install, args.torch, *shlex.split(args.torch_pip_args)], env=env)
        run([*install, f"{wheel}[eval]"], env=env)
        run([bin_dir / "python", "-m", "pip", "check"], env=env)
        # pip itself finds nothing missing for the wheel's requirements (and every extra's pins hold)
        report = run(
            [
                bin_dir / "python",
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--no-index",
                "--quiet",
                "--report",
                "-",
                f"{wheel}[eval]",
            ],
            env=env,
        )
        missing = [
            i["metadata"]["name"]
            for i in json.loads(report)["install"]
            if i["metadata"]["name"] != "distmatch"
        ]
        if missing:
            raise DistError(f"pip would install more for {wheel.name}[eval]: {', '.join(missing)}")
        step("smoke tests in the clean venv")
        smoke(bin_dir, args.work, env)
        if args.axolotl_venv:
            step(f"Axolotl plugin discovery with the wheel beside {args.axolotl_venv}")
            axolotl_smoke(args.python, wheel, args.axolotl_venv.resolve(), args.work / "venv-axolotl", env)
        step(f"done: {wheel.name} {sdist.name} build, check and install")
    except (DistError, subprocess.TimeoutExpired) as err:
        print(f"==> dist FAILED: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
