"""Every shell command of README.md and docs/ is checked by a test, or says in a ``# needs:`` marker why it cannot run
here (tests/helpers/doc_commands.py: the list of commands, the marker, the families and their tests).

This module checks the list itself (each command in one family whose test parametrizes over it; markers where the
family cannot run its commands; known marker words; no ``...`` placeholders; the repository files a command names
exist) and checks the two families that need no framework: ``make`` (a dry run) and ``pip install``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import tomllib

import distmatch
from tests.helpers.doc_commands import (
    FAMILIES,
    NEEDS,
    DocCommand,
    commands_of,
    documented_commands,
    family_of,
    ids,
    substitutions,
)
from tests.helpers.env import REPO_ROOT

COMMANDS = documented_commands()

#: The file endings of the repository files a command may name (folders and outputs are not checked).
FILE_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".json", ".jsonl", ".toml", ".txt", ".md"}
#: The repository's top-level folders: a word starting with one of them names a file of the repository.
REPO_DIRS = {p.name for p in REPO_ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}


def test_the_pages_show_commands() -> None:
    """The reader (and these tests) would notice if the examples vanished or stopped being shell blocks."""
    assert len(COMMANDS) >= 40, [c.where for c in COMMANDS]
    assert {c.page for c in COMMANDS} >= {
        "README.md",
        "docs/evaluation.md",
        "docs/trl.md",
        "docs/benchmarks.md",
    }


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_command_is_checked_or_says_what_it_needs(command: DocCommand) -> None:
    families = family_of(command)
    assert len(families) == 1, (
        f"{command.where}: `{command.text}` belongs to {[f.name for f in families] or 'no family'}: add it to "
        "FAMILIES in tests/helpers/doc_commands.py with the test that checks it"
    )
    unknown = [word for word in command.needs if word not in NEEDS]
    assert not unknown, f"{command.where}: unknown `needs:` word(s) {unknown}; valid: {', '.join(NEEDS)}"
    if not families[0].runs:
        assert command.needs, (
            f"{command.where}: `{command.text}` is only checked by {families[0].test} ({families[0].how}), not run: "
            f"say why in its comment, `# needs: <{'|'.join(NEEDS)}>, ...`"
        )
    if re.search(r"\bcuda\b|\bvllm\b", command.text):
        assert "gpu" in command.needs, f"{command.where}: names cuda or vllm but has no `# needs: gpu`"


@pytest.mark.parametrize("command", COMMANDS, ids=ids(COMMANDS))
def test_command_is_complete_and_names_existing_files(command: DocCommand) -> None:
    assert "..." not in command.argv, f"{command.where}: `{command.text}`: write the whole command, not `...`"
    missing = []
    words = [part for word in command.argv for part in re.split(r"[=,]", word)]
    for word in words:
        path = Path(word)
        if path.suffix in FILE_SUFFIXES and path.parts and path.parts[0] in REPO_DIRS:
            if not (REPO_ROOT / path).is_file():
                missing.append(word)
    for inner in [command.text, *substitutions(command.text)]:
        module = re.search(r"\bpython\S* -m ([\w.]+)", inner)
        if module:
            base = REPO_ROOT / module.group(1).replace(".", "/")
            if (REPO_ROOT / module.group(1).split(".")[0]).is_dir() and not (
                base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()
            ):
                missing.append(f"-m {module.group(1)}")
    assert not missing, f"{command.where}: `{command.text}` names what the repository lacks: {missing}"


def test_every_family_has_its_test() -> None:
    """Each family's test module exists and parametrizes over its commands; no family is left without commands."""
    for family in FAMILIES:
        test = REPO_ROOT / family.test
        assert test.is_file(), f"{family.name}: no {family.test}"
        assert f'commands_of("{family.name}")' in test.read_text(encoding="utf-8"), (
            f"{family.test} does not check commands_of({family.name!r})"
        )
        assert commands_of(family.name), f"family {family.name!r} has no documented command left: remove it"


def test_marker_is_parsed() -> None:
    from tests.helpers.doc_commands import parse_needs, split_comment

    assert split_comment("make test   # needs: gpu, network; on a GPU machine") == (
        "make test",
        "needs: gpu, network; on a GPU machine",
    )
    assert parse_needs("needs: gpu, network; on a GPU machine") == ("gpu", "network")
    assert parse_needs("the paper's model needs: the Hub") == ()
    assert split_comment("""lm_eval --metadata '{"a": "#b"}' # c""") == (
        """lm_eval --metadata '{"a": "#b"}'""",
        "c",
    )
    assert split_comment('echo "$(python -m x)"#y') == ('echo "$(python -m x)"#y', "")


# ---------------------------------------------------------------------------------------------------------
# make: the targets exist, take the variables given, and their recipes are what a test or CI runs

