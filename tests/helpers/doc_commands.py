"""Every shell command shown in README.md and docs/, and which test checks it: the one list of documented commands.

`documented_commands()` reads the fenced ``bash`` / ``sh`` / ``shell`` / ``console`` blocks of the pages (line
continuations joined; lines that are only a comment skipped) and returns one `DocCommand` per command line.
`FAMILIES` says, per kind of command, which test module checks it and whether that test runs the commands or can
only check them; `commands_of(name)` is what those tests parametrize over. tests/project/test_documented_commands.py
fails when a command belongs to no family, or when it cannot run here and does not say why.

Marker: a command that cannot run in a test says what it needs in its trailing comment, which then starts with
``needs:`` and lists, comma-separated, words of `NEEDS`, up to a ``;`` or the end of the comment::

    trl sft --config examples/trl/gem_ls.yaml   # needs: gpu, hub; GEM paper recipe: Llama-3-8B

A marked command is still checked as far as it can be here (parsed by its program's real parser, the files it names,
a dry run). Pure Python (no torch, no frameworks): imported by the tests of every venv.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.env import REPO_ROOT

#: The pages whose shell blocks hold the documented commands.
PAGES: tuple[Path, ...] = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md")))
FENCE = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.M | re.S)

#: The words of a ``# needs:`` marker, and what each means.
NEEDS: dict[str, str] = {
    "gpu": "a CUDA GPU (or a model too large for a CPU: 7B/8B, vLLM)",
    "hub": "models or data sets downloaded from the Hugging Face Hub",
    "network": "packages downloaded from PyPI or the PyTorch index",
    "long": "minutes to hours of CPU time (full-size benchmarks); a tiny setting runs in tests/",
}
_MARKER = re.compile(r"^needs:\s*([^;]*)")
#: Folders the commands name virtual-environment binaries in (`make venvs`).
_VENV_BIN = re.compile(r"^\.venv[\w-]*/bin/")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of one shell line: a comment starts at a ``#`` that begins a word outside quotes."""
    quote: str | None = None
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif quote:
            if char == quote:
                quote = None
            elif char == "\\" and quote == '"':
                escaped = True
        elif char == "\\":
            escaped = True
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def parse_needs(comment: str) -> tuple[str, ...]:
    """The words of a ``needs:`` marker at the start of `comment` (empty when the comment has none)."""
    match = _MARKER.match(comment)
    if not match:
        return ()
    return tuple(word.strip() for word in match.group(1).split(",") if word.strip())


@dataclass(frozen=True)
class DocCommand:
    """One documented command line: where it is, its text (continuations joined, comment dropped) and its marker."""

    page: str  # relative to the repository root
    line: int  # the command's first line on the page
    text: str
    comment: str
    needs: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)

    @property
    def env(self) -> dict[str, str]:
        """The ``NAME=value`` assignments before the program."""
        env = {}
        for word in self.argv:
            if not _ENV_ASSIGNMENT.match(word):
                break
            name, _, value = word.partition("=")
            env[name] = value
        return env

    @property
    def program_argv(self) -> list[str]:
        """The words after the environment assignments, a venv's ``.venv*/bin/`` dropped from the program."""
        words = self.argv[len(self.env) :]
        return [_VENV_BIN.sub("", words[0]), *words[1:]] if words else []

    @property
    def venv_bin(self) -> str | None:
        """The ``.venv*/bin/`` folder the command runs its program from, if it names one."""
        words = self.argv[len(self.env) :]
        match = _VENV_BIN.match(words[0]) if words else None
        return match.group(0) if match else None


@dataclass(frozen=True)
class Family:
    """A kind of documented command and the test module that checks every command of it."""

    name: str
    #: How its commands start (after environment assignments and a venv's bin folder); a word ending in "/" is a
    #: prefix (``python benchmarks/`` matches ``python benchmarks/bench_losses.py``).
    starts: tuple[str, ...]
    test: str  # repository-relative path of the test module; it parametrizes over commands_of(name)
    #: True: the test runs each command without a ``needs:`` marker (tiny model, fixture data, paths replaced).
    #: False: the test can only check them (parser, files, dry run): every command must then carry a marker.
    runs: bool
    how: str

    def matches(self, command: DocCommand) -> bool:
        words = command.program_argv
        for start in self.starts:
            wanted = start.split()
            if len(words) >= len(wanted) and all(
                word.startswith(w) if w.endswith("/") else word == w
                for word, w in zip(words, wanted, strict=False)
            ):
                return True
        return False


