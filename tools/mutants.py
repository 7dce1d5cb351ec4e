"""Mutation check: apply small wrong changes to a scratch copy of the repository and run the tests that must catch
them.

The changes are data (`tools/mutants.toml`): each names a file, an exact `old` string that occurs once in it, the
wrong `new` string, the virtual environment and the pytest arguments that must fail with it (and optionally a
`setup` script run after the change, e.g. the task-config generator when the change is in it). For every mutant the
tracked files are copied to a temporary directory (the working tree is never modified), the change is applied there
and pytest runs with `PYTHONPATH` and the working directory pointing at that copy. A mutant is *caught* when pytest
fails (exit code 1); exit codes other than 0 and 1 (no tests collected, usage or internal errors, a timeout) are
reported as errors, never as caught. Before the mutants, each distinct test selection runs once unmodified and must
pass (otherwise its failures would prove nothing).

    make mutants                                  all mutants, table at the end, exit 1 unless all are caught
    python tools/mutants.py --list                the ids, files and tests
    python tools/mutants.py --only fused_logits_rounded_to_half emo_no_target_exclusion
    python tools/mutants.py --check               only verify every `old` string occurs exactly once
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
MUTANTS_FILE = Path(__file__).resolve().with_suffix(".toml")
VENVS = (".venv", ".venv-axolotl", ".venv-opencompass")
OFFLINE_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "AXOLOTL_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass(frozen=True)
class Mutant:
    id: str
    area: str
    what: str
    file: str
    old: str
    new: str
    venv: str
    tests: tuple[str, ...]
    timeout: int = 900
    #: Python arguments run in the copy after the change and before the tests (e.g. a generator whose output the
    #: tests read), and again after the change is undone.
    setup: tuple[str, ...] = ()


def load_mutants(path: Path = MUTANTS_FILE) -> list[Mutant]:
    """The mutant list; raises ValueError naming the entry when a field is missing or wrong."""
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    mutants = []
    for entry in raw.get("mutant", []):
        try:
            mutant = Mutant(
                **{**entry, "tests": tuple(entry["tests"]), "setup": tuple(entry.get("setup", ()))}
            )
        except (TypeError, KeyError) as err:
            raise ValueError(f"{path}: bad mutant entry {entry.get('id', entry)!r}: {err}") from err
        if mutant.venv not in VENVS:
            raise ValueError(
                f"{path}: mutant {mutant.id!r}: venv must be one of {VENVS}, got {mutant.venv!r}"
            )
        if mutant.old == mutant.new or not mutant.tests:
            raise ValueError(
                f"{path}: mutant {mutant.id!r}: `new` must differ from `old`, `tests` must be given"
            )
        mutants.append(mutant)
    ids = [m.id for m in mutants]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{path}: duplicate mutant ids {duplicates}")
    return mutants


def problems(mutants: list[Mutant], root: Path = REPO) -> list[str]:
    """Why a mutant cannot be applied as listed (its file is gone, its `old` string is missing or ambiguous)."""
    found = []
    for m in mutants:
        target = root / m.file
        if not target.is_file():
            found.append(f"{m.id}: {m.file} does not exist")
            continue
        count = target.read_text(encoding="utf-8").count(m.old)
        if count != 1:
            found.append(f"{m.id}: `old` occurs {count} times in {m.file} (must be exactly once)")
        if m.setup and not (root / m.setup[0]).is_file():
            found.append(f"{m.id}: setup script {m.setup[0]} does not exist")
        for arg in m.tests:
            test_path = arg.split("::")[0]
            if test_path.startswith("tests/") and not (root / test_path).exists():
                found.append(f"{m.id}: test path {test_path} does not exist")
    return found


def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    return [p for p in out.decode().split("\0") if p]


def scratch_copy(root: Path, dest: Path) -> None:
    """The tracked and untracked, not ignored files as they are in the working tree (uncommitted edits included)."""
    for rel in tracked_files(root):
        src = root / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_in_copy(
    copy: Path, venv: str, args: list[str], log: Path, *, timeout: int, append: bool = False
) -> int:
    """`venv`'s python with `args` in the scratch copy (which is imported, offline), output to `log`; 124 on timeout."""
    command = [str(REPO / venv / "bin" / "python"), *args]
    env = dict(os.environ, **OFFLINE_ENV, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    with log.open("a" if append else "w") as out:
        out.write("$ " + shlex.join(command) + "\n")
        out.flush()
        try:
            return subprocess.run(
                command, cwd=copy, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            return 124


def run_tests(copy: Path, venv: str, tests: tuple[str, ...], timeout: int, log: Path) -> tuple[int, float]:
    start = time.monotonic()
    rc = run_in_copy(
        copy, venv, ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests], log, timeout=timeout
    )
    return rc, time.monotonic() - start


def run_setup(copy: Path, venv: str, setup: tuple[str, ...], log: Path) -> int:
    return run_in_copy(copy, venv, list(setup), log, timeout=600, append=True)


def verdict(rc: int) -> str:
    return {0: "SURVIVED", 1: "caught"}.get(rc, f"ERROR (pytest exit {rc})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", metavar="ID", help="run only these mutants")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--check", action="store_true", help="only check that every `old` string occurs once")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the unmodified runs of each selection"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory and logs")
    args = parser.parse_args(argv)

    mutants = load_mutants()
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutants})
        if unknown:
            parser.error(f"unknown mutant ids {unknown}; valid: {', '.join(m.id for m in mutants)}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id:34} {m.area:12} {m.file:36} {m.venv:14} {' '.join(m.tests)}")
        return 0
    found = problems(mutants)
    if found:
        print("The mutant list no longer matches the code:\n  " + "\n  ".join(found), file=sys.stderr)
        return 2
    if args.check:
        print(f"{len(mutants)} mutants: every `old` string occurs exactly once.")
        return 0
    missing = sorted({m.venv for m in mutants if not (REPO / m.venv / "bin" / "python").exists()})
    if missing:
        print(f"missing virtual environments {missing}: run `make venvs` first", file=sys.stderr)
        return 2

    scratch = Path(tempfile.mkdtemp(prefix="distmatch-mutants-"))
    copy, logs = scratch / "repo", scratch / "logs"
    logs.mkdir()
    scratch_copy(REPO, copy)
    print(f"scratch copy: {copy}  logs: {logs}", flush=True)
    rows: list[tuple[str, str, str, str]] = []
    ok = True
    try:
        if not args.no_baseline:
            for i, (venv, tests) in enumerate(sorted({(m.venv, m.tests) for m in mutants})):
                rc, secs = run_tests(copy, venv, tests, 1800, logs / f"baseline-{i}.log")
                print(f"baseline {venv} {' '.join(tests)}: exit {rc} ({secs:.0f} s)", flush=True)
                if rc != 0:
                    print(
                        f"the unmodified tests fail (see {logs / f'baseline-{i}.log'}): fix them first",
                        file=sys.stderr,
                    )
                    args.keep = True
                    return 2
        for m in mutants:
            target = copy / m.file
            original = target.read_text(encoding="utf-8")
            target.write_text(original.replace(m.old, m.new, 1), encoding="utf-8")
            setup_log = logs / f"{m.id}.setup.log"
            try:
                if m.setup and run_setup(copy, m.venv, m.setup, setup_log) != 0:
                    rc, secs = 3, 0.0  # reported as an error (see the setup log), never as caught
                else:
                    rc, secs = run_tests(copy, m.venv, m.tests, m.timeout, logs / f"{m.id}.log")
            finally:
                target.write_text(original, encoding="utf-8")
            if m.setup and run_setup(copy, m.venv, m.setup, setup_log) != 0:
                args.keep = True
                raise RuntimeError(f"{m.id}: undoing the setup failed (see {setup_log})")
            result = verdict(rc)
            ok &= result == "caught"
            rows.append((m.id, m.area, result, f"{secs:.0f}"))
            print(f"{m.id}: {result} ({secs:.0f} s)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print()
    print("| mutant | area | result | seconds | what |")
    print("|---|---|---|---|---|")
    whats = {m.id: m.what for m in mutants}
    for mid, area, result, secs in rows:
        print(f"| {mid} | {area} | {result} | {secs} | {whats[mid]} |")
    caught = sum(1 for r in rows if r[2] == "caught")
    print(f"\n{caught} / {len(rows)} caught")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
