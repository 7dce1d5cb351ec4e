"""Run `make test`'s steps, time each one, and end with a table of wall times against their budgets.

    python tools/test_steps.py lint=60 dist=150 test-core=540 ...

Each argument is a make target and its budget in seconds (the budgets live in the Makefile, `TEST_STEPS`). Every
step runs even when an earlier one failed; the exit status is 1 if any step failed. A step over its budget prints a
warning line, not a failure (times are noisy): docs/development.md "Times" has the rule and the measured table.
A step written `a+b` runs the targets `a` and `b` side by side (their output interleaves; each line is prefixed).
`--first TARGET=SECONDS` is a step that must pass before the others run (the venv builds: an install problem shows
before any test, and no later step rebuilds a venv one by one).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time


def parse_steps(arguments: list[str]) -> list[tuple[str, float]]:
    steps = []
    for argument in arguments:
        name, sep, budget = argument.partition("=")
        if not sep or not name:
            raise SystemExit(
                f"tools/test_steps.py: a step is TARGET=SECONDS (or A+B=SECONDS), not {argument!r}"
            )
        try:
            seconds = float(budget)
        except ValueError:
            raise SystemExit(
                f"tools/test_steps.py: the budget of {name} is a number of seconds, not {budget!r}"
            ) from None
        steps.append((name, seconds))
    return steps


def _pump(stream, prefix: str) -> None:
    for line in iter(stream.readline, ""):
        sys.stdout.write(prefix + line)
        sys.stdout.flush()


def run_step(name: str) -> int:
    """`make <target>` for each target of `name`; side by side (prefixed output) when there are several."""
    targets = name.split("+")
    make = [os.environ.get("MAKE", "make"), "--no-print-directory"]
    if len(targets) == 1 or make_dry_run():  # a dry run prints each target's recipes in order
        return max(subprocess.call([*make, target]) for target in targets)
    processes, pumps = [], []
    for target in targets:
        process = subprocess.Popen(
            [*make, target], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        pump = threading.Thread(target=_pump, args=(process.stdout, f"[{target}] "), daemon=True)
        pump.start()
        processes.append(process)
        pumps.append(pump)
    codes = [process.wait() for process in processes]
    for pump in pumps:
        pump.join()
    return max(codes)


def _clock(seconds: float) -> str:
    whole = round(seconds)  # rounded before splitting: 59.6 s is 1:00, not 0:60
    return f"{whole // 60}:{whole % 60:02d}"


def table(results: list[tuple[str, float, float, int]], total: float) -> str:
    lines = ["| step | wall time | budget | result |", "|---|---|---|---|"]
    for name, seconds, budget, code in results:
        over = " (over budget)" if seconds > budget else ""
        lines.append(
            f"| {name} | {_clock(seconds)}{over} | {_clock(budget)} | {'passed' if code == 0 else 'FAILED'} |"
        )
    budget = sum(b for _, _, b, _ in results)
    lines.append(f"| all | {_clock(total)} | {_clock(budget)} | |")
    return "\n".join(lines)


def make_dry_run() -> bool:
    """`make -n test`: the steps print their recipes; no times to report (they would differ run to run)."""
    words = os.environ.get("MAKEFLAGS", "").split()
    return bool(words) and not words[0].startswith("-") and "n" in words[0]


def main(argv: list[str]) -> int:
    first = []
    if argv[:1] == ["--first"]:
        first, argv = parse_steps(argv[1:2]), argv[2:]
    steps = parse_steps(argv)
    results = []
    started = time.monotonic()
    for index, (name, budget) in enumerate(first + steps):
        begin = time.monotonic()
        code = run_step(name)
        results.append((name, time.monotonic() - begin, budget, code))
        if code != 0 and index < len(first):
            break
    total = time.monotonic() - started
    if make_dry_run():
        return max(code for _, _, _, code in results)
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\n==> make test: step times (load average now {load}; budgets: Makefile TEST_STEPS)")
    print(table(results, total))
    for name, seconds, budget, _ in results:
        if seconds > budget:
            print(f"==> WARNING: {name} took {_clock(seconds)}, over its budget of {_clock(budget)}")
    failed = [name for name, _, _, code in results if code != 0]
    if failed:
        print(f"==> make test FAILED: {' '.join(failed)}")
        return 1
    print("==> make test: lint and all test runs passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