FAMILIES: tuple[Family, ...] = (
    Family(
        "make",
        ("make",),
        "tests/project/test_documented_commands.py",
        True,
        "`make -n -B` with the variables given; the target's recipe is what a test or CI runs (MAKE_TARGETS_RUN)",
    ),
    Family(
        "pip",
        ("pip install",),
        "tests/project/test_documented_commands.py",
        False,
        "valid requirements, each named where the docs' program expects it",
    ),
    Family(
        "trl",
        ("trl sft", "distmatch-trl sft"),
        "tests/trl/cli/test_documented_commands.py",
        False,
        "parsed by our `trl sft` parser and checks (TRL's parser over DistMatchSFTConfig + check_parsed)",
    ),
    Family(
        "axolotl",
        ("python -m trl_ext.testing", "axolotl"),
        "tests/axolotl/test_documented_commands.py",
        True,
        "run as written in a scratch folder (the repository files they name copied there)",
    ),
    Family(
        "distmatch-eval",
        ("distmatch-eval",),
        "tests/eval/test_documented_commands.py",
        True,
        "parsed by eval_tasks.cli; run on a tiny model and fixture files at the paths they name, smaller sizes",
    ),
    Family(
        "lm_eval",
        ("lm_eval",),
        "tests/eval/test_documented_commands.py",
        False,
        "lm-eval's own parser and config, its model registry and task index, then our pre-flight option check",
    ),
    Family(
        "reproduce",
        ("bash examples/reproduce/",),
        "tests/eval/test_documented_commands.py",
        False,
        "DRY_RUN=1; the lm_eval / distmatch-eval commands it prints are checked like the documented ones",
    ),
    Family(
        "gem-domain-data",
        ("python examples/reproduce/gem_domain_data.py",),
        "tests/trl/test_gem_domain_recipes.py",
        False,
        "the script's own argument parser; the script runs on fixture rows of both datasets in the same test file",
    ),
    Family(
        "emo-lm-data",
        ("python examples/reproduce/emo_lm_data.py",),
        "tests/trl/test_emo_lm_recipes.py",
        False,
        "the script's own argument parser; the script runs on the open-ended corpus fixtures in the same test file",
    ),
    Family(
        "opencompass",
        ("opencompass",),
        "tests/eval/opencompass/test_documented_commands.py",
        False,
        "OpenCompass's own parser and config builder: datasets, model and summarizer resolved",
    ),
    Family(
        "benchmarks",
        ("python benchmarks/",),
        "tests/benchmarks/test_documented_commands.py",
        False,
        "the script's own argument parser; tiny settings of each script run in tests/benchmarks/test_benchmarks.py",
    ),
    Family(
        "gpu-check",
        ("tools/gpu_check.sh",),
        "tests/benchmarks/test_gpu_check.py",
        False,
        "the driver's argument parser (tools/gpu_check.py); its CPU dry run runs in the same test file",
    ),
)
FAMILY_BY_NAME = {family.name: family for family in FAMILIES}


def _page_commands(page: Path) -> list[DocCommand]:
    text = page.read_text(encoding="utf-8")
    found = []
    for block in FENCE.finditer(text):
        first_line = text.count("\n", 0, block.start(1)) + 1
        code: list[str] = []
        comments: list[str] = []
        start = 0
        for number, raw in enumerate(block.group(1).splitlines(), first_line):
            line, comment = split_comment(raw)
            if not code and not line.strip():
                continue  # an empty line or a comment of its own
            if not code:
                start = number
            comments += [comment] if comment else []
            if line.endswith("\\"):
                code.append(line[:-1].strip())
                continue
            code.append(line.strip())
            joined = " ".join(c for c in code if c)
            comment = " ".join(comments)
            needs = next((parse_needs(c) for c in comments if parse_needs(c)), ())
            found.append(DocCommand(str(page.relative_to(REPO_ROOT)), start, joined, comment, needs))
            code, comments = [], []
    return found


@functools.cache
def documented_commands() -> tuple[DocCommand, ...]:
    """Every command line of the pages' shell blocks, in page order."""
    return tuple(command for page in PAGES for command in _page_commands(page))


def family_of(command: DocCommand) -> list[Family]:
    """The families a command matches (exactly one when the registry is right)."""
    return [family for family in FAMILIES if family.matches(command)]


def commands_of(name: str) -> list[DocCommand]:
    """The documented commands of family `name` (what its test parametrizes over)."""
    family = FAMILY_BY_NAME[name]
    return [command for command in documented_commands() if family.matches(command)]


def ids(commands: Iterable[DocCommand]) -> list[str]:
    """pytest ids: where each command is."""
    return [command.where for command in commands]


def by_page(commands: Iterable[DocCommand]) -> dict[str, list[DocCommand]]:
    """The commands grouped by page, in page order (a reader runs one page's commands one after the other)."""
    pages: dict[str, list[DocCommand]] = {}
    for command in commands:
        pages.setdefault(command.page, []).append(command)
    return pages


def substitutions(text: str) -> list[str]:
    """The commands inside ``$(...)`` of a command's text."""
    return re.findall(r"\$\(([^()]*)\)", text)
