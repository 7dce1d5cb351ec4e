"""The documentation: README.md is a front page of at most 250 lines whose set-up commands CI runs, every relative
link in README.md and docs/ leads to a file of the repository (and to a heading there when it names one), and no
comment or document cites an issue number or a file that is not in the repository."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

import pytest

from tests.helpers.env import REPO_ROOT

REPO = REPO_ROOT
MAX_README_LINES = 250

#: The pages whose links are checked: the front page, every page under docs/ and the task folders' READMEs
#: (docs/demo/ also holds the demo's generated output, whose files are not pages).
PAGES = sorted(
    {
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
        REPO / "docs" / "demo" / "README.md",
        *(REPO / "eval_tasks").glob("*/README.md"),
    },
)

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = heading.replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKC", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(page: Path) -> list[str]:
    return [target for target in _LINK.findall(_prose(page.read_text(encoding="utf-8")))]


def test_readme_is_a_front_page() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; at most {MAX_README_LINES}"
    for page in ("losses", "trl", "axolotl", "evaluation", "distributed", "benchmarks", "development"):
        assert f"(docs/{page}.md)" in "\n".join(lines), f"README.md does not link docs/{page}.md"


def test_ci_runs_the_test_command_of_the_readme() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Set-up: two commands", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in setup.splitlines()]
    assert commands == ["make demo", "make test"], commands
    ci = [
        line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if not line.startswith("#")
    ]
    assert any(line == "make test" or line.startswith("make test ") for line in ci), ci


def test_docs_index_links_every_page() -> None:
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    for page in sorted((REPO / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"
    assert "](demo/README.md)" in index


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if REPO not in resolved.parents and resolved != REPO:
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading with that anchor in {resolved.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_slug_follows_github() -> None:
    assert _slug("Training throughput through TRL (`bench_trl_training.py`)") == (
        "training-throughput-through-trl-bench_trl_trainingpy"
    )
    assert _slug("Multi-process training: verified on CPU, and what needs a GPU") == (
        "multi-process-training-verified-on-cpu-and-what-needs-a-gpu"
    )
    assert (
        _slug("GPU: against Liger, Cut Cross Entropy and TRL")
        == "gpu-against-liger-cut-cross-entropy-and-trl"
    )


#: Citations of things that are not in the repository: issue numbers and files of the project's notes.
_FOREIGN = re.compile(
    r"\b[Ii]ssue #?\d|\bissue's\b|\breference/[\w.-]+\.md|\bperformance\.md|\bDESIGN\.md|\.\./shared/"
)
_SKIP_DIRS = {".git", "build", "dist", "demo_out", "node_modules"}


def _skipped(name: str) -> bool:
    return name.startswith(".venv") or name in _SKIP_DIRS or name.endswith(".egg-info")


def _sources() -> list[Path]:
    """The repository's text sources (tracked or not), without walking into the venvs and build outputs."""
    files = []
    for folder, dirs, names in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not _skipped(d))
        rel = Path(folder).relative_to(REPO)
        for name in names:
            path = Path(folder) / name
            if rel.parts[:2] == ("docs", "demo") and name != "README.md":
                continue  # the demo's generated output
            if path.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".sh"} or name == "Makefile":
                files.append(path)
    return files


def test_no_citation_of_what_is_not_in_the_repository() -> None:
    this = Path(__file__).resolve()
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in _sources()
        if path.resolve() != this
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if _FOREIGN.search(line)
    ]
    assert not found, "\n".join(found)
