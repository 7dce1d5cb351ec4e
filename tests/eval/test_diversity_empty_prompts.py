"""Sentence-BERT and the other diversity metrics of prompts whose samples are all empty, through `distmatch-eval
diversity` and the lm-eval creative tasks: GEM's per-prompt definition as the oracle (docs/evaluation.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.eval.test_cli_input_files import PROMPTS, _write_jsonl, run_cli


def _official_sbert_diversity(texts: list[str]) -> float:
    """GEM's SentBertDiversity of one prompt (evaluation_diversity.py of liziniu/GEM, as in
    test_gem_diversity_protocol.py): every text embedded on its own, the cosine of every pair j < i, 100 x (1 - their
    mean); with the offline default model."""
    import numpy as np

    from eval_tasks import metrics as M

    model = M.load_sbert(None)
    emb = [np.asarray(model.encode(t), dtype=np.float64) for t in texts]
    sims = [
        float(emb[i] @ emb[j] / (np.linalg.norm(emb[i]) * np.linalg.norm(emb[j])))
        for i in range(len(emb))
        for j in range(i)
    ]
    return 100 * (1 - sum(sims) / len(sims))


#: Prompts of different sample counts, all-empty ones first, in the middle (two in a row) and last: a prompt's
#: Sentence-BERT block must hold its own samples whatever comes before it.
MIXED = [
    {"id": "blank0", "prompt": PROMPTS[0], "samples": ["", " "]},
    {
        "id": "sea",
        "prompt": PROMPTS[0],
        "samples": ["the sea is blue and deep", "waves on the old stone", "gulls"],
    },
    {"id": "blank1", "prompt": PROMPTS[1], "samples": ["", "\n", "  ", ""]},
    {"id": "blank2", "prompt": PROMPTS[1], "samples": ["", ""]},
    {"id": "night", "prompt": PROMPTS[1], "samples": ["a quiet night with stars", "the night is cold"]},
    {
        "id": "road",
        "prompt": PROMPTS[2],
        "samples": ["an old road in the rain", "the road goes on", "dust", "a road of stones"],
    },
    {"id": "blank3", "prompt": PROMPTS[2], "samples": ["\t", "", " "]},
]


@pytest.mark.parametrize("scoring", ["response", "prompt+response"])
def test_sbert_per_prompt_with_all_empty_prompts_between_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scoring: str
) -> None:
    """docs/evaluation.md: Sentence-BERT diversity of a prompt is 100 x (1 - mean cosine over the pairs of its K
    samples' embeddings), the corpus value the mean over prompts; with --allow-empty a prompt whose samples are all
    empty scores 0 on every metric, is marked all_empty and counts in the mean. Scored text: the response, or the
    prompt followed by it (prompt+response, GEM's script); the samples decide whether a prompt is all empty."""
    path = _write_jsonl(tmp_path / "mixed.jsonl", MIXED)
    out = tmp_path / "d.json"
    argv = ["diversity", path, "--allow-empty", "--scoring", scoring, "--no-progress", "-o", out]
    assert run_cli(*argv) == 0
    assert "4 prompt(s) with only empty samples scored 0 on every metric" in capsys.readouterr().err
    result = json.loads(out.read_text())
    rows = {row["id"]: row for row in result["per_prompt"]}
    assert [row["id"] for row in result["per_prompt"]] == [r["id"] for r in MIXED]
    expected = {}
    for record in MIXED:
        row = rows[record["id"]]
        assert row["num_samples"] == len(record["samples"])
        if record["id"].startswith("blank"):
            assert row.get("all_empty") is True, row
            assert (row["ngram_diversity"], row["self_bleu_diversity"], row["sbert_diversity"]) == (
                0,
                0,
                0,
            ), row
            expected[record["id"]] = 0.0
        else:
            assert "all_empty" not in row, row
            prefix = record["prompt"] + "\n" if scoring == "prompt+response" else ""
            expected[record["id"]] = _official_sbert_diversity([prefix + s for s in record["samples"]])
            assert row["sbert_diversity"] == pytest.approx(expected[record["id"]], abs=1e-4), record["id"]
    assert result["metrics"]["sbert_diversity"] == pytest.approx(
        sum(expected.values()) / len(MIXED), abs=1e-4
    )
    for key in ("ngram_diversity", "self_bleu_diversity"):  # the other two: the mean over all 7 prompts too
        assert result["metrics"][key] == pytest.approx(sum(r[key] for r in rows.values()) / len(MIXED)), key
    assert result["settings"]["all_empty_prompts"] == 4
    # Each prompt's value does not depend on the prompts around it: the file of the non-empty prompts alone agrees.
    alone = _write_jsonl(tmp_path / "alone.jsonl", [r for r in MIXED if not r["id"].startswith("blank")])
    assert run_cli("diversity", alone, "--scoring", scoring, "--no-progress", "-o", tmp_path / "a.json") == 0
    for row in json.loads((tmp_path / "a.json").read_text())["per_prompt"]:
        assert row["sbert_diversity"] == pytest.approx(rows[row["id"]]["sbert_diversity"], abs=1e-5), row[
            "id"
        ]


def test_the_lm_eval_tasks_score_an_all_empty_prompt_0_also_after_its_prompt() -> None:
    """The creative-writing tasks' per-prompt scores (diversity_scores, which DiversityTask.process_results calls):
    the same rule, with scoring: prompt+response (the prompt as the model saw it before each sample) too."""
    from eval_tasks.creative.creative import diversity_scores

    zeros = {"ngram_diversity": 0.0, "self_bleu_diversity": 0.0, "sbert_diversity": 0.0}
    assert diversity_scores(["", " ", "\n"]) == zeros
    assert diversity_scores(["", " ", "\n"], prefix="<|user|>Write a poem<|assistant|>") == zeros
    samples = MIXED[1]["samples"]
    prefix = "<|user|>" + MIXED[1]["prompt"] + "<|assistant|>"
    scores = diversity_scores(samples, prefix=prefix)
    assert scores["sbert_diversity"] == pytest.approx(
        _official_sbert_diversity([prefix + s for s in samples]), abs=1e-4
    )
    assert scores == diversity_scores([prefix + s for s in samples])


# ---------------------------------------------------------------------------------------------------------------
# GSM8K answers beyond float range
