"""`make mutation-score`: mutmut 3 over the modules whose output users trust, one module at a time.

Where `make mutants` (tools/mutants.py) applies hand-written wrong changes, this runs a mutation tool: mutmut 3
generates every mutant of a module (operators, constants, comparisons, arguments, return values) and runs the tests
that cover that module against each. The modules and their covering tests are listed in tools/mutation_score.toml;
the survivors triaged as equivalent (no observable change; each with its reason) in tools/mutation_equivalent.toml.

For each module: a scratch copy of the working tree (tracked and untracked-not-ignored files) goes to
build/mutation-score/<name>/, a `[tool.mutmut]` section naming the one file and its tests is appended to the copy's
pyproject.toml, and `mutmut run` runs there (mutmut writes its mutated copy into that folder's `mutants/`; nothing is
written into the checkout). A module that runs past its timeout is stopped and reported with what was checked.

Prints, and writes to build/mutation-score/report.md, a table per module: mutants, killed, survived, timed out,
equivalent, not checked, the score (killed + timed out over the mutants that are not equivalent) and the wall time;
then every non-equivalent survivor with its diff (build/mutation-score/<name>/survivors.txt), to triage.

    python tools/mutation_score.py                 # every module
    python tools/mutation_score.py --only math_answers pass_at_k
    python tools/mutation_score.py --report-only   # re-read the last run's results
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Project:
    """The git working tree whose modules are scored (this repository, or `--root`) and the tool's files in it."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "tools" / "mutation_score.toml"

    @property
    def equivalent(self) -> Path:
        return self.root / "tools" / "mutation_equivalent.toml"

    @property
    def scratch(self) -> Path:
        return self.root / "build" / "mutation-score"


# mutmut's exit-code meaning (mutmut/stats.py status_by_exit_code), folded into the table's columns
KILLED = {1, 3}
SURVIVED = {0}
TIMED_OUT = {36, -24, 24, 152, 255}
NO_TESTS = {5, 33}


def load_config(project: Project) -> tuple[dict, list[dict]]:
    data = tomllib.loads(project.config.read_text())
    return data.get("defaults", {}), data["module"]


def load_equivalent(project: Project) -> dict[str, dict]:
    if not project.equivalent.exists():
        return {}
    return {e["mutant"]: e for e in tomllib.loads(project.equivalent.read_text()).get("equivalent", [])}


def working_tree_files(project: Project) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=project.root,
        check=True,
        capture_output=True,
    ).stdout
    return [p for p in out.decode().split("\0") if p and (project.root / p).is_file()]


def make_copy(project: Project, name: str, module: dict, defaults: dict) -> Path:
    dest = project.scratch / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for rel in working_tree_files(project):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(project.root / rel, target)
    package = module["file"].split("/")[0]
    tops = sorted(
        {p.split("/")[0] for p in os.listdir(dest)} - {package, "mutants", "tests", "pyproject.toml"}
    )
    section = {
        "source_paths": [package],
        "only_mutate": [module["file"]],
        # the other packages come along, so that nothing is imported from the checkout others keep editing
        "also_copy": [t for t in tops if (dest / t).is_dir()],
        "pytest_add_cli_args": ["-p", "no:xdist", "-p", "no:cacheprovider", "-q", "-x"],
        "pytest_add_cli_args_test_selection": list(module["tests"]),
        "timeout_multiplier": float(
            module.get("timeout_multiplier", defaults.get("timeout_multiplier", 10.0))
        ),
        "use_git_change_detection": False,
    }
    lines = ["", "[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in section.items()]
    with open(dest / "pyproject.toml", "a") as f:
        f.write("\n".join(lines) + "\n")
    return dest


def module_python(project: Project, module: dict) -> Path:
    """The interpreter of the venv a module runs in: `venv` (e.g. `.venv-axolotl`, whose Triton runs the kernels
    in its interpreter with `env = {TRITON_INTERPRET = "1"}`), else this one."""
    if "venv" not in module:
        return Path(sys.executable)
    python = project.root / module["venv"] / "bin" / "python"
    if not (python.parent / "mutmut").exists():
        raise SystemExit(
            f"tools/mutation_score.toml: module {module['name']!r} runs in {module['venv']}, which has no mutmut: "
            "`make mutation-score` installs it there"
        )
    return python


def run_module(project: Project, name: str, module: dict, defaults: dict, jobs: int) -> dict:
    dest = make_copy(project, name, module, defaults)
    timeout = int(module.get("timeout", defaults.get("timeout", 900)))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1"
    )
    env.update(module.get("env", {}))
    mutmut = module_python(project, module).parent / "mutmut"
    log = open(dest / "mutmut.log", "w")
    start = time.monotonic()
    proc = subprocess.Popen(
        [str(mutmut), "run", "--max-children", str(jobs)],
        cwd=dest,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stopped = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stopped = True
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.monotonic() - start
    log.close()
    (dest / "wall.json").write_text(json.dumps({"wall_s": wall, "stopped": stopped, "rc": proc.returncode}))
    return collect(project, name, module)


#: Prints {mutant: diff} as JSON for the mutant names in argv, in one process (`mutmut show` is one per mutant).
_DIFFS = """
import json, sys
from mutmut.__main__ import find_mutant, get_diff_for_mutant
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = get_diff_for_mutant(name, path=find_mutant(name).path)
    except Exception as err:  # a name mutmut no longer knows: no diff
        out[name] = f"(no diff: {err!r})"
print(json.dumps(out))
"""


def mutant_diffs(dest: Path, mutants: list[str], python: Path) -> dict[str, str]:
    """mutmut's diff of each mutant, read in the module's scratch copy."""
    if not mutants:
        return {}
    out = subprocess.run(
        [str(python), "-c", _DIFFS, *mutants], cwd=dest, capture_output=True, text=True, check=False
    )
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {m: f"(no diff: {out.stderr[-500:]})" for m in mutants}


def mutmut_failure(log: Path) -> str | None:
    """mutmut's own reason for stopping before the mutants ran (e.g. the clean tests failed, or no test reached the
    module's functions after import: "Unable to force test failures"), else None."""
    if not log.exists():
        return None
    text = log.read_text(errors="replace").replace("\r", "\n")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("FAILED", "Failed to run clean test", "Stopping early")):
            return "mutmut stopped: " + line
    return None


