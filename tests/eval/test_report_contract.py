"""The report's tables (eval_tasks/report/markdown.py) against docs/evaluation.md ("Diversity metrics and
reports", the best-of-n, NoveltyBench and open-ended sections), the module docstrings and the papers' tables
(eval_tasks/published/*.json, checked against the papers by tests/eval/test_published_tables.py).

Each section is rendered whole from runs collected from real files (lm-eval results files as lm-eval writes them,
``distmatch-eval`` outputs, ``trainer_state.json``) and compared with the documented table: the runs in bold first,
in the order given, then the papers' rows as ``method · base model [paper table]``; values with two decimals (the
next-token table: entropy 3, probabilities 4), a missing one as "–"; titles, column titles and notes. Every value
is computed by hand from the files written here. Collecting the files: tests/eval/test_report_collect_contract.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from eval_tasks.report import RunData, collect_run
from eval_tasks.report import markdown as md

EMO = "EMO (Ren, Wu, Zhu, ICLR 2024)"
GEM = "GEM (Li et al., 2024: Entropic Distribution Matching in SFT of LLMs)"
NLU_TASKS = ("tweet_emotion", "sst2", "trec", "subj", "cr", "rt", "ag_news", "mmlu")
#: the EMO protocol's settings, as `--metadata '{"protocol": "emo_official"}'` records them in the results file
EMO_OFFICIAL = dict(protocol="emo_official", template="emo_code", openicl_round_trip=True, ppl_norm="openicl")
EMO_OFFICIAL["mmlu_average"] = "subject_macro"
GEM_OFFICIAL = dict(protocol="gem_official", scoring="prompt+response", gem_compat=True, num_samples=16)
GEM_OFFICIAL["sbert_model"] = "sentence-transformers/bert-large-nli-stsb-mean-tokens"
#: the differences of an NLU task run without a protocol (eval_tasks.protocols.paper_protocol_check)
ICL_DEFAULT = "template=paper (paper: emo_code); openicl_round_trip=False (paper: True); ppl_norm=tokens (paper: openicl)"


def _write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _lm_eval(path: Path, values: dict, metadata: dict | None = None, *, n_samples=None, **top) -> Path:
    """An lm-eval results file: ``<metric>,<filter>`` keys with their ``_stderr`` twins, ``configs`` (with the
    task's metadata), ``versions``, ``n-shot``, ``n-samples`` and ``config``."""
    results = {
        t: {"alias": t, **{f"{m},none": v for m, v in ms.items()}, **{f"{m}_stderr,none": 0.01 for m in ms}}
        for t, ms in values.items()
    }
    counts = {t: {"original": 100, "effective": 100} for t in values}
    counts.update({t: {"original": o, "effective": e} for t, (o, e) in (n_samples or {}).items()})
    data = {"results": results, "configs": {t: {"task": t, "metadata": dict(metadata or {})} for t in values}}
    data.update({"versions": {t: 1.0 for t in values}, "n-shot": {t: 0 for t in values}, "n-samples": counts})
    return _write(path, {**data, "config": {"model": "hf", "model_args": "pretrained=out/run"}, **top})


def _nlu(tmp: Path, name: str, values: dict, metadata: dict | None, **kw) -> Path:
    tasks = {f"distmatch_{b}": v for b, v in values.items()}
    return _lm_eval(tmp / name / "nlu" / "r.json", tasks, metadata, **kw)


def _other(tmp: Path) -> RunData:
    """A run with no task of any section."""
    return collect_run("o", [_lm_eval(tmp / "other.json", {"my_task": {"acc": 1.0}})])


def _text(lines: list[str]) -> str:
    return "\n".join(lines)


def test_cells_show_two_decimals_a_dash_for_missing_and_escape_pipes() -> None:
    cells = [md.fmt(x) for x in (None, math.nan, 2.0, 2.345678, 3, "a|b")]
    assert cells == ["–", "–", "2.00", "2.35", "3", "a|b"] and md.fmt(2.345678, 4) == "2.3457"
    assert md.bold("ce") == "**ce**" and md.table(["h"], []) == ["| h |", "|---|"]
    table = md.table(["run", "a|b"], [["**x**", None], ["y\nz", 1.5]])
    assert table == ["| run | a\\|b |", "|---|---|", "| **x** | – |", "| y z | 1.50 |"]


NLU_NOTE = (
    "Published rows: models continually fine-tuned on WikiText-103 with each objective, 8 retrieved "
    "demonstrations (MMLU 5-shot), lowest-perplexity label (OpenICL). Same task definitions as the "
    "`distmatch_*` lm-eval tasks; base models and training data differ from your runs. A run is on the "
    'paper\'s protocol with `--metadata \'{"protocol": "emo_official"}\'` (its column then shows '
    "`acc_ppl`, OpenICL's rule, with MMLU as the mean of its 57 subjects); other runs show `acc`."
)
NLU_DIFF = "Differences from the EMO evaluation protocol (numbers not directly comparable):"
NLU_TITLE = "### In-context NLU (EMO §4.2; accuracy, %)"


def test_nlu_table_all_eight_tasks_with_the_average_and_emo_table_8(tmp_path: Path) -> None:
    """EMO Table 8's columns (TE ... MMLU) and their mean; the paper's number is acc_ppl on the EMO protocol, acc
    otherwise; a run is paper-comparable only when every task is; the differences listed once per run, numbered."""
    on_protocol = {
        b: {"acc": 0.125, "acc_ppl": v} for b, v in zip(NLU_TASKS, (0.7, 0.95, 0.8, 0.9, 0.92, 0.88, 0.86))
    }
    on_protocol["mmlu"] = {"acc": 0.43, "acc_ppl": 0.25}  # MMLU's number is acc (its subject mean)
    _nlu(tmp_path, "emo", on_protocol, EMO_OFFICIAL)
    default = dict(zip(NLU_TASKS, (0.5, 0.9, 0.6, 0.7, 0.8, 0.75, 0.65, 0.3)))
    _nlu(tmp_path, "ce", {b: {"acc": v, "acc_ppl": 0.125} for b, v in default.items()}, None)
    # one task, a chat template and a --limit: its row has no average
    limit = {"distmatch_sst2": (872, 100)}
    _nlu(tmp_path, "part", {"sst2": {"acc": 0.875}}, {}, n_samples=limit, chat_template="{{ x }}")
    _lm_eval(tmp_path / "other" / "results.json", {"my_task": {"acc": 0.5}})  # no NLU task at all
    runs = [collect_run(n, [tmp_path / n]) for n in ("emo", "ce", "part", "other")]
    used: set[tuple[str, str]] = set()
    # EMO Table 8 (OPT-2.7B); Avg = the mean of the eight columns
    expected = f"""{NLU_TITLE}

| run | TE | SST-2 | TREC | Subj | CR | RT | AG | MMLU | Avg (8) | protocol |
|---|---|---|---|---|---|---|---|---|---|---|
| **emo** | 70.00 | 95.00 | 80.00 | 90.00 | 92.00 | 88.00 | 86.00 | 43.00 | 80.50 | emo_official: paper-comparable |
| **ce** | 50.00 | 90.00 | 60.00 | 70.00 | 80.00 | 75.00 | 65.00 | 30.00 | 65.00 | default: not comparable [1] |
| **part** | – | 87.50 | – | – | – | – | – | – | – | default: not comparable [2] |
| **other** | – | – | – | – | – | – | – | – | – | – |
| Pre-trained · OPT-2.7B [EMO Table 8] | 65.70 | 92.90 | 68.60 | 85.50 | 92.50 | 87.60 | 84.30 | 24.40 | 75.19 | published |
| MLE · OPT-2.7B [EMO Table 8] | 67.30 | 88.70 | 66.80 | 83.40 | 91.50 | 81.30 | 84.40 | 24.90 | 73.54 | published |
| TaiLr · OPT-2.7B [EMO Table 8] | 67.10 | 92.90 | 70.40 | 88.20 | 92.60 | 87.10 | 84.00 | 24.70 | 75.88 | published |
| MixCE · OPT-2.7B [EMO Table 8] | 66.80 | 93.10 | 70.60 | 88.80 | 92.80 | 87.40 | 84.10 | 25.00 | 76.08 | published |
| EMO · OPT-2.7B [EMO Table 8] | 68.60 | 93.70 | 73.60 | 87.60 | 92.80 | 86.00 | 87.60 | 25.60 | 76.94 | published |

{NLU_NOTE}

{NLU_DIFF}

1. **ce**: {ICL_DEFAULT}; mmlu_average=micro (paper: subject_macro).
2. **part**: {ICL_DEFAULT}; chat template applied (the EMO protocol scores the plain prompt); 100 of 872 documents (--limit).
"""
    assert _text(md.nlu_section(runs, True, "OPT-2.7B", used)) == expected
    assert used == {(EMO, "Table 8")}


def test_nlu_table_of_some_tasks_has_no_average_and_names_each_protocol(tmp_path: Path) -> None:
    """Only the tasks some run has, in the papers' order; the published rows merged per label over those columns;
    a run on two protocols names both (sorted); a run comparable on every task needs no note."""
    _nlu(tmp_path, "emo", {"mmlu": {"acc": 0.25}, "sst2": {"acc": 0.5, "acc_ppl": 0.9}}, EMO_OFFICIAL)
    _nlu(tmp_path, "mixed", {"sst2": {"acc": 0.125, "acc_ppl": 0.625}}, EMO_OFFICIAL)
    _nlu(tmp_path, "mixed2", {"mmlu": {"acc": 0.375}}, None)
    runs = [
        collect_run("emo", [tmp_path / "emo"]),
        collect_run("mixed", [tmp_path / n for n in ("mixed", "mixed2")]),
    ]
    used: set[tuple[str, str]] = set()
    head = f"{NLU_TITLE}\n\n| run | SST-2 | MMLU | protocol |\n|---|---|---|---|\n"
    head += "| **emo** | 90.00 | 25.00 | emo_official: paper-comparable |\n"
    expected = f"""{head}\
| **mixed** | 62.50 | 37.50 | default/emo_official: not comparable [1] |
| Pre-trained · OPT-2.7B [EMO Table 8] | 92.90 | 24.40 | published |
| MLE · OPT-2.7B [EMO Table 8] | 88.70 | 24.90 | published |
| TaiLr · OPT-2.7B [EMO Table 8] | 92.90 | 24.70 | published |
| MixCE · OPT-2.7B [EMO Table 8] | 93.10 | 25.00 | published |
| EMO · OPT-2.7B [EMO Table 8] | 93.70 | 25.60 | published |

{NLU_NOTE}

{NLU_DIFF}

1. **mixed**: mmlu_average=micro (paper: subject_macro).
"""
    assert _text(md.nlu_section(runs, True, "opt", used)) == expected
    assert used == {(EMO, "Table 8")}  # the model filter: case-insensitive
    used = set()  # without the published rows: the runs alone, nothing used; comparable alone: no differences
    assert _text(md.nlu_section(runs[:1], False, None, used)) == head + f"\n{NLU_NOTE}\n" and used == set()


def test_nlu_published_rows_of_another_model_and_no_nlu_task(tmp_path: Path) -> None:
    """All eight tasks: every published row has its mean; a filter keeps one model's rows; no NLU task: nothing."""
    _nlu(tmp_path, "a", {b: {"acc": 0.5} for b in NLU_TASKS}, None)
    lines = md.nlu_section([collect_run("a", [tmp_path / "a"])], True, "LLaMa2-13B", set())
    rows = [x for x in lines if x.startswith("| ") and "[EMO" in x]
    # EMO Table 7 (LLaMa2-13B): MLE's row; its mean (60.9 + 95.8 + 81.0 + 81.8 + 90.9 + 89.6 + 86.2 + 54.3) / 8
    mle = "| MLE · LLaMa2-13B [EMO Table 7] | 60.90 | 95.80 | 81.00 | 81.80 | 90.90 | 89.60 | 86.20 | 54.30 | 80.06 |"
    assert rows[1] == mle + " published |" and len(rows) == 5
    assert md.nlu_section([_other(tmp_path)], True, None, set()) == []


IFEVAL_HEAD = """### IFEval (GEM Table 1; accuracy, %)

| run | prompt strict | instr. strict | prompt loose | instr. loose |
|---|---|---|---|---|
| **gem** | 37.50 | 50.00 | 43.75 | 56.25 |
"""
IFEVAL_NOTE = "\nPublished rows: Llama-3-8B fine-tuned on UltraFeedback; greedy, up to 1,024 new tokens.\n"


def test_ifeval_table_with_gem_table_1(tmp_path: Path) -> None:
    """The four IFEval accuracies in GEM Table 1's order, x100; a run's distmatch_ifeval before lm-eval's own
    ifeval task; a run without IFEval has no row."""
    ifeval = {"prompt_level_strict_acc": 0.375, "inst_level_strict_acc": 0.5}
    ifeval["prompt_level_loose_acc"] = 0.4375
    _lm_eval(tmp_path / "gem.json", {"ifeval": {**ifeval, "inst_level_loose_acc": 0.5625}})
    _lm_eval(tmp_path / "ce.json", {"distmatch_ifeval": ifeval, "ifeval": {m: 0.0625 for m in ifeval}})
    _lm_eval(tmp_path / "none.json", {"my_task": {"acc": 0.5}})
    runs = [collect_run(n, [tmp_path / f"{n}.json"]) for n in ("gem", "ce", "none")]
    used: set[tuple[str, str]] = set()
    expected = (
        f"""{IFEVAL_HEAD}| **ce** | 37.50 | 50.00 | 43.75 | – |
| CE · Llama-3-8B [GEM Table 1] | 36.23 | 46.76 | 40.85 | 50.96 |
| CE+WD · Llama-3-8B [GEM Table 1] | 37.89 | 47.48 | 42.88 | 52.52 |
| CE+Entropy · Llama-3-8B [GEM Table 1] | 36.78 | 47.60 | 40.66 | 51.08 |
| GEM-Linear · Llama-3-8B [GEM Table 1] | 37.34 | 48.20 | 41.96 | 52.64 |
| GEM-LS · Llama-3-8B [GEM Table 1] | 37.52 | 47.60 | 42.14 | 52.04 |
"""
        + IFEVAL_NOTE
    )
    assert _text(md.ifeval_section(runs, True, "llama-3", used)) == expected
    assert used == {(GEM, "Table 1")}
    used = set()
    runs_only = IFEVAL_HEAD + IFEVAL_NOTE
    assert _text(md.ifeval_section(runs[:1], False, None, used)) == runs_only and used == set()
    assert _text(md.ifeval_section(runs[:1], True, "OPT", used)) == runs_only and used == set()
    assert md.ifeval_section(runs[2:], True, None, used) == []


BON_NOTE = (
    "First k of 32 samples per question (temperature 0.6, top-k 50, top-p 0.9) in the published rows; a run "
    "with fewer samples has no value at the larger k. Tables 4 and 5: Llama-3-8B on UltraFeedback; Tables 7 "
    "and 8: on MetaMathQA. Tables 6 and 9 (code): pass@k by the unbiased estimator from 200 samples per "
    "problem; Table 6: on UltraFeedback, Table 9: on Magicoder-OSS-Instruct."
)
VOTE_COLUMNS = ["mv@4", "mv@8", "mv@16", "mv@32", "bon@4", "bon@8", "bon@16", "bon@32"]
VOTE = "| run | " + " | ".join(VOTE_COLUMNS) + " |\n|---|---|---|---|---|---|---|---|---|"
PASS = "| run | pass@10 | pass@20 | pass@50 | pass@100 |\n|---|---|---|---|---|"


def _curve(path: Path, kind: str, task: str, curve: object) -> Path:
    return _write(path, {"kind": kind, "task": task, "samples_file": "s.jsonl", "curve": curve})


def test_best_of_n_tables_in_gem_order_with_lm_eval_results_and_curves(tmp_path: Path) -> None:
    """One table per benchmark that some run has (GSM8K, MATH, AlpacaEval best-of-n, HumanEval, MBPP+ in that
    order), the columns at GEM's k; an lm-eval task's metrics (percent already) before a voting / reward curve."""
    gsm8k = {m: 40.0 + i for i, m in enumerate(VOTE_COLUMNS)} | {"no_answer": 3.0, "mv@1": 1.0}
    _lm_eval(tmp_path / "ce" / "r.json", {"distmatch_gsm8k": gsm8k, "distmatch_math": {"mv@4": 12.5}})
    _curve(tmp_path / "ce" / "math.json", "distmatch.voting", "math", {"mv@4": 99.0, "bon@4": 99.0})
    # a curve of 8 samples: no value at k = 16, 32
    curve = {f"{f}@{k}": 10.0 * k + (f == "bon") for f in ("mv", "bon") for k in range(1, 9)}
    _curve(tmp_path / "gem" / "math.json", "distmatch.voting", "math", curve)
    reward = {"reward_bon@4": 1.1, "reward_bon@32": 2.5, "win_rate_bon@4": 25.0, "win_rate_bon@8": 31.25}
    _curve(tmp_path / "gem" / "reward.json", "distmatch.reward", "alpacaeval_bon", reward)
    code = {"distmatch_humaneval": {"pass@10": 55.5, "pass@100": 70.25, "pass@1": 9.0}}
    _lm_eval(tmp_path / "gem" / "code.json", code)
    runs = [collect_run(n, [tmp_path / n]) for n in ("ce", "gem")]
    used: set[tuple[str, str]] = set()
    lines = md.best_of_n_section(runs, True, "OPT-2.7B", used)  # no published row of that model
    assert (
        used == set()
        and _text(lines)
        == f"""### GSM8K voting / coverage (GEM Tables 5, 7; %)

{VOTE}
| **ce** | 40.00 | 41.00 | 42.00 | 43.00 | 44.00 | 45.00 | 46.00 | 47.00 |

### MATH voting / coverage (GEM Table 8; %)

{VOTE}
| **ce** | 12.50 | – | – | – | – | – | – | – |
| **gem** | 40.00 | 80.00 | – | – | 41.00 | 81.00 | – | – |

### AlpacaEval best-of-n (GEM Table 4; reward, win rate %)

| run | reward_bon@4 | reward_bon@8 | reward_bon@16 | reward_bon@32 | win_rate_bon@4 | win_rate_bon@8 | win_rate_bon@16 | win_rate_bon@32 |
|---|---|---|---|---|---|---|---|---|
| **gem** | 1.10 | – | – | 2.50 | 25.00 | 31.25 | – | – |

### HumanEval pass@k (GEM Tables 6, 9; %)

{PASS}
| **gem** | 55.50 | – | – | 70.25 |

{BON_NOTE}
"""
    )


def test_best_of_n_published_rows_of_gem_tables_5_and_7(tmp_path: Path) -> None:
    """GSM8K's published rows: Table 5 (UltraFeedback) then Table 7 (MetaMathQA); the Figure 3 text record holds
    no value of these columns and has no row. MBPP+ alone: its own table."""
    tasks = {"distmatch_gsm8k": {"mv@4": 50.0}, "distmatch_mbpp_plus": {"pass@20": 66.5}}
    path = _lm_eval(tmp_path / "r.json", tasks)
    used: set[tuple[str, str]] = set()
    lines = md.best_of_n_section([collect_run("r", [path])], True, None, used)
    expected = f"""### GSM8K voting / coverage (GEM Tables 5, 7; %)

{VOTE}
| **r** | 50.00 | – | – | – | – | – | – | – |
| CE · Llama-3-8B [GEM Table 5] | 51.63 | 55.57 | 58.61 | 62.17 | 65.28 | 74.68 | 82.11 | 90.22 |
| CE+WD · Llama-3-8B [GEM Table 5] | 54.51 | 58.76 | 62.47 | 65.66 | 69.90 | 77.48 | 84.46 | 90.45 |
| CE+Entropy · Llama-3-8B [GEM Table 5] | 53.75 | 56.63 | 60.58 | 64.44 | 67.32 | 76.57 | 83.93 | 91.21 |
| GEM-Linear · Llama-3-8B [GEM Table 5] | 53.68 | 58.07 | 62.77 | 65.58 | 69.83 | 79.30 | 86.50 | 91.96 |
| GEM-LS · Llama-3-8B [GEM Table 5] | 55.95 | 60.42 | 64.82 | 67.02 | 70.05 | 79.68 | 86.96 | 92.72 |
| CE · Llama-3-8B [GEM Table 7] | 73.46 | 73.77 | 75.13 | 76.57 | 76.50 | 80.74 | 85.14 | 90.67 |
| CE+WD · Llama-3-8B [GEM Table 7] | 73.84 | 75.06 | 76.50 | 78.24 | 77.94 | 81.05 | 86.05 | 90.67 |
| CE+Entropy · Llama-3-8B [GEM Table 7] | 75.06 | 76.04 | 77.71 | 79.68 | 79.61 | 83.70 | 88.70 | 92.95 |
| GEM-Linear · Llama-3-8B [GEM Table 7] | 74.83 | 75.82 | 78.09 | 78.77 | 81.43 | 85.60 | 89.69 | 93.56 |
| GEM-LS · Llama-3-8B [GEM Table 7] | 75.21 | 76.35 | 77.33 | 79.53 | 80.82 | 85.06 | 89.31 | 93.33 |
"""
    assert _text(lines[:16]) == expected
    expected = f"""
### MBPP+ pass@k (GEM Tables 6, 9; %)

{PASS}
| **r** | – | 66.50 | – | – |
| CE · Llama-3-8B [GEM Table 6] | 62.71 | 65.73 | 69.13 | 71.18 |
| CE+WD · Llama-3-8B [GEM Table 6] | 63.13 | 66.35 | 69.40 | 71.35 |"""
    assert _text(lines[15:23]) == expected
    assert lines[-3:] == ["", BON_NOTE, ""] and len(lines) == 20 + 11 + 3
    assert used == {(GEM, "Table 5"), (GEM, "Table 7"), (GEM, "Table 6"), (GEM, "Table 9")}
    assert md.best_of_n_section([_other(tmp_path)], True, None, set()) == []


def test_other_tasks_table_lists_every_unknown_task_metric_sorted(tmp_path: Path) -> None:
    """Tasks of no benchmark: one row per (run, task, metric), tasks and metrics sorted, fractions x100 and
    perplexities as they are; stderr and known benchmarks' tasks left out."""
    a = {"zeta": {"acc": 0.25, "acc_norm": 0.5}, "alpha": {"word_perplexity": 12.3456}}
    a["distmatch_sst2"] = {"acc": 0.5}
    _lm_eval(tmp_path / "a.json", a)
    _lm_eval(tmp_path / "b.json", {"alpha": {"bits_per_byte": 0.75}})
    runs = [collect_run(n, [tmp_path / f"{n}.json"]) for n in ("b", "a")]
    expected = """### Other lm-eval tasks (fractions shown x100)

| run | task | metric | value |
|---|---|---|---|
| **b** | alpha | bits_per_byte | 0.75 |
| **a** | alpha | word_perplexity | 12.35 |
| **a** | zeta | acc | 25.00 |
| **a** | zeta | acc_norm | 50.00 |
"""
    assert _text(md.other_tasks_section(runs)) == expected
    known = {"distmatch_gsm8k": {"mv@4": 1.0}, "ifeval": {"prompt_level_strict_acc": 0.5}}
    assert md.other_tasks_section([collect_run("k", [_lm_eval(tmp_path / "k.json", known)])]) == []


DIVERSITY_NOTE = (
    "All diversity values are on the GEM paper's 0-100 scale (higher = more diverse). Only runs scored with "
    "GEM's published protocol (`distmatch-eval diversity --protocol gem_official`, or the lm-eval tasks with "
    '`--metadata \'{"protocol": "gem_official"}\'` and `--apply_chat_template`: prompt + response, '
    "Self-BLEU against one other sample, bert-large-nli-stsb-mean-tokens) on the full prompt set with 16 "
    "samples are comparable with the published rows; MAUVE is comparable with the EMO paper only with `--mauve-featurizer "
    "lm:gpt2-large` and the paper's data and lengths."
)
GEM_DIFF = (
    "Differences from the GEM evaluation protocol (16 samples, full prompt set, the released script's scoring; "
    "numbers not directly comparable):"
)
RESPONSE_ONLY = "response-only text (GEM's script scored prompt + response)"
PAPER_SETTINGS = {"scoring": "prompt+response", "self_bleu": {"gem_compat": True}}
PAPER_SETTINGS["sbert"] = {"name": "sentence-transformers/bert-large-nli-stsb-mean-tokens"}


def _diversity(path: Path, benchmark: str | None, metrics: dict, **extra: object) -> Path:
    """A ``distmatch-eval diversity`` output."""
    data = {"kind": "distmatch.diversity", "format_version": 1, "samples_file": f"samples/{path.stem}.jsonl"}
    data.update(benchmark=benchmark, num_prompts=3, metrics=metrics, protocol="default")
    settings = {"scoring": "response", "self_bleu": {"gem_compat": False}, "sbert": {"name": "org/mini"}}
    data["settings"] = settings
    data["protocol_differences"] = ["4 samples per prompt (paper: 16)", RESPONSE_ONLY]
    return _write(path, {**data, **extra})


def test_diversity_tables_per_benchmark_with_the_published_rows(tmp_path: Path) -> None:
    """One table per benchmark (or unnamed samples file), each run's scorings of it (a non-default scoring
    labelled after the run's name), the differences from GEM's protocol numbered under the table; GEM Table 2's
    rows "as published", the GEM repository's rows with its script's scoring, EMO Table 1's MAUVE with gpt2-large
    features."""
    ce = tmp_path / "ce"
    poem = {"ngram_diversity": 40.0, "self_bleu_diversity": 70.0, "sbert_diversity": 20.0}
    _diversity(ce / "poem.json", "gem_poem", poem)
    paper = {"ngram_diversity": 41.5, "self_bleu_diversity": 60.25}
    _diversity(ce / "poem_gem.json", "gem_poem", paper, settings=PAPER_SETTINGS, protocol_differences=[])
    metrics = {"ngram_diversity": 55.5, "self_bleu_diversity": 75.25, "sbert_diversity": 24.0}
    poem_task = {"distmatch_poem_diversity": metrics}
    _lm_eval(tmp_path / "gem" / "poem" / "r.json", poem_task, GEM_OFFICIAL, chat_template="m")
    free = {"settings": {}, "protocol_differences": [], "samples_file": "samples/free_verse.jsonl"}
    _diversity(tmp_path / "gem" / "free.json", None, {"mauve": 66.0}, **free)  # named by its samples file
    wt2 = {"settings": {}, "protocol_differences": []}
    _diversity(tmp_path / "gem" / "wt2.json", "emo_lm_wikitext2", {"mauve": 81.0}, **wt2)
    runs = [collect_run(n, [tmp_path / n]) for n in ("ce", "gem")]
    used: set[tuple[str, str]] = set()
    mauve = zip(("MLE", "TaiLr", "MixCE", "EMO"), ("77.50", "79.60", "78.30", "87.50"))
    emo_rows = [f"| {m} · GPT-2 [EMO Table 1] | {v} | gpt2-large features |" for m, v in mauve]
    mauve = zip(("MLE", "TaiLr", "MixCE", "EMO"), ("77.20", "78.40", "78.60", "82.90"))
    emo_rows += [f"| {m} · OPT-125M [EMO Table 1] | {v} | gpt2-large features |" for m, v in mauve]
    gem_script, table2 = "GEM script (prompt+response, 1 ref)", "as published (see notes)"
    expected = f"""## Diversity

### Poem writing (GEM): `gem_poem`

| run | N-gram div. | Self-BLEU div. | Sentence-BERT div. | scoring |
|---|---|---|---|---|
| **ce** [1] | 40.00 | 70.00 | 20.00 | response; Self-BLEU: all refs; SBERT: mini |
| **ce** (gem-compat) | 41.50 | 60.25 | – | prompt+response; Self-BLEU: 1 ref (GEM script); SBERT: bert-large-nli-stsb-mean-tokens |
| **gem** | 55.50 | 75.25 | 24.00 | lm-eval task distmatch_poem_diversity, protocol gem_official (paper-comparable) |
| CE · Llama-3-8B [GEM Table 2] | 48.50 | 72.50 | 21.79 | {table2} |
| CE+WD · Llama-3-8B [GEM Table 2] | 48.58 | 71.29 | 21.80 | {table2} |
| CE+Entropy · Llama-3-8B [GEM Table 2] | 53.74 | 75.82 | 23.80 | {table2} |
| GEM-Linear · Llama-3-8B [GEM Table 2] | 56.50 | 76.73 | 24.73 | {table2} |
| GEM-LS · Llama-3-8B [GEM Table 2] | 56.55 | 76.31 | 24.63 | {table2} |
| CE · Llama-3-8B [GEM repo result.md (poem writing)] | 44.40 | 65.10 | 11.90 | {gem_script} |
| GEM-Linear · Llama-3-8B [GEM repo result.md (poem writing)] | 52.80 | 66.40 | 13.20 | {gem_script} |

{GEM_DIFF}

1. **ce**: 4 samples per prompt (paper: 16); {RESPONSE_ONLY}.

### `free_verse`

| run | MAUVE | scoring |
|---|---|---|
| **gem** | 66.00 |  |

### Open-ended generation: WikiText-2: `emo_lm_wikitext2`

| run | MAUVE | scoring |
|---|---|---|
| **gem** | 81.00 |  |
{_text(emo_rows)}

{DIVERSITY_NOTE}
"""
    assert _text(md.diversity_section(runs, True, None, used)) == expected
    repo = ("GEM repository (liziniu/GEM), result.md", "result.md (poem writing)")
    assert used == {(GEM, "Table 2"), repo, (EMO, "Table 1")}


def test_diversity_table_without_published_rows_and_missing_columns(tmp_path: Path) -> None:
    """Without the papers' rows: the runs alone; a benchmark's columns are its metrics even when no run has one
    (GEM Table 2's three), after the ones the runs have; the published rows of another model filtered out; no
    diversity result: no section."""
    path = _diversity(
        tmp_path / "a.json", "gem_story", {"mauve": 50.0, "sbert_diversity": 30.0}, protocol_differences=[]
    )
    run = collect_run("a", [path])
    used: set[tuple[str, str]] = set()
    expected = f"""## Diversity

### Story writing (GEM): `gem_story`

| run | Sentence-BERT div. | MAUVE | N-gram div. | Self-BLEU div. | scoring |
|---|---|---|---|---|---|
| **a** | 30.00 | 50.00 | – | – | response; Self-BLEU: all refs; SBERT: mini |

{DIVERSITY_NOTE}
"""
    assert _text(md.diversity_section([run], False, None, used)) == expected and used == set()
    assert _text(md.diversity_section([run], True, "OPT", used)) == expected and used == set()
    assert md.diversity_section([_other(tmp_path)], True, None, used) == []


PROBE = {
    "prompt": "Give me a single-digit number",
    "tokens": ["7", " ", "\ufffd", "3"],
    "token_ids": [22, 5, 300, 18],
}
PROBE.update(
    token_pieces=["7", "Ġ", "<0xE2>", "3"], probs=[0.5, 0.25, 0.125, 0.0625], entropy=1.23456, top1_prob=0.5
)
NT_HEAD = """## Next-token distributions

| run | data | perplexity | mean entropy (nats) | mean top-1 prob | top-1 acc | tokens |
|---|---|---|---|---|---|---|
"""
NT_NOTE = "\nToken-level means over the scored (response) tokens; perplexity = exp(mean NLL).\n"
PROBES = """Probe prompts (first response token; entropy in nats over the full vocabulary):

| run | prompt | entropy | top-1 prob | top tokens |
|---|---|---|---|---|
"""
TOP3 = "'7' 0.500, 'Ġ' 0.250, '<0xE2>' 0.125"


def _nexttoken(
    path: Path, benchmark: str | None, data_file: str | None, stats: tuple | None, probes: list
) -> Path:
    data = {"kind": "distmatch.nexttoken", "model": "out/x", "benchmark": benchmark, "data_file": data_file}
    if stats is not None:
        keys = ("perplexity", "mean_entropy", "mean_top1_prob", "top1_accuracy", "num_tokens")
        data["stats"] = {**dict(zip(keys, stats)), "mean_nll": math.log(stats[0]), "num_sequences": 4}
    return _write(path, {**data, "probes": probes})


def test_nexttoken_table_with_gem_perplexities_and_the_probes(tmp_path: Path) -> None:
    """Perplexity (2 decimals), mean entropy (3), mean top-1 probability and top-1 accuracy (4), the token count;
    a result without a benchmark named by its data file; GEM Sec. 5.1's perplexities under the benchmark's runs;
    then the probes: prompt, entropy, top-1 probability and the three most likely tokens."""
    stats = (3.5, 1.23456, 0.612345, 0.55557, 1234)
    _nexttoken(tmp_path / "ce" / "nt.json", "ultrafeedback_test", "uf.jsonl", stats, [PROBE])
    _nexttoken(tmp_path / "gem" / "nt.json", None, "data/uf_test.jsonl", (3.25, 2.0, 0.5, 0.25, 99), [])
    fruit = {**PROBE, "prompt": "Tell me a type of fruit", "entropy": 0.5}
    _nexttoken(tmp_path / "gem" / "a_probes.json", None, None, None, [fruit])  # read before the statistics
    runs = [collect_run(n, [tmp_path / n]) for n in ("ce", "gem")]
    used: set[tuple[str, str]] = set()
    ce_row = "| **ce** | ultrafeedback_test | 3.50 | 1.235 | 0.6123 | 0.5556 | 1234 |\n"
    gem_row = "| **gem** | uf_test.jsonl | 3.25 | 2.000 | 0.5000 | 0.2500 | 99 |\n"
    fruit_row = f"| **gem** | Tell me a type of fruit | 0.500 | 0.5000 | {TOP3} |\n"
    sec51 = [
        f"| {m} · Llama-3-8B [GEM Sec. 5.1 text] | ultrafeedback_test | {v} | – | – | – | – |"
        for m, v in (("CE", "3.48"), ("GEM-Linear", "3.16"), ("GEM-LS", "3.16"))
    ]
    probes = PROBES + f"| **ce** | Give me a single-digit number | 1.235 | 0.5000 | {TOP3} |\n" + fruit_row
    text = NT_HEAD + ce_row + gem_row + _text(sec51) + "\n" + NT_NOTE + "\n" + probes
    assert _text(md.nexttoken_section(runs, True, None, used)) == text and used == {(GEM, "Sec. 5.1 text")}
    used = set()
    assert _text(md.nexttoken_section(runs[:1], True, "OPT", used)).startswith(NT_HEAD + ce_row + NT_NOTE)
    assert used == set()
    probes_only = collect_run("p", [tmp_path / "gem" / "a_probes.json"])
    p_row = fruit_row.replace("**gem**", "**p**")
    expected = "## Next-token distributions\n\n" + PROBES + p_row
    assert _text(md.nexttoken_section([probes_only], True, None, used)) == expected
    no_probes = collect_run("n", [tmp_path / "gem" / "nt.json"])
    n_row = gem_row.replace("**gem**", "**n**")
    assert _text(md.nexttoken_section([no_probes], False, None, used)) == NT_HEAD + n_row + NT_NOTE
    _nexttoken(tmp_path / "nothing.json", "my_data", None, None, [])
    assert (
        md.nexttoken_section([collect_run("x", [tmp_path / "nothing.json"])], True, None, used) == []
        and not used
    )


TRAINING_NOTE = (
    "Last logged values of `trainer_state.json` (`log_history`); CE / entropy / token accuracy are logged by "
    "the distmatch trainers next to the objective. Eval perplexity = exp(eval CE), else exp(eval loss) below 50 "
    "(none above: a diverged run)."
)


def test_training_table_shows_the_last_logged_values(tmp_path: Path) -> None:
    """The last training log's loss / CE / entropy / token accuracy, the last evaluation's loss, perplexity
    (exp(eval CE), else exp(eval loss)) and entropy; steps: global_step, else the last log's step."""
    train = {"loss": 3.0, "ce": 2.9, "entropy": 1.9, "mean_token_accuracy": 0.4}
    history = [{"step": 10, "epoch": 0.5, **train}]
    history.append(
        {"step": 10, "epoch": 0.5, "eval_loss": 2.75, "eval_ce": math.log(6.0), "eval_entropy": 1.5}
    )
    history.append(
        {"step": 20, "epoch": 1.0, "loss": 2.5, "ce": 2.25, "entropy": 1.75, "mean_token_accuracy": 0.6}
    )
    history.append(
        {"step": 20, "epoch": 1.0, "eval_loss": 2.3456, "eval_ce": math.log(5.0), "eval_entropy": 1.25}
    )
    history.append({"step": 20, "epoch": 1.25, "train_runtime": 9.0})
    _write(tmp_path / "ce" / "trainer_state.json", {"global_step": 20, "log_history": history})
    # no CE logged, the evaluation's loss only: perplexity exp(eval loss); no global_step: the last log's step
    plain = [{"step": 7, "epoch": 0.75, "loss": 1.5}, {"step": 8, "epoch": 0.8, "eval_loss": math.log(8.0)}]
    _write(tmp_path / "plain" / "trainer_state.json", {"global_step": None, "log_history": plain})
    # a diverged evaluation (exp of it overflows the table): no perplexity
    diverged = [{"step": 3, "epoch": 2.0, "loss": 9.0}, {"step": 3, "eval_loss": 60.0}]
    _write(tmp_path / "diverged" / "trainer_state.json", {"global_step": 3, "log_history": diverged})
    runs = [collect_run(n, [tmp_path / n]) for n in ("ce", "plain", "diverged")]
    runs.insert(1, _other(tmp_path))  # no trainer state: no row
    expected = f"""## Training

| run | steps | epoch | train loss | train CE | train entropy | token acc | eval loss | eval ppl | eval entropy |
|---|---|---|---|---|---|---|---|---|---|
| **ce** | 20 | 1.25 | 2.50 | 2.25 | 1.75 | 0.60 | 2.35 | 5.00 | 1.25 |
| **plain** | 8 | 0.80 | 1.50 | – | – | – | 2.08 | 8.00 | – |
| **diverged** | 3 | – | 9.00 | – | – | – | 60.00 | – | – |

{TRAINING_NOTE}
"""
    assert _text(md.training_section(runs)) == expected
    assert md.training_section(runs[1:2]) == []
    summary = {
        "steps": 20,
        "epoch": 1.25,
        "loss": 2.5,
        "ce": 2.25,
        "entropy": 1.75,
        "mean_token_accuracy": 0.6,
    }
    summary.update(eval_loss=2.3456, eval_ppl=5.0, eval_entropy=1.25)
    assert md.training_summary(runs[0].training) == pytest.approx(summary)
    assert md.training_summary({"log_history": []}) == dict.fromkeys(summary)
