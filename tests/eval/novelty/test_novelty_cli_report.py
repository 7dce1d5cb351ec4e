"""`distmatch-eval novelty` on a samples file and `distmatch-eval report` with its output and an lm-eval results file.

In this process (`eval_tasks.cli.main`), on the tiny classifier and reward model built in code: the numbers are the
rules' (eval_tasks/novelty/noveltybench.py) on the scorer's outputs, GEM's n-gram / Self-BLEU diversity beside them,
the setting is recorded as not comparable (other models, 3 samples, 2 of the 100 prompts); bad input is refused in
one line; the report has a NoveltyBench table beside the published leaderboard rows and the distinct-vs-utility plot.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_tasks.cli import main
from eval_tasks.novelty import noveltybench as nb
from tests.eval.novelty.models import build_models
from tests.helpers.once import build_once

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_once(tmp_path_factory, "novelty_models", lambda root: build_models(root) and root)


def _samples_file(path: Path) -> Path:
    docs = nb.novelty_documents("curated")[:2]
    answers = [
        ["Max the dog", "max the dog", "A girl named Ana walked her old dog to the sea every day"],
        ["Paris is the capital of France, a city on the Seine", "Lyon", "lyon"],
    ]
    path.write_text(
        "".join(
            json.dumps({"id": d["id"], "prompt": d["prompt"], "samples": a}) + "\n"
            for d, a in zip(docs, answers)
        )
    )
    return path


def test_novelty_command_and_report(models: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from eval_tasks.novelty.scorers import load_scorer

    samples = _samples_file(tmp_path / "samples.jsonl")
    out = tmp_path / "novelty.json"
    argv = ["novelty", str(samples), "--classifier", str(models / "classifier"), "--reward-model"]
    argv += [
        str(models / "reward"),
        "--device",
        "cpu",
        "--batch-size",
        "2",
        "--subset",
        "curated",
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "distmatch.novelty" and result["benchmark"] == "noveltybench_curated"
    scorer = load_scorer(str(models / "classifier"), str(models / "reward"), device="cpu", batch_size=2)
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    expected = [scorer.score(r["prompt"], r["samples"]) for r in rows]
    assert [p["partition"] for p in result["per_prompt"]] == [e["partition"] for e in expected]
    assert expected[0]["partition"][:2] == [0, 0]  # "Max the dog" / "max the dog": the short-response rule
    means = nb.summarize(expected)
    assert result["metrics"]["distinct"] == pytest.approx(means["distinct"])
    assert result["metrics"]["utility"] == pytest.approx(means["utility"])
    gem = [nb.gem_diversity(r["samples"]) for r in rows]
    assert result["metrics"]["ngram_diversity"] == pytest.approx(sum(g["ngram_diversity"] for g in gem) / 2)
    setting = result["setting"]
    assert setting["comparable"] is False and setting["num_samples"] == 3
    assert "2 of the 100 NB-curated prompts" in setting["note"] and "reward model" in setting["note"]

    # the report: a NoveltyBench table with the published rows, and the plot
    lm_eval_results = tmp_path / "results_novelty.json"
    lm_eval_results.write_text(
        json.dumps(
            {
                "results": {
                    "distmatch_noveltybench_wildchat": {
                        "distinct,none": 4.5,
                        "utility,none": 3.25,
                        "alias": "x",
                    }
                },
                "configs": {
                    "distmatch_noveltybench_wildchat": {
                        "metadata": {"noveltybench_setting": nb.comparability(None, None, 10)}
                    }
                },
                "versions": {},
                "n-samples": {"distmatch_noveltybench_wildchat": {"original": 1000, "effective": 1000}},
            }
        )
    )
    report_dir = tmp_path / "report"
    assert (
        main(["report", "--run", f"mine={out}", "--run", f"lm={lm_eval_results}", "-o", str(report_dir)]) == 0
    )
    text = (report_dir / "report.md").read_text()
    section = text.split("## NoveltyBench", 1)[1]
    assert "| **mine** | noveltybench_curated |" in section and "not comparable" in section
    assert "| **lm** | noveltybench_wildchat | 4.50 | 3.25 | – | – | yes |" in section
    assert "gpt-4o" in section and "3.88" in section  # a published leaderboard row
    assert (report_dir / "novelty.png").stat().st_size > 0
    limited = json.loads(lm_eval_results.read_text())
    limited["n-samples"]["distmatch_noveltybench_wildchat"]["effective"] = 5
    lm_eval_results.write_text(json.dumps(limited))
    assert main(["report", "--run", f"lm={lm_eval_results}", "-o", str(tmp_path / "report2")]) == 0
    text = (tmp_path / "report2" / "report.md").read_text()
    assert (
        "not comparable with NoveltyBench's published numbers: 5 of the task's 1000 prompts (--limit)" in text
    )
    report = json.loads((report_dir / "report.json").read_text())
    assert report["runs"][1]["novelty"]["noveltybench_wildchat"]["metrics"] == {
        "distinct": 4.5,
        "utility": 3.25,
    }


def test_novelty_command_refusals(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    samples = _samples_file(tmp_path / "samples.jsonl")
    assert main(["novelty", str(samples), "--subset", "wildchat", "-o", str(tmp_path / "x.json")]) == 2
    assert "its prompts are not all NB-wildchat's" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "samples": []}\n')
    assert main(["novelty", str(bad), "--batch-size", "0", "-o", str(tmp_path / "y.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--batch-size must be >= 1" in err
