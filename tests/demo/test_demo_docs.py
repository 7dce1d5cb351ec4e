"""The committed demo run (docs/demo/report.md, results.json) and the page that presents it (docs/demo/README.md)
agree: the results table, the differences against CE, the machine; and every difference is worded by the
two-standard-error rule (clear only beyond 2 s.e.). Also the rule's wording and the machine description."""

from __future__ import annotations

import importlib
import json
import re
import sys

import pytest

from tests.helpers.env import REPO_ROOT

DOCS = REPO_ROOT / "docs" / "demo"
if str(REPO_ROOT / "examples" / "demo") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "examples" / "demo"))
demo_config = importlib.import_module("demo_config")
demo_report = importlib.import_module("demo_report")

#: `+5.5 ± 1.2 (clear: beyond 2 s.e.)` / `(not clear: within 2 s.e.)`
WORDED = re.compile(r"([+-]?\d+\.\d+) ± (\d+\.\d+) \((clear: beyond 2 s\.e\.|not clear: within 2 s\.e\.)\)")


def _table(text: str, first_header: str) -> dict[str, list[str]]:
    """The markdown table whose header row starts with `| first_header |`: {first cell: [cells]}."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def _report() -> str:
    return (DOCS / "report.md").read_text(encoding="utf-8")


def _readme() -> str:
    return (DOCS / "README.md").read_text(encoding="utf-8")


def test_docs_table_is_the_committed_run() -> None:
    report = _table(_report(), "run")
    docs = _table(_readme(), "run")
    assert list(docs) == list(report) == ["base", "ce", "gem_ls", "emo"]
    pairs = {
        "held-out perplexity": "perplexity",
        "entropy (nats)": "entropy",
        "top-1 prob": "top-1 prob",
        "n-gram div": "n-gram div",
        "Self-BLEU div": "Self-BLEU div",
        "SBERT div": "SBERT div",
    }
    for run, cells in docs.items():
        for docs_column, report_column in pairs.items():
            assert cells[docs_column] == report[run][report_column], (run, docs_column)


def test_docs_differences_are_the_committed_runs() -> None:
    """The README's differences table (gem_ls / emo against ce) is the report's 'Differences against CE' lines."""
    lines = {
        m.group(1): m.group(2) for m in re.finditer(r"^- \*\*(\w+) vs ce\*\*: (.*)$", _report(), flags=re.M)
    }
    assert set(lines) == {"gem_ls", "emo"}
    docs = _table(_readme(), "seed 42, this run")
    assert docs, "the README's differences table is missing"
    for metric, cells in docs.items():
        for run in ("gem_ls", "emo"):
            cell = cells[f"{run} vs ce"]
            assert f"{metric} {cell}" in lines[run], (metric, run, cell)


def test_every_stated_difference_follows_the_two_se_rule() -> None:
    texts = {"report.md": _report(), "README.md": _readme()}
    counted = 0
    for name, text in texts.items():
        for m in WORDED.finditer(text):
            mean, se, words = float(m.group(1)), float(m.group(2)), m.group(3)
            if abs(abs(mean) - 2 * se) <= 0.15:  # too close to call from the rounded numbers
                continue
            expected = demo_report.CLEAR if abs(mean) > 2 * se else demo_report.NOT_CLEAR
            assert words == expected, (name, m.group(0))
            counted += 1
    assert counted >= 6
    assert "(> 2 s.e.)" not in _report() and "last digit" not in _readme()


def test_docs_name_the_machine_of_the_committed_run() -> None:
    env = json.loads((DOCS / "results.json").read_text(encoding="utf-8"))["environment"]
    readme = " ".join(_readme().split())  # the page wraps its lines
    assert env["cpu"] and env["cpu"] in readme and env["cpu"] in _report()
    config = json.loads((DOCS / "results.json").read_text(encoding="utf-8"))["config"]
    assert (config["dtype"], config["threads"]) == ("float32", 2) and env["dtype"] == "float32"


@pytest.mark.parametrize(
    ("mean", "se", "words"), [(5.5, 1.2, "clear"), (-3.0, 1.4, "clear"), (3.4, 4.8, "not")]
)
def test_verdict_wording(mean: float, se: float, words: str) -> None:
    text = demo_report.verdict(mean, se)
    assert text == (demo_report.CLEAR if words == "clear" else demo_report.NOT_CLEAR)
    assert demo_report.verdict(2.0, 1.0) == demo_report.NOT_CLEAR  # exactly two: not beyond


def test_cpu_description_names_model_and_numeric_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    info = (
        "processor\t: 0\nmodel name\t: Some CPU 9000\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16\n"
    )
    monkeypatch.setattr(demo_config, "_cpuinfo", lambda: info)
    text = demo_config.cpu_description()
    assert text == "Some CPU 9000; avx512_bf16, avx512f, avx2, fma; no amx_bf16, amx_tile"
    assert demo_config.cpu_flags() >= {"avx2", "avx512_bf16"}
    monkeypatch.setattr(demo_config, "_cpuinfo", lambda: "")
    assert demo_config.cpu_flags() == set()