#: The documented `make` targets and what their recipe runs: (a string the dry run must print, the file that runs it).
MAKE_TARGETS_RUN = {
    # tests/demo/test_demo.py runs examples/demo/run_demo.py end to end on a tiny model built in code
    "demo": ("examples/demo/run_demo.py", "tests/demo/test_demo.py"),
    # `make test` runs the `dist` step (the Makefile's list of steps), and CI runs `make test`
    "dist": ("tools/dist.py", "Makefile"),
    # needs PyPI: tests/benchmarks/test_gpu_check.py runs its plan, wheels and size check offline
    "gpu-kit": ("tools/gpu_kit.py", "tests/benchmarks/test_gpu_check.py"),
    # CI's entry point is `make test` (tests/project/test_docs.py checks .ci/run)
    "test": ("-m pytest", ".ci/run"),
}
MAKE = commands_of("make")


def _make_dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    """`make -n -B`: every target out of date, so the recipes print whatever venvs exist; nothing runs (the `$(MAKE)`
    lines recurse, with -n too)."""
    return subprocess.run(
        ["make", "-n", "-B", "--no-print-directory", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", MAKE, ids=ids(MAKE))
def test_make_command_dry_runs(command: DocCommand) -> None:
    argv = command.program_argv
    targets = [word for word in argv[1:] if "=" not in word]
    variables = dict(word.split("=", 1) for word in argv[1:] if "=" in word)
    done = _make_dry_run(*argv[1:])
    assert done.returncode == 0, f"{command.where}: `{command.text}`: {done.stderr[-2000:]}"
    for name, value in variables.items():
        assert value in done.stdout, f"{command.where}: {name}={value} is not used by the recipes"
    if variables and not command.needs:  # runs what the tests / CI run only when the values are the defaults
        assert done.stdout == _make_dry_run(*targets).stdout, (
            f"{command.where}: `{command.text}` runs other recipes than `make {' '.join(targets)}`: mark it"
        )
    for target in targets:
        assert target in MAKE_TARGETS_RUN, (
            f"{command.where}: `make {target}`: say in MAKE_TARGETS_RUN which test runs its recipe, or mark it"
        )
        printed, runner = MAKE_TARGETS_RUN[target]
        assert printed in done.stdout, f"`make -n {target}` does not run {printed}"
        assert (REPO_ROOT / runner).is_file(), runner
        runs = (REPO_ROOT / runner).read_text(encoding="utf-8")
        assert Path(printed).name in runs or f"make {target}" in runs, f"{runner} does not run {printed}"


def test_make_dry_run_fails_on_an_unknown_target() -> None:
    """The check above can fail: a target that does not exist is refused by the dry run."""
    done = subprocess.run(["make", "-n", "no-such-target"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "no-such-target" in done.stderr


# ---------------------------------------------------------------------------------------------------------
# pip install: valid requirements, each named where the page's program tells the user to install it

PIP = commands_of("pip")
DECLARED_EXTRAS = set(
    tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)
#: Where each documented optional install is asked for (the program's missing-package message).
PIP_NAMED_IN = {
    "liger-kernel": "benchmarks/_loss_tables.py",  # the anchors table names the wheel
    "cut-cross-entropy": "benchmarks/_loss_tables.py",
}


@pytest.mark.parametrize("command", PIP, ids=ids(PIP))
def test_pip_install_names_real_requirements(command: DocCommand) -> None:
    from packaging.requirements import Requirement

    argv = command.program_argv
    assert argv[:2] == ["pip", "install"], command.text
    words = [word for word in argv[2:] if not word.startswith("-")]
    assert words, command.text
    names = []
    for word in words:
        local = re.fullmatch(r"(dist/distmatch-([^-]+)-py3-none-any\.whl|\.)(?:\[([\w,-]+)\])?", word)
        requirement = None if local else Requirement(word)
        # our own package: the extras exist, the wheel's version is ours
        if local or requirement.name == "distmatch":
            extras = local.group(3).split(",") if local and local.group(3) else []
            extras = sorted(requirement.extras) if requirement else extras
            assert set(extras) <= DECLARED_EXTRAS, (
                f"{command.where}: {extras} not all in {sorted(DECLARED_EXTRAS)}"
            )
            if local and local.group(2):
                assert local.group(2) == distmatch.__version__, (
                    f"{command.where}: not the version of this tree"
                )
        else:
            names.append(requirement.name)
    for name in names:
        assert name in PIP_NAMED_IN, (
            f"{command.where}: {name}: which program needs it? add it to PIP_NAMED_IN"
        )
        assert name in (REPO_ROOT / PIP_NAMED_IN[name]).read_text(encoding="utf-8"), (
            name,
            PIP_NAMED_IN[name],
        )
