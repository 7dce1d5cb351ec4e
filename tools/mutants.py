"""Mutation check: apply small wrong changes to scratch copies of the repository and run the tests that must catch
them.

The changes are data (`tools/mutants/*.toml`, one file per code area; format in tools/mutants/README.md): each names a
file, an exact `old` string that occurs once in it, the wrong `new` string, the virtual environment and the pytest
arguments that must fail with it (only the tests that cover that file), and optionally a `setup` script run after the
change. The tracked files are copied to one temporary directory per parallel job (the working tree is never
modified); a job applies a mutant to its copy, runs pytest with `PYTHONPATH` and the working directory pointing at
that copy, and undoes the change. A mutant is *caught* when pytest fails (exit code 1); exit codes other than 0 and
1 (no tests collected, usage or internal errors, a timeout) are reported as errors, never as caught. Before the
mutants, each distinct test selection runs once unmodified and must pass (otherwise its failures would prove nothing).

    make mutants                                  all mutants in parallel, table and run time at the end, exit 1
                                                  unless all are caught
    python tools/mutants.py --list                the ids, files and tests
    python tools/mutants.py --only fused_logits_rounded_to_half emo_no_target_exclusion
    python tools/mutants.py --since main          only the mutants of files changed since a git revision
    python tools/mutants.py --jobs 1              one at a time (default: one job per CPU core, each test process
                                                  with one compute thread)
    python tools/mutants.py --check               only verify every `old` string occurs exactly once
"""

from __future__ import annotations

import argparse
import os
import queue
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
MUTANTS_DIR = Path(__file__).resolve().parent / "mutants"
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
    #: The outside audit that planted it (e.g. "training round 2"); empty for the authors' own. Provenance only.
    audit: str = ""


def load_mutants(path: Path = MUTANTS_DIR) -> list[Mutant]:
    """The mutant list of `path` (a `.toml` file, or a folder: every `*.toml` in it, by name); raises ValueError
    naming the entry when a field is missing or wrong."""
    files = sorted(path.glob("*.toml")) if path.is_dir() else [path]
    entries = [(f, e) for f in files for e in tomllib.loads(f.read_text(encoding="utf-8")).get("mutant", [])]
    mutants = []
    for path, entry in entries:
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


def problems(mutants: list[Mutant], root: Path | None = None) -> list[str]:
    """Why a mutant cannot be applied as listed (its file is gone, its `old` string is missing or ambiguous)."""
    root = root or REPO
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


