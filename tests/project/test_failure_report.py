"""The failure report of a launch (`tests.helpers.cli.tail`): why a rank died stays visible under its stacks."""

from __future__ import annotations

import subprocess

from tests.helpers.cli import tail

STACKS = "".join(
    f'  File "x.py", line {i} in f\n' for i in range(400)
)  # every thread's stack, then the launcher's


def _report(stderr: str) -> str:
    return tail(subprocess.CompletedProcess(["torchrun"], 1, "", stderr))


def test_the_first_abort_message_is_shown_even_when_stacks_push_it_out_of_the_tail():
    cause = (
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail] size"
    )
    report = _report(f"rank 1 starting\n{cause}\nFatal Python error: Aborted\n{STACKS}")
    before, shown = report.split("\n--- stdout\n")
    assert "first failure lines before the tail" in before and cause in before
    assert (
        cause not in shown.split("--- stderr\n", 1)[1]
    )  # it was outside the tail: only the new section shows it
    assert before.count("what():") == 1  # one window per failure, not one per matching line


def test_a_short_stderr_is_shown_once_without_a_failure_section():
    report = _report("terminate called without an active exception\n")
    assert "first failure lines" not in report and report.count("terminate called") == 1
