"""distmatch-eval open-ended: prompts from a corpus fixture -> generate (forced length, ancestral, 5 rounds) with a
tiny Llama -> score (MAUVE with the tiny model as featurizer, ROUGE-1/L, oracle perplexity), and the metric
pieces against hand computations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from eval_tasks.cli import main
from eval_tasks.open_ended import open_ended as O
from eval_tasks.samples import InputError

pytest.importorskip("torch")
pytest.importorskip("mauve")
FIXTURES = Path(__file__).parent / "fixtures" / "open_ended"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from trl_ext.testing import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("open_ended") / "model")


def test_decoding_flags_are_the_scripts() -> None:
    flags = O.decoding_flags(O.CORPORA["ptb"])
    pairs = dict(zip(flags[::2], flags[1::2]))
    assert pairs["--min-new-tokens"] == "25" and pairs["--max-new-tokens"] == "26"
    assert (pairs["--top-k"], pairs["--top-p"], pairs["--temperature"], pairs["-k"]) == ("0", "1", "1", "5")
    assert pairs["--chat-template"] == "never"


def test_rouge_by_hand() -> None:
    got = O.rouge_f(["the cat sat", "a b"], ["the cat sat on the mat", "a b"])
    # pair 1: 3 of 3 predicted unigrams match, 3 of 6 reference ones -> F = 2/3; LCS = 3 likewise; pair 2: 1
    assert got["rouge1"] == pytest.approx(100 * (2 / 3 + 1) / 2)
    assert got["rougeL"] == pytest.approx(100 * (2 / 3 + 1) / 2)
    assert O.rouge_f(["x y z"], ["z y x"])["rougeL"] == pytest.approx(100 / 3)  # LCS 1 of 3


def test_oracle_perplexity_is_exp_of_the_mean_of_batch_means(tiny) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    texts = ["the river city", "a long line of words about the old king and the queen"]

    def token_ces(text: str) -> list[float]:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1], dim=-1)
        return (-logp.gather(1, ids[0, 1:, None])[:, 0]).tolist()

    ces = [token_ces(t) for t in texts]
    one_each = O.oracle_perplexity(texts, (model, tokenizer), batch_size=1, device="cpu")
    assert one_each == pytest.approx(math.exp(sum(sum(c) / len(c) for c in ces) / 2), rel=1e-4)
    together = O.oracle_perplexity(texts, (model, tokenizer), batch_size=64, device="cpu")
    pooled = [x for c in ces for x in c]  # one batch: the token mean over both texts (pads masked)
    assert together == pytest.approx(math.exp(sum(pooled) / len(pooled)), rel=1e-4)


def test_prompts_generate_score_end_to_end(tiny, tmp_path, capsys) -> None:
    prompts = tmp_path / "p.jsonl"
    data = FIXTURES / "wikitext2_test-00000-of-00001.parquet"
    assert (
        main(["open-ended", "prompts", "--corpus", "wikitext2", "--data", str(data), "-o", str(prompts)]) == 0
    )
    records = [json.loads(x) for x in prompts.read_text().splitlines()]
    assert len(records) == 23 and records[0]["id"] == "wikitext2-4"
    hint = capsys.readouterr().err
    assert "--min-new-tokens 80 --max-new-tokens 81" in hint
    out = tmp_path / "s.jsonl"
    flags = O.decoding_flags(O.CORPORA["wikitext2"], rounds=2)
    flags[flags.index("--min-new-tokens") + 1], flags[flags.index("--max-new-tokens") + 1] = "8", "9"
    assert (
        main(
            [
                "generate",
                "--model",
                str(tiny),
                "--prompts",
                str(prompts),
                "-o",
                str(out),
                "--no-progress",
                "--device",
                "cpu",
                "--dtype",
                "float32",
                "--batch-size",
                "8",
                *flags,
            ]
        )
        == 0
    )
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0]["meta"]["min_new_tokens"] == 8 and rows[0]["meta"]["top_k"] == 0
    assert all(s for r in rows for s in r["samples"])  # forced length: no empty continuation
    result_file = tmp_path / "r.json"
    argv = [
        "open-ended",
        "score",
        str(out),
        str(out),
        "--featurizer",
        f"lm:{tiny}",
        "--oracle",
        str(tiny),
        "--max-text-length",
        "32",
        "--device",
        "cpu",
        "-o",
        str(result_file),
    ]
    assert main(argv) == 0
    result = json.loads(result_file.read_text())
    assert result["protocol"] == "emo_official" and result["max_text_length"] == 32
    assert (
        result["kind"] == O.SCORE_KIND and result["benchmark"] == "emo_lm_wikitext2"
    )  # from generate's meta
    assert len(result["seeds"]) == 2 and len(result["seeds"][0]["rounds"]) == 2
    rounds = [r for s in result["seeds"] for r in s["rounds"]]
    assert result["seeds"][0]["rounds"] == result["seeds"][1]["rounds"]  # same file twice: same numbers
    assert result["mauve"]["mean"] == pytest.approx(sum(r["mauve"] for r in rounds) / 4)
    assert all(0 < r["mauve"] <= 100 and 0 <= r["rouge1"] <= 100 and r["oracle_ppl"] > 1 for r in rounds)
    # P vs P: the references scored as their own model texts give MAUVE 100 and ROUGE 100
    same = tmp_path / "same.jsonl"
    same.write_text(
        "".join(
            json.dumps({**r, "samples": [r["reference"][len(r["prompt"]) + 1 :]] * 2}) + "\n" for r in rows
        )
    )
    self_score = O.score_files([str(same)], featurizer=f"lm:{tiny}", max_text_length=32, device="cpu")
    assert self_score["mauve"]["mean"] == pytest.approx(100.0) and self_score["rouge1"][
        "mean"
    ] == pytest.approx(100)
    _report_places_the_score_beside_table_1(result_file, result, tmp_path)
    other = tmp_path / "other.jsonl"  # another corpus's samples: one score of two corpora is refused
    other.write_text(
        "".join(json.dumps({**r, "meta": {**r["meta"], "benchmark": "emo_lm_ptb"}}) + "\n" for r in rows)
    )
    with pytest.raises(InputError, match="different corpora .*emo_lm_wikitext2.*emo_lm_ptb"):
        O.score_files([str(out), str(other)], featurizer=f"lm:{tiny}", max_text_length=32, device="cpu")


def _report_places_the_score_beside_table_1(result_file: Path, result: dict, tmp_path: Path) -> None:
    """distmatch-eval report reads the score: the run's MAUVE (mean ± std over rounds and seed files) in the
    WikiText-2 column of the Table 1 section, next to the published rows, and flagged as not the paper's scoring
    (tiny featurizer, 32 tokens)."""
    from eval_tasks.report.collect import ReportError

    out = tmp_path / "report"
    assert main(["report", "--run", f"tiny={result_file}", "-o", str(out)]) == 0
    text = (out / "report.md").read_text()
    section = text[text.index("### MAUVE per corpus (EMO Table 1; x100)") :]
    header, _, mine = section.splitlines()[2:5]
    assert header == "| run | WikiText-2 |"
    mauve = result["mauve"]
    assert mine == f"| **tiny** | {mauve['mean']:.2f} ± {mauve['std']:.2f} |"
    assert (
        "| MLE · GPT-2 [EMO Table 1] | 77.50 |" in section
        and "| EMO · OPT-125M [EMO Table 1] | 82.90 |" in section
    )
    assert "(not the paper's: not comparable)" in section and "2 seed file(s) x 5 rounds" in section
    assert (
        json.loads((out / "report.json").read_text())["runs"][0]["open_ended"]["emo_lm_wikitext2"]["seeds"]
        == 2
    )
    with pytest.raises(ReportError, match="two emo_lm_wikitext2 scores"):
        from eval_tasks.report.collect import collect_run

        collect_run("twice", [result_file, result_file])


def test_the_oracle_corpus_reads_gpt2_output_dataset_records(tmp_path) -> None:
    """Table 2's data (GPT-2-large samples, the GPT-2 output dataset's JSONL records) goes through the script's
    filter and the 20 / 80 split like WebText; its results are the emo_oracle_gpt2_large benchmark."""
    from eval_tasks import published as P

    words = [f"w{i}" for i in range(120)]
    rows = [
        {"id": 0, "ended": True, "length": 5, "text": "too short to keep"},
        {"id": 1, "ended": True, "length": 120, "text": " ".join(words)},
        {"id": 2, "ended": True, "length": 60, "text": " ".join(words[:60])},  # < 20 + 80 + 10 words
    ]
    data = tmp_path / "large-762M.test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = O.corpus(O.ORACLE_CORPUS)
    examples = O.build_examples(O.read_corpus(spec.key, data), spec)
    assert [(e.row, e.prefix, e.reference) for e in examples] == [
        (1, " ".join(words[:20]), " ".join(words[:20]) + " " + " ".join(words[20:100]))
    ]
    assert O.published_benchmark(spec.key) == "emo_oracle_gpt2_large"
    assert P.benchmark_for_task("distmatch_open_ended_gpt2_large") == "emo_oracle_gpt2_large"
    assert P.benchmark_for_task("distmatch_open_ended_ptb") == O.published_benchmark("ptb") == "emo_lm_ptb"


def test_score_bad_input(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "samples": ["x"]}) + "\n")
    with pytest.raises(InputError, match="record #0 needs 'prompt', 'reference' and 'samples'"):
        O.round_texts([json.loads(bad.read_text())], str(bad))
    assert (
        main(["open-ended", "score", str(bad), "-o", str(tmp_path / "o.json"), "--max-text-length", "0"]) == 2
    )
    assert "--max-text-length must be >= 1" in capsys.readouterr().err
    assert main(["open-ended", "prompts", "--corpus", "wt2", "-o", str(tmp_path / "p.jsonl")]) == 2
    assert "--corpus 'wt2': unknown; accepted:" in capsys.readouterr().err


def test_report_keeps_the_open_ended_scales(tmp_path) -> None:
    """lm-eval results of an open-ended task: MAUVE / ROUGE already x100 and the oracle perplexity raw stay as they
    are in the report (fractions such as acc are the ones scaled x100)."""
    from eval_tasks.report.collect import collect_run

    results = {
        "results": {
            "distmatch_open_ended_ptb": {
                "alias": "ptb",
                "mauve,none": 81.5,
                "rouge1,none": 31.25,
                "rougeL,none": 20.5,
                "oracle_ppl,none": 55.0,
            }
        },
        "configs": {"distmatch_open_ended_ptb": {"metadata": {}}},
        "versions": {},
    }
    path = tmp_path / "results_x.json"
    path.write_text(json.dumps(results))
    run = collect_run("mine", [path])
    entry = run.open_ended["emo_lm_ptb"]
    assert "distmatch_open_ended_ptb" not in run.lm_eval  # shown in the open-ended section, not "other tasks"
    assert entry["metrics"] == {"mauve": 81.5, "rouge1": 31.25, "rougeL": 20.5, "oracle_ppl": 55.0}
    assert entry["via"] == "lm-eval task distmatch_open_ended_ptb"