def venv_root() -> Path:
    """Where the venvs are: this checkout, or for a `git worktree` without its own, the main checkout's."""
    if (REPO / ".venv" / "bin" / "python").exists():
        return REPO
    common = subprocess.run(
        ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Path(common).parent if common else REPO


def venv_python(venv: str) -> Path:
    return venv_root() / venv / "bin" / "python"


#: Extra environment of every test process (one compute thread each when jobs run side by side).
_JOB_ENV: dict[str, str] = {}


def run_in_copy(
    copy: Path, venv: str, args: list[str], log: Path, *, timeout: int, append: bool = False
) -> int:
    """`venv`'s python with `args` in the scratch copy (which is imported, offline), output to `log`; 124 on timeout."""
    command = [str(venv_python(venv)), *args]
    env = dict(os.environ, **OFFLINE_ENV, **_JOB_ENV, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
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


def split_selection(tests: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """(the other pytest arguments, the `-k` expression or None) of a mutant's `tests`."""
    rest: list[str] = []
    keyword = None
    args = iter(tests)
    for arg in args:
        if arg == "-k":
            keyword = next(args)
        else:
            rest.append(arg)
    return tuple(rest), keyword


def baseline_runs(selections: list[tuple[str, tuple[str, ...]]]) -> list[tuple[str, tuple[str, ...]]]:
    """One unmodified run per venv and set of test files: the selections that differ only in `-k` run together
    (`-k "(a) or (b)"`, or without `-k` when one of them has none), so pytest starts once per file set."""
    groups: dict[tuple[str, tuple[str, ...]], list[str | None]] = {}
    for venv, tests in selections:
        rest, keyword = split_selection(tests)
        groups.setdefault((venv, rest), []).append(keyword)
    runs = []
    for (venv, rest), keywords in sorted(groups.items()):
        if None in keywords:
            runs.append((venv, rest))
        else:
            unique = sorted(set(k for k in keywords if k is not None))
            expression = unique[0] if len(unique) == 1 else " or ".join(f"({k})" for k in unique)
            runs.append((venv, (*rest, "-k", expression)))
    return runs


def verdict(rc: int) -> str:
    return {0: "SURVIVED", 1: "caught"}.get(rc, f"ERROR (pytest exit {rc})")


def changed_files(since: str) -> set[str]:
    """Files changed between `since` and the working tree (committed, staged, unstaged and untracked)."""
    diff = subprocess.run(
        ["git", "diff", "--name-only", since], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.split()
    untracked = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return set(diff) | set(untracked)


def run_mutant(m: Mutant, copy: Path, logs: Path) -> tuple[str, float]:
    """Apply `m` to `copy`, run its tests, undo it: (verdict, seconds)."""
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
        raise RuntimeError(f"{m.id}: undoing the setup failed (see {setup_log})")
    return verdict(rc), secs


def in_parallel(work: list, copies: list[Path], do) -> None:
    """Call `do(item, copy)` for every item of `work`, one thread per scratch copy, each copy used by one thread."""
    todo: queue.Queue = queue.Queue()
    for item in work:
        todo.put(item)
    errors: list[BaseException] = []

    def worker(copy: Path) -> None:
        while not errors:
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                do(item, copy)
            except BaseException as err:  # re-raised in the main thread
                errors.append(err)

    threads = [threading.Thread(target=worker, args=(c,)) for c in copies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", metavar="ID", help="run only these mutants")
    parser.add_argument(
        "--since", metavar="REV", help="run only the mutants of files changed since this git revision"
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--check", action="store_true", help="only check that every `old` string occurs once")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="mutants run side by side (default: CPU cores)"
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the unmodified runs of each selection"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory and logs")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")

    mutants = load_mutants(MUTANTS_DIR)
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutants})
        if unknown:
            parser.error(f"unknown mutant ids {unknown}; valid: {', '.join(m.id for m in mutants)}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.since:
        changed = changed_files(args.since)
        mutants = [m for m in mutants if m.file in changed]
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
    missing = sorted({m.venv for m in mutants if not venv_python(m.venv).exists()})
    if missing:
        print(f"missing virtual environments {missing}: run `make venvs` first", file=sys.stderr)
        return 2
    if not mutants:
        print("no mutant selected")
        return 0

    jobs = min(args.jobs, len(mutants))
    if jobs > 1:
        _JOB_ENV.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="distmatch-mutants-"))
    logs = scratch / "logs"
    logs.mkdir()
    copies = [scratch / f"repo{j}" for j in range(jobs)]
    for copy in copies:
        scratch_copy(REPO, copy)
    print(f"{len(mutants)} mutants, {jobs} jobs; scratch copies and logs: {scratch}", flush=True)
    results: dict[str, tuple[str, float]] = {}
    try:
        if not args.no_baseline:
            selections = baseline_runs(sorted({(m.venv, m.tests) for m in mutants}))
            failed: list[str] = []

            def baseline(item: tuple[int, tuple[str, tuple[str, ...]]], copy: Path) -> None:
                i, (venv, tests) = item
                rc, secs = run_tests(copy, venv, tests, 1800, logs / f"baseline-{i}.log")
                print(f"baseline {venv} {' '.join(tests)}: exit {rc} ({secs:.0f} s)", flush=True)
                if rc != 0:
                    failed.append(str(logs / f"baseline-{i}.log"))

            in_parallel(list(enumerate(selections)), copies, baseline)
            if failed:
                print(f"the unmodified tests fail (see {', '.join(failed)}): fix them first", file=sys.stderr)
                args.keep = True
                return 2

        def mutate(m: Mutant, copy: Path) -> None:
            results[m.id] = run_mutant(m, copy, logs)
            print(f"{m.id}: {results[m.id][0]} ({results[m.id][1]:.0f} s)", flush=True)

        try:
            in_parallel(mutants, copies, mutate)
        except RuntimeError:
            args.keep = True
            raise
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print()
    print("| mutant | area | file | result | seconds | what |")
    print("|---|---|---|---|---|---|")
    for m in mutants:
        result, secs = results[m.id]
        print(f"| {m.id} | {m.area} | {m.file} | {result} | {secs:.0f} | {m.what} |")
    caught = sum(1 for result, _ in results.values() if result == "caught")
    minutes = (time.monotonic() - started) / 60
    print(
        f"\n{caught} / {len(results)} caught ({100 * caught / len(results):.0f} %), {minutes:.1f} min with {jobs} jobs"
    )
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