def still_equivalent(diff: str, entry: dict) -> bool:
    """The listed mutant is still the one triaged: its diff adds the line the list names."""
    added = [
        line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")
    ]
    return entry["changed"].strip() in added


def collect(project: Project, name: str, module: dict) -> dict:
    dest = project.scratch / name
    meta = dest / "mutants" / (module["file"] + ".meta")
    wall = json.loads((dest / "wall.json").read_text()) if (dest / "wall.json").exists() else {}
    row = dict(
        name=name,
        file=module["file"],
        mutants=0,
        killed=0,
        survived=0,
        timeout=0,
        equivalent=0,
        unchecked=0,
        wall_s=wall.get("wall_s"),
        stopped=wall.get("stopped"),
        rc=wall.get("rc"),
        survivors=[],
    )
    failure = mutmut_failure(dest / "mutmut.log")
    if not meta.exists() or failure:
        row["error"] = failure or f"no results ({dest / 'mutmut.log'})"
        return row
    equivalent = load_equivalent(project)
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    row["mutants"] = len(codes)
    not_killed = [m for m, code in codes.items() if code in SURVIVED or code in NO_TESTS]
    diffs = mutant_diffs(dest, not_killed, module_python(project, module))
    for mutant, code in sorted(codes.items()):
        if code in KILLED:
            row["killed"] += 1
        elif code in TIMED_OUT:
            row["timeout"] += 1
        elif code is None:
            row["unchecked"] += 1
        elif code in SURVIVED or code in NO_TESTS:
            if mutant in equivalent and still_equivalent(diffs[mutant], equivalent[mutant]):
                row["equivalent"] += 1
            else:
                row["survived"] += 1
                row["survivors"].append(mutant)
        else:  # suspicious / segfault: the tests did not pass cleanly, so the change was seen
            row["killed"] += 1
    judged = row["mutants"] - row["equivalent"] - row["unchecked"]
    row["score"] = 100.0 * (row["killed"] + row["timeout"]) / judged if judged else None
    with open(dest / "survivors.txt", "w") as f:
        for mutant in row["survivors"]:
            f.write(f"### {mutant} (exit {codes[mutant]})\n{diffs[mutant]}\n\n")
    return row


def table(rows: list[dict]) -> str:
    head = "| module | file | mutants | killed | survived | timed out | equivalent | not checked | score | time |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | `{r['file']}` | {r['error']} |||||||")
            continue
        score = f"{r['score']:.1f} %" if r["score"] is not None else "—"
        secs = r["wall_s"]
        t = (
            f"{int(secs // 60)}:{int(secs % 60):02d}" + (" (stopped)" if r["stopped"] else "")
            if secs
            else "—"
        )
        lines.append(
            f"| {r['name']} | `{r['file']}` | {r['mutants']} | {r['killed']} | {r['survived']} | {r['timeout']} "
            f"| {r['equivalent']} | {r['unchecked']} | {score} | {t} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="+", help="module names from tools/mutation_score.toml")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once (mutmut --max-children)")
    parser.add_argument("--report-only", action="store_true", help="re-read the last run's results")
    parser.add_argument(
        "--root",
        default=str(REPO),
        help="the git working tree to score, with its tools/mutation_score.toml (default: this repository)",
    )
    parser.add_argument("--goal", type=float, default=90.0, help="fail when a module scores below this")
    args = parser.parse_args(argv)
    project = Project(Path(args.root).resolve())
    defaults, modules = load_config(project)
    names = [m["name"] for m in modules]
    unknown = set(args.only or []) - set(names)
    if unknown:
        parser.error(f"unknown module(s): {sorted(unknown)}; known: {names}")
    selected = [m for m in modules if not args.only or m["name"] in args.only]
    for module in selected:  # before any work: each module's venv has mutmut
        module_python(project, module)
    rows = []
    for module in selected:
        print(f"==> {module['name']}: {module['file']}", flush=True)
        row = (
            collect(project, module["name"], module)
            if args.report_only
            else run_module(project, module["name"], module, defaults, args.jobs)
        )
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    report = table(rows)
    survivors = [f"- {m}" for r in rows for m in r.get("survivors", [])]
    text = (
        report
        + (
            "\n\nSurvivors (diffs in build/mutation-score/<module>/survivors.txt):\n" + "\n".join(survivors)
            if survivors
            else ""
        )
        + "\n"
    )
    project.scratch.mkdir(parents=True, exist_ok=True)
    (project.scratch / "report.md").write_text(text)
    print("\n" + text)
    low = [r["name"] for r in rows if r.get("score") is None or r["score"] < args.goal]
    if low:
        print(f"==> below {args.goal:.0f} % (or no result): {', '.join(low)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
