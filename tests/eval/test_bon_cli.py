"""distmatch-eval voting / reward: first-k curves over saved samples (lm-eval samples files and generate JSONL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_tasks import cli


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_voting_curve_from_an_lm_eval_samples_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [
        {
            "doc": {"gold": "7"},
            "filtered_resps": [["The answer is: 8", "The answer is: 7", "The answer is 7", "x"]],
        },
        {"doc": {"gold": "3"}, "filtered_resps": [["none", "none", "The answer is: 3", "The answer is: 3"]]},
    ]
    path = _write_jsonl(tmp_path / "samples_distmatch_gsm8k.jsonl", records)
    out = tmp_path / "curve.json"
    assert cli.main(["voting", "--samples", str(path), "--task", "gsm8k", "-o", str(out)]) == 0
    result = json.loads(out.read_text())
    # q0 answers 8,7,7,None; q1 None,None,3,3. k=1: MV q0 8 no, q1 None no -> 0; BON 0.
    # k=2: MV q0 tie 8/7 -> 8 (first) no; q1 None; BON q0 yes -> 50. k=3: MV q0 7 yes, q1 None (2 vs 1) -> 50; BON 100.
    # k=4: MV q0 7 (2 vs 1 vs 1) yes; q1 tie None/3 -> None no -> 50; BON 100.
    assert result["curve"] == {
        "mv@1": 0.0,
        "bon@1": 0.0,
        "mv@2": 0.0,
        "bon@2": 50.0,
        "mv@3": 50.0,
        "bon@3": 100.0,
        "mv@4": 50.0,
        "bon@4": 100.0,
    }
    assert (result["num_questions"], result["num_samples"]) == (2, 4)
    assert capsys.readouterr().out.splitlines()[:2] == ["k | mv | bon", "1 | 0.00 | 0.00"]


def test_voting_reads_gold_from_generate_records(tmp_path: Path) -> None:
    math = _write_jsonl(
        tmp_path / "math.jsonl",
        [{"prompt": "p", "solution": "so \\boxed{\\frac{1}{2}}", "samples": ["The answer is: 0.5", "no"]}],
    )
    out = tmp_path / "m.json"
    assert cli.main(["voting", "--samples", str(math), "--task", "math", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["curve"] == {
        "mv@1": 100.0,
        "bon@1": 100.0,
        "mv@2": 100.0,
        "bon@2": 100.0,
    }
    gsm = _write_jsonl(
        tmp_path / "gsm.jsonl", [{"prompt": "p", "answer": "1+1=2\n#### 2", "samples": ["the answer is 2"]}]
    )
    assert cli.main(["voting", "--samples", str(gsm), "--task", "gsm8k", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["curve"] == {"mv@1": 100.0, "bon@1": 100.0}


def test_voting_reads_an_fbox_gold_and_refuses_a_solution_without_a_box(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A MATH solution's \\fbox{...} is its gold answer as a \\boxed{...} is (math_answers.math_gold_answer); a
    solution with no readable box is refused instead of voting against the string "None"."""
    rows = [
        {"prompt": "p0", "solution": "so $\\fbox{4}$", "samples": ["The answer is: 4", "The answer is: 5"]},
        {"prompt": "p1", "solution": "$\\fbox{ \\frac{1}{2} }$", "samples": ["no", "The answer is: 0.5"]},
        {
            "prompt": "p2",
            "solution": "\\boxed{3} beside \\fbox{4}",
            "samples": ["The answer is: 4", "The answer is: 3"],
        },
    ]
    math = _write_jsonl(tmp_path / "math.jsonl", rows)
    out = tmp_path / "m.json"
    assert cli.main(["voting", "--samples", str(math), "--task", "math", "-o", str(out)]) == 0
    # k=1: p0 4 yes, p1 None no, p2 4 no (gold 3) -> 1/3; k=2: BON all three; MV p0 4 (tie, first), p1 tie None
    # first -> no, p2 4 first -> no.
    curve = json.loads(out.read_text())["curve"]
    assert curve["bon@1"] == pytest.approx(100 / 3) and curve["bon@2"] == 100.0, curve
    assert curve["mv@2"] == pytest.approx(100 / 3), curve
    capsys.readouterr()
    unboxed = _write_jsonl(
        tmp_path / "u.jsonl",
        [{"prompt": "p", "solution": "the answer is 4", "samples": ["The answer is: None"]}],
    )
    assert cli.main(["voting", "--samples", str(unboxed), "--task", "math", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no readable \\boxed{...} or \\fbox{...}" in err, err


def test_voting_refuses_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uneven = _write_jsonl(
        tmp_path / "u.jsonl", [{"gold": "1", "samples": ["a"]}, {"gold": "1", "samples": ["a", "b"]}]
    )
    assert (
        cli.main(["voting", "--samples", str(uneven), "--task", "gsm8k", "-o", str(tmp_path / "o.json")]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "different sample counts ([1, 2])" in err
    no_gold = _write_jsonl(tmp_path / "g.jsonl", [{"samples": ["a"]}])
    assert (
        cli.main(["voting", "--samples", str(no_gold), "--task", "math", "-o", str(tmp_path / "o.json")]) == 2
    )
    assert "no gold answer: give each record a gold or solution" in capsys.readouterr().err


def test_reward_scores_samples_and_gpt4_references(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    from eval_tasks.best_of_n.best_of_n import RewardScorer
    from eval_tasks.metrics.voting import reward_best_of_n, win_rate_best_of_n
    from trl_ext.testing import build_tiny_reward_model, build_tokenizer

    rm = build_tiny_reward_model(tmp_path / "rm", build_tokenizer(), seed=5)
    prompts = ["How do I boil an egg?", "Give three tips for staying healthy."]
    samples = _write_jsonl(
        tmp_path / "gen.jsonl",
        [
            {"id": i, "prompt": p, "samples": [f"answer {j} to {p}" for j in range(3)]}
            for i, p in enumerate(prompts)
        ],
    )
    # The alpaca_eval repository's results/gpt4_1106_preview/model_outputs.json: a JSON list, in another order.
    refs = tmp_path / "model_outputs.json"
    refs.write_text(
        json.dumps(
            [
                {"instruction": p, "output": f"GPT-4 says {p}", "generator": "gpt4_1106_preview"}
                for p in prompts[::-1]
            ]
        )
    )
    out = tmp_path / "rewards.json"
    args = [
        "reward",
        "--samples",
        str(samples),
        "--reward-model",
        str(rm),
        "--references",
        str(refs),
        "-o",
        str(out),
    ]
    assert cli.main(args) == 0
    result = json.loads(out.read_text())
    report = tmp_path / "report"  # the reward curve in the report: one line per run, k = 1..3
    assert cli.main(["report", "--run", f"rm={out}", "-o", str(report)]) == 0
    drawn = json.loads((report / "report.json").read_text())["first_k_curves"]["alpacaeval_bon"]
    assert (report / "first_k_alpacaeval_bon.png").stat().st_size > 0
    for family in ("reward_bon", "win_rate_bon"):
        assert drawn[family]["runs"] == {"rm": [[k, result["curve"][f"{family}@{k}"]] for k in range(1, 4)]}
    assert drawn["win_rate_bon"]["published"]["GEM-LS · Llama-3-8B [GEM Table 4]"][-1][0] == 32
    scorer = RewardScorer(str(rm))
    expected_rewards = [scorer.score([p] * 3, [f"answer {j} to {p}" for j in range(3)]) for p in prompts]
    expected_refs = [scorer.score([p], [f"GPT-4 says {p}"])[0] for p in prompts]
    got_rewards = [x for r in result["records"] for x in r["rewards"]]
    assert got_rewards == pytest.approx([x for row in expected_rewards for x in row], abs=1e-5)
    assert [r["reference_reward"] for r in result["records"]] == pytest.approx(expected_refs, abs=1e-5)
    ks = range(1, 4)
    expected = {
        **reward_best_of_n(expected_rewards, ks),
        **win_rate_best_of_n(expected_rewards, expected_refs, ks),
    }
    assert result["curve"] == pytest.approx(expected, abs=1e-4)
    assert "k | reward_bon | win_rate_bon\n1 | " in capsys.readouterr().out
    missing = tmp_path / "few.json"
    missing.write_text(json.dumps([{"instruction": prompts[0], "output": "x"}]))
    args[args.index(str(refs))] = str(missing)
    assert cli.main(args) == 2
    assert "no reference output for the prompt of record 1" in capsys.readouterr().err


def test_report_puts_a_run_beside_the_published_best_of_n_rows(tmp_path: Path) -> None:
    """`distmatch-eval report` on an lm-eval results file of distmatch_gsm8k: the run's percent values as they are
    (not x100 again), next to GEM Table 5's and Table 7's rows."""
    results = {
        "results": {
            "distmatch_gsm8k": {
                "name": "distmatch_gsm8k",
                "mv@4,none": 52.5,
                "mv@4_stderr,none": 1.0,
                "bon@4,none": 66.25,
                "no_answer,none": 3.0,
            }
        },
        "configs": {"distmatch_gsm8k": {"task": "distmatch_gsm8k", "metadata": {"bon_samples": 4}}},
        "config": {"model": "hf", "model_args": "pretrained=x"},
    }
    path = tmp_path / "run" / "results_2026-01-01T00-00-00.json"
    path.parent.mkdir()
    path.write_text(json.dumps(results))
    out = tmp_path / "report"
    assert cli.main(["report", "--run", f"mine={path}", "-o", str(out)]) == 0
    report = (out / "report.md").read_text()
    section = report.split("### GSM8K voting / coverage (GEM Tables 5, 7; %)", 1)[1].split("\n\n", 2)[1]
    lines = section.splitlines()
    assert lines[0].startswith("| run | mv@4 | mv@8 | mv@16 | mv@32 | bon@4 |")
    mine = next(line for line in lines if "mine" in line)
    assert "52.50" in mine and "66.25" in mine and "5250" not in mine
    rows = {line.split(" | ")[0]: line for line in lines}
    assert "| 51.63 | 55.57 | 58.61 | 62.17 | 65.28 |" in rows["| CE · Llama-3-8B [GEM Table 5]"]
    assert "| 73.46 | 73.77 | 75.13 | 76.57 | 76.50 |" in rows["| CE · Llama-3-8B [GEM Table 7]"]
    assert "### Other lm-eval tasks" not in report  # shown once, in its own section
    assert "Sec. 5.2 text" not in report  # Figure 3's differences to CE: no value of these columns, no row


def test_report_plots_first_k_curves_beside_the_published_points(tmp_path: Path) -> None:
    """`distmatch-eval voting` output of two runs -> `distmatch-eval report`: first_k_gsm8k.png is written, and the
    lines drawn in it (read back from the figure, in report.json) are the runs' curves and GEM's Table 5 / 7 points."""
    answers = {
        "a": ["The answer is: 8", "The answer is: 7", "The answer is: 7", "The answer is: 8"],
        "b": ["8", "8", "8", "8"],
    }
    curves = {}
    for run, resps in answers.items():
        path = _write_jsonl(tmp_path / f"{run}.jsonl", [{"doc": {"gold": "7"}, "filtered_resps": [resps]}])
        out = tmp_path / f"{run}_curve.json"
        assert cli.main(["voting", "--samples", str(path), "--task", "gsm8k", "-o", str(out)]) == 0
        curves[run] = json.loads(out.read_text())["curve"]
    # a: answers 8, 7, 7, 8 -> MV 0, 0 (tie: 8 seen first), 100, 0 (tie again); coverage 0, 100, 100, 100.
    assert [curves["a"][f"mv@{k}"] for k in range(1, 5)] == [0.0, 0.0, 100.0, 0.0]
    assert [curves["a"][f"bon@{k}"] for k in range(1, 5)] == [0.0, 100.0, 100.0, 100.0]
    report = tmp_path / "report"
    args = ["report", "--run", f"a={tmp_path / 'a_curve.json'}", "--run", f"b={tmp_path / 'b_curve.json'}"]
    assert cli.main([*args, "-o", str(report)]) == 0
    png = report / "first_k_gsm8k.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((report / "report.json").read_text())
    assert data["plots"]["first_k_gsm8k"] == "first_k_gsm8k.png"
    drawn = data["first_k_curves"]["gsm8k"]
    assert set(data["first_k_curves"]) == {"gsm8k"} and set(drawn) == {"mv", "bon"}
    for family in ("mv", "bon"):
        assert drawn[family]["runs"] == {
            run: [[k, curve[f"{family}@{k}"]] for k in range(1, 5)] for run, curve in curves.items()
        }
    assert drawn["mv"]["published"]["CE · Llama-3-8B [GEM Table 5]"] == [
        [4, 51.63],
        [8, 55.57],
        [16, 58.61],
        [32, 62.17],
    ]
    assert drawn["bon"]["published"]["CE · Llama-3-8B [GEM Table 7]"][0] == [4, 76.50]
    assert len(drawn["mv"]["published"]) == 10  # 5 methods x Tables 5 and 7
    md = (report / "report.md").read_text()
    assert "![First-k curves: GSM8K](first_k_gsm8k.png)" in md
    assert "| **a** | 0.00 | – | – | – | 100.00 |" in md  # the table takes the curve's mv@4 / bon@4
    assert cli.main([*args, "-o", str(tmp_path / "bare"), "--no-published"]) == 0
    bare = json.loads((tmp_path / "bare" / "report.json").read_text())["first_k_curves"]["gsm8k"]
    assert bare["mv"]["published"] == {} and bare["mv"]["runs"] == drawn["mv"]["runs"]


def test_report_refuses_a_malformed_curve_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "curve.json"
    for data, message in [
        (
            {"kind": "distmatch.voting", "task": "mbpp", "curve": {"mv@1": 1.0}},
            "task must be one of gsm8k, math",
        ),
        (
            {"kind": "distmatch.voting", "task": "gsm8k", "curve": {"mv@0": 1.0}},
            "curve must map mv@k / bon@k",
        ),
        ({"kind": "distmatch.reward", "task": "alpacaeval_bon", "curve": {"mv@1": 1.0}}, "reward_bon@k"),
    ]:
        bad.write_text(json.dumps(data))
        assert cli.main(["report", "--run", f"x={bad}", "-o", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "r").exists()


def test_report_puts_code_pass_at_k_beside_tables_6_and_9(tmp_path: Path) -> None:
    """An lm-eval results file of distmatch_humaneval (pass@k already x100 by the task): the values as they are, GEM
    Table 6 / 9 rows beside them, and the pass@k curve plotted against k with the published points."""
    values = {"pass@1": 8.33, "pass@10": 83.33, "pass@20": 100.0}
    results = {
        "results": {
            "distmatch_humaneval": {
                "name": "distmatch_humaneval",
                **{f"{m},none": v for m, v in values.items()},
            }
        },
        "configs": {"distmatch_humaneval": {"task": "distmatch_humaneval", "metadata": {"code_samples": 20}}},
        "config": {"model": "hf", "model_args": "pretrained=x"},
    }
    path = tmp_path / "results_2026-01-01T00-00-00.json"
    path.write_text(json.dumps(results))
    out = tmp_path / "report"
    assert cli.main(["report", "--run", f"mine={path}", "-o", str(out)]) == 0
    report = (out / "report.md").read_text()
    section = report.split("### HumanEval pass@k (GEM Tables 6, 9; %)", 1)[1].split("\n\n", 2)[1]
    rows = {line.split(" | ")[0]: line for line in section.splitlines()}
    assert section.startswith("| run | pass@10 | pass@20 | pass@50 | pass@100 |")
    assert rows["| **mine**"] == "| **mine** | 83.33 | 100.00 | – | – |"  # not x100 again
    assert set(rows) >= {"| CE · Llama-3-8B [GEM Table 6]", "| GEM-LS · Llama-3-8B [GEM Table 9]"}
    assert "Sec. 5.2 text" not in report and "### Other lm-eval tasks" not in report
    drawn = json.loads((out / "report.json").read_text())["first_k_curves"]["humaneval"]["pass"]
    assert drawn["runs"] == {"mine": [[1, 8.33], [10, 83.33], [20, 100.0]]}
    assert drawn["published"]["CE · Llama-3-8B [GEM Table 9]"] == [
        [10, 58.71],
        [20, 61.5],
        [50, 64.18],
        [100, 65.86],
    ]
    assert (out / "first_k_humaneval.png").read_bytes()[:4] == b"\x89PNG"
