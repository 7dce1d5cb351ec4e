"""Every published number in eval_tasks/published/*.json pinned to its paper's table text.

The fixtures (tests/eval/fixtures/paper_tables/) are the table lines copied from the papers' text (EMO ICLR 2024:
Tables 1, 2, 3, 6-10; GEM: Tables 1, 2 and 4 - 9, the Sec. 5.1 perplexity sentence, the Sec. 5.2 sentences with
Figures 3 and 4's differences) and from the GEM repository's result.md. Each is parsed here into cells keyed by
(table, benchmark, metric, method, base model); the JSON of each
source must hold exactly those cells with exactly those values (a transposed digit, a missing or an extra cell
fails), the repository file a subset of its table's rows, complete for every method it quotes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.env import REPO_ROOT

TABLES = Path(__file__).parent / "fixtures" / "paper_tables"
PUBLISHED = REPO_ROOT / "eval_tasks" / "published"

Key = tuple[str, str, str, str, str]  # table, benchmark, metric, method, base model

_NLU_COLUMNS = {
    "TE": "tweet_emotion",
    "SST-2": "sst2",
    "TREC": "trec",
    "Subj": "subj",
    "CR": "cr",
    "RT": "rt",
    "AG": "ag_news",
    "MMLU": "mmlu",
}
_EMO_METHODS = ("Pre-trained", "MLE", "TaiLr", "MixCE", "EMO")
#: fixture -> (table, the base model of each data row in order, column name -> (benchmark, metric))
_EMO_TABLES = {
    "emo_table1.txt": (
        "Table 1",
        ["GPT-2"] * 4 + ["OPT-125M"] * 4,
        {
            "WikiText2": ("emo_lm_wikitext2", "mauve"),
            "WikiText103": ("emo_lm_wikitext103", "mauve"),
            "WebText <sub>test</sub>": ("emo_lm_webtext", "mauve"),
            "PTB": ("emo_lm_ptb", "mauve"),
            "WritingPrompts": ("emo_lm_writingprompts", "mauve"),
            "AG": ("emo_lm_ag_news", "mauve"),
        },
    ),
    "emo_table2.txt": (
        "Table 2",
        ["GPT-2"] * 4,
        {
            r"$PPL_{oracle} \downarrow$": ("emo_oracle_gpt2_large", "oracle_ppl"),
            "Mauve↑": ("emo_oracle_gpt2_large", "mauve"),
            "ROUGE-1↑": ("emo_oracle_gpt2_large", "rouge1"),
            "<b>ROUGE-L</b> ↑": ("emo_oracle_gpt2_large", "rougeL"),
        },
    ),
    "emo_table3.txt": ("Table 3", ["LLaMa-7B"] * 5 + ["LLaMa-13B"] * 5, None),
    "emo_table6.txt": ("Table 6", ["LLaMa2-7B"] * 5, None),
    "emo_table7.txt": ("Table 7", ["LLaMa2-13B"] * 5, None),
    "emo_table8.txt": ("Table 8", ["OPT-2.7B"] * 5, None),
    "emo_table9.txt": (
        "Table 9",
        [m for m in ("LLaMa-7B", "LLaMa-13B", "LLaMa2-7B", "LLaMa2-13B") for _ in range(2)],
        {"AlpacaEval Win Rate(%)": ("alpacaeval", "win_rate")},
    ),
    "emo_table10.txt": (
        "Table 10",
        [m for m in ("LLaMa2-7B", "LLaMa2-13B") for _ in range(2)],
        {"AlpacaEval Win Rate(%)": ("alpacaeval", "win_rate")},
    ),
}
_GEM_TABLE2 = [
    (b, m)
    for b in ("gem_poem", "gem_story")
    for m in ("ngram_diversity", "self_bleu_diversity", "sbert_diversity")
]
_GEM_MODEL = "Llama-3-8B"
_KS = (4, 8, 16, 32)
_VOTING = [f"mv@{k}" for k in _KS] + [f"bon@{k}" for k in _KS]
#: GEM's best-of-n / voting tables: fixture, table, (benchmark, metric) per column (the second header line names them)
_GEM_TTS_TABLES = [
    (
        "gem_table4.txt",
        "Table 4",
        [("alpacaeval_bon", f"reward_bon@{k}") for k in _KS]
        + [("alpacaeval_bon", f"win_rate_bon@{k}") for k in _KS],
    ),
    ("gem_table5.txt", "Table 5", [("gsm8k", m) for m in _VOTING]),
    ("gem_table7.txt", "Table 7", [("gsm8k", m) for m in _VOTING]),
    ("gem_table8.txt", "Table 8", [("math", m) for m in _VOTING]),
]


def _lines(name: str) -> list[str]:
    return [
        line for line in (TABLES / name).read_text().splitlines() if line.strip() and not line.startswith("#")
    ]


def _number(cell: str) -> float:
    return float(re.sub(r"<[^>]+>|\*\*", "", cell).strip())


def emo_cells() -> dict[Key, float]:
    cells: dict[Key, float] = {}
    for name, (table, models, columns) in _EMO_TABLES.items():
        header, *rows = [line.split("\t") for line in _lines(name)]
        first = 2 if header[0] in ("Model", "Models") else 1
        names = header[first:]
        columns = columns or {c: (_NLU_COLUMNS[c], "acc") for c in names}
        assert len(rows) == len(models), name
        for row, model in zip(rows, models, strict=True):
            (method,) = [c for c in row[:first] if c in _EMO_METHODS]
            values = row[first:]
            assert len(values) == len(names), (name, row)
            for column, value in zip(names, values, strict=True):
                benchmark, metric = columns[column]
                key = (table, benchmark, metric, method, model)
                assert key not in cells, key
                cells[key] = _number(value)
    return cells


def _pipe_rows(name: str, methods: tuple[str, ...]) -> list[tuple[str, list[float]]]:
    out = []
    for line in _lines(name):
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if parts[0] in methods:
            out.append((parts[0], [_number(p) for p in parts[1:] if p]))
    return out


def _gem_table1_columns() -> list[tuple[str, str]]:
    """lm-eval's IFEval metric names from Table 1's two header lines ("Strict Accuracy" / "(Prompt Level)" ...)."""
    judged, levels = [
        [p.strip() for p in line.split("|") if p.strip()] for line in _lines("gem_table1.txt")[1:3]
    ]
    level = {"(Prompt Level)": "prompt_level", "(Instruction Level)": "inst_level"}
    return [
        ("ifeval", f"{level[lv]}_{j.split()[0].lower()}_acc") for j, lv in zip(judged, levels, strict=True)
    ]


_CODE_BENCHMARKS = {"HumanEval": "humaneval", "MBPP": "mbpp_plus"}  # GEM's MBPP = the 378 MBPP+ problems


def _gem_code_columns(name: str) -> list[tuple[str, str]]:
    """(benchmark, "pass@k") of Tables 6 and 9 from their two header lines ("HumanEval | MBPP" / "Pass@10 | ...")."""
    benchmarks, passes = [[p.strip() for p in line.split("|") if p.strip()] for line in _lines(name)[:2]]
    per = len(passes) // (len(benchmarks) - 1)
    columns = [_CODE_BENCHMARKS[b] for b in benchmarks[1:] for _ in range(per)]
    return [(b, p.lower()) for b, p in zip(columns, passes, strict=True)]


def gem_cells() -> dict[Key, float]:
    methods = ("CE", "CE+WD", "CE+Entropy", "GEM-Linear", "GEM-LS")
    cells: dict[Key, float] = {}
    for name, table, columns in (
        ("gem_table1.txt", "Table 1", _gem_table1_columns()),
        ("gem_table2.txt", "Table 2", _GEM_TABLE2),
        ("gem_table6.txt", "Table 6", _gem_code_columns("gem_table6.txt")),
        ("gem_table9.txt", "Table 9", _gem_code_columns("gem_table9.txt")),
    ):
        rows = _pipe_rows(name, methods)
        assert [m for m, _ in rows] == list(methods), name
        for method, values in rows:
            assert len(values) == len(columns), (name, method)
            for (benchmark, metric), value in zip(columns, values, strict=True):
                cells[(table, benchmark, metric, method, _GEM_MODEL)] = value
    for name, table, columns in _GEM_TTS_TABLES:
        rows = _pipe_rows(name, methods)
        assert [m for m, _ in rows] == list(methods), name
        header = [p.strip() for p in _lines(name)[1].split("|") if p.strip()]
        assert [h.lower() for h in header] == [m.split("_")[-1] for _, m in columns], name
        for method, values in rows:
            assert len(values) == len(columns), (name, method)
            for (benchmark, metric), value in zip(columns, values, strict=True):
                cells[(table, benchmark, metric, method, _GEM_MODEL)] = value
    (sentence,) = _lines("gem_sec51_text.txt")
    around = re.search(
        r"GEM-LS and GEM-Linear achieve lower perplexity \(around (\d+\.\d+)\) than CE \((\d+\.\d+)\)",
        sentence,
    )
    assert around, sentence
    for method, value in (("GEM-LS", around[1]), ("GEM-Linear", around[1]), ("CE", around[2])):
        cells[("Sec. 5.1 text", "ultrafeedback_test", "perplexity", method, _GEM_MODEL)] = float(value)
    cells.update(gem_sec52_cells())
    return cells


_GAIN = r"(\d+\.\d) points \((\d+\.\d)% relative\)"


def gem_sec52_cells() -> dict[Key, float]:
    """Figures 3 and 4 as the text gives them: GEM-LS minus CE, in points and in percent of CE."""
    math_sentence, code_sentence = _lines("gem_sec52_text.txt")
    gains: list[tuple[str, str, str, str]] = []  # table, benchmark, metric, (points, relative)
    halves = math_sentence.split("On the MATH benchmark")
    assert len(halves) == 2 and "for greedy decoding, MV@32, and BON@32, respectively" in halves[0], (
        math_sentence
    )
    assert "for the same methods" in halves[1], math_sentence
    for benchmark, half in zip(("gsm8k", "math"), halves, strict=True):
        found = re.findall(_GAIN, half)
        assert len(found) == 3, half
        for metric, pair in zip(("greedy_acc", "mv@32", "bon@32"), found, strict=True):
            gains.append(("Sec. 5.2 text (Figure 3)", benchmark, metric, pair))
    halves = code_sentence.split("On MBPP")
    assert len(halves) == 2 and "on HumanEval" in halves[0], code_sentence
    for benchmark, half in zip(("humaneval", "mbpp_plus"), halves, strict=True):
        found = re.findall(_GAIN + r" for Pass@(\d+)", half)
        assert [k for *_, k in found] == ["1", "10", "100"], half
        for points, relative, k in found:
            gains.append(("Sec. 5.2 text (Figure 4)", benchmark, f"pass@{k}", (points, relative)))
    cells: dict[Key, float] = {}
    for table, benchmark, metric, (points, relative) in gains:
        cells[(table, benchmark, f"{metric}_gain_over_ce", "GEM-LS", _GEM_MODEL)] = float(points)
        cells[(table, benchmark, f"{metric}_rel_gain_over_ce", "GEM-LS", _GEM_MODEL)] = float(relative)
    return cells


def gem_repository_cells() -> dict[Key, float]:
    cells: dict[Key, float] = {}
    columns = [("gem_poem", m) for m in ("ngram_diversity", "self_bleu_diversity", "sbert_diversity")]
    rows = _pipe_rows("gem_repository_poem.txt", ("CE", "GEM-Linear", "GEM-Logsigmoid"))
    assert len(rows) == 3
    for method, values in rows:
        for (benchmark, metric), value in zip(columns, values, strict=True):
            cells[("result.md (poem writing)", benchmark, metric, method, _GEM_MODEL)] = value
    return cells


def json_cells(name: str) -> dict[Key, float]:
    cells: dict[Key, float] = {}
    for row in json.loads((PUBLISHED / name).read_text())["numbers"]:
        key = (row["table"], row["benchmark"], row["metric"], row["method"], row["base_model"])
        assert key not in cells, f"{name}: two numbers for {key}"
        cells[key] = row["value"]
    return cells


def mismatches(published: dict[Key, float], table: dict[Key, float]) -> list[str]:
    """What differs: numbers whose cell is missing or holds another value, and cells without a number."""
    wrong = [
        f"{k}: published {v}, table {table.get(k, 'no such cell')}"
        for k, v in published.items()
        if table.get(k) != v
    ]
    missing = [f"{k}: table {v}, not published" for k, v in table.items() if k not in published]
    return wrong + missing


@pytest.mark.parametrize(
    ("name", "cells"), [("emo_iclr2024.json", emo_cells), ("gem_2024.json", gem_cells)], ids=["emo", "gem"]
)
def test_published_numbers_equal_the_paper_tables(name: str, cells) -> None:  # noqa: ANN001
    table = cells()
    assert mismatches(json_cells(name), table) == []


def test_gem_repository_numbers_equal_its_result_md() -> None:
    table = gem_repository_cells()
    published = json_cells("gem_repository.json")
    methods = {k[3] for k in published}
    assert methods == {"CE", "GEM-Linear"}
    assert mismatches(published, {k: v for k, v in table.items() if k[3] in methods}) == []


def test_a_transposed_digit_is_found() -> None:
    table = emo_cells()
    published = json_cells("emo_iclr2024.json")
    key = ("Table 3", "mmlu", "acc", "EMO", "LLaMa-13B")
    assert published[key] == table[key] == 47.5
    assert mismatches({**published, key: 45.7}, table) == [f"{key}: published 45.7, table 47.5"]
    del published[key]
    assert mismatches(published, table) == [f"{key}: table 47.5, not published"]
    # every cell of the copied tables parsed (GEM: Tables 1, 2, Sec. 5.1; Tables 4-9; the Figure 3 / 4 sentences)
    assert len(table) == 264 + 12 and len(gem_cells()) == 53 + 6 * 40 + 24


def test_figure_3_and_4_text_agrees_with_tables_7_to_9() -> None:
    """The text's GEM-LS - CE differences at k = 32 (math) and pass@10 / pass@100 (code) are those of Tables 7-9 to
    0.1 point, and each relative gain is the points over the table's CE value (to 0.1 %); greedy accuracy and pass@1
    are in no table (their CE values are not in the text either)."""
    tables = gem_cells()
    text = gem_sec52_cells()
    checked = 0
    for (table, benchmark, metric, method, model), points in text.items():
        if not metric.endswith("_gain_over_ce") or "_rel_" in metric:
            continue
        base = metric.removesuffix("_gain_over_ce")
        source = {"gsm8k": "Table 7", "math": "Table 8"}.get(benchmark, "Table 9")
        if (source, benchmark, base, "CE", model) not in tables:
            assert base in ("greedy_acc", "pass@1"), (benchmark, base)
            continue
        ce, gem = (tables[(source, benchmark, base, m, model)] for m in ("CE", "GEM-LS"))
        relative = text[(table, benchmark, f"{base}_rel_gain_over_ce", method, model)]
        assert abs(points - (gem - ce)) <= 0.1 + 1e-9, (benchmark, base, points, gem - ce)
        assert abs(relative - 100 * points / ce) <= 0.1, (benchmark, base, relative, 100 * points / ce)
        checked += 1
    assert checked == 8


def test_published_files_have_no_duplicate_keys() -> None:
    """json.load keeps the last of two equal keys silently (a merge once left two "notes" lists in one file)."""

    def refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
        return dict(pairs)

    for path in sorted(PUBLISHED.glob("*.json")):
        json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=refuse_duplicates)


def test_report_shows_the_paper_cells_and_their_eight_task_mean() -> None:
    """`distmatch-eval report`'s NLU table: each published row is the paper's row, its Avg (8) the mean of the cells."""
    from eval_tasks.nlu.nlu import NLU_TASK_NAMES
    from eval_tasks.report.collect import RunData
    from eval_tasks.report.markdown import nlu_section

    run = RunData("mine", lm_eval={task: {"acc": 50.0} for task in NLU_TASK_NAMES})
    used: set[tuple[str, str]] = set()
    lines = nlu_section([run], True, "llama-7b", used)
    table = emo_cells()
    order = [t.removeprefix("distmatch_") for t in NLU_TASK_NAMES]
    rows = [line for line in lines if line.startswith("| ") and "[EMO Table 3]" in line]
    assert len(rows) == len(_EMO_METHODS)
    for line in rows:
        label, *cells, avg, protocol = [c.strip() for c in line.strip("|").split("|")]
        method = label.split(" · ")[0]
        expected = [table[("Table 3", b, "acc", method, "LLaMa-7B")] for b in order]
        assert [float(c) for c in cells] == expected, method
        assert avg == f"{sum(expected) / len(expected):.2f}" and protocol == "published", method
    assert ("EMO (Ren, Wu, Zhu, ICLR 2024)", "Table 3") in used
    (mine,) = [line for line in lines if line.startswith("| **mine**")]
    assert mine.count("50.00") == 9  # 8 tasks and their mean
