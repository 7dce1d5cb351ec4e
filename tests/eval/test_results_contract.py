"""eval_tasks.results against its docstrings and docs/evaluation.md, for what tests/eval/test_results.py leaves open:
the result files' keys, the protocol notes from the samples' generation settings and the benchmark's prompt count,
when the n-gram tokenizer note is written, MAUVE's mean and population spread over the sample indices with MAUVE's
seed, the next-token result's defaults (batches of 8, 1024 tokens, top 10, no progress bar), and the warning when
GEM's Sentence-BERT model cannot be loaded. Real parts: the packaged offline Sentence-BERT, the mauve package, and
the tiny saved Llama of tests/helpers/next_token_parts.py."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from eval_tasks import metrics as M
from eval_tasks import results as E
from eval_tasks.metrics.sentence_bert import SbertUnavailableError
from eval_tasks.samples import InputError
from tests.helpers.forked_tqdm import tqdm_for_forked_tests  # noqa: F401  (autouse)
from tests.helpers.next_token_parts import checkpoint, tokenizer, use_model


def _records(k: int, n: int = 2) -> list[dict]:
    words = ["red", "blue", "green", "gold", "grey", "pink", "teal", "navy"]
    return [
        {
            "id": i,
            "prompt": f"Write {i}",
            "samples": [f"the {words[(i + j) % 8]} fox {j} runs to {i} and back" for j in range(k)],
        }
        for i in range(n)
    ]


# ---------------------------------------------------------------------------------------------------------
# gem_protocol_notes


def test_several_sample_counts_are_listed_in_order() -> None:
    settings = {"scoring": "prompt+response"}
    assert E.gem_protocol_notes(settings, None, 3, {8, 4}, None) == ["4/8 samples per prompt (paper: 16)"]


def test_a_benchmark_without_published_numbers_adds_no_prompt_count() -> None:
    assert E.gem_protocol_notes({"scoring": "prompt+response"}, None, 3, {16}, "no_such_benchmark") == []


# ---------------------------------------------------------------------------------------------------------
# diversity_result


def test_the_result_names_its_samples_file_and_benchmark() -> None:
    result = E.diversity_result(
        _records(2), samples_file="out/s.jsonl", benchmark="gem_poem", metrics=("mauve",)
    )
    assert result["samples_file"] == "out/s.jsonl" and result["benchmark"] == "gem_poem"
    assert result["num_prompts"] == 2 and result["samples_per_prompt"] == [2]


def test_a_meta_that_is_not_a_mapping_is_not_the_generation() -> None:
    records = _records(2)
    records[0]["meta"] = "greedy"
    result = E.diversity_result(records, samples_file="s.jsonl", metrics=("mauve",))
    assert result["model"] is None and result["generation"] is None
    empty = E.diversity_result([], samples_file="s.jsonl", metrics=("mauve",))
    assert empty["generation"] is None and empty["num_prompts"] == 0 and empty["samples_per_prompt"] == []


def test_the_notes_read_the_generation_settings_and_the_benchmark() -> None:
    records = _records(16, n=3)
    records[0]["meta"] = {"model": "ckpt", "temperature": 0.7}
    result = E.diversity_result(
        records, samples_file="s.jsonl", benchmark="gem_poem", metrics=("ngram",), include_prompt=True
    )
    assert result["protocol_differences"] == ["3 prompts (paper: 573)", "temperature=0.7 (paper: 1.0)"]
    assert result["comparable_to_published"] is False


_PUNKT_NOTE = [
    "n-gram tokens from an untrained Punkt sentence splitter (GEM: NLTK's trained punkt_tab); differs only around "
    "abbreviations such as 'Mr.'"
]


def test_the_tokenizer_note_goes_with_the_default_tokenizer_and_ngram_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With tokenizer="punkt" the trained data are used: here NLTK's data path holds a punkt_tab of empty tables."""
    import nltk

    english = tmp_path / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True)
    for name in ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab"):
        (english / name).write_text("")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path), *nltk.data.path])
    records = _records(3)
    default = E.diversity_result(records, samples_file="s.jsonl", metrics=("ngram",))
    assert default["minor_differences"] == _PUNKT_NOTE
    assert (
        E.diversity_result(records, samples_file="s.jsonl", metrics=("ngram",), tokenizer="nltk")[
            "minor_differences"
        ]
        == _PUNKT_NOTE
    )
    punkt = E.diversity_result(records, samples_file="s.jsonl", metrics=("ngram",), tokenizer="punkt")
    assert "minor_differences" not in punkt and punkt["settings"]["ngram"]["tokenizer"] == "punkt"
    pytest.importorskip("sacrebleu")
    no_ngram = E.diversity_result(records, samples_file="s.jsonl", metrics=("self_bleu",))
    assert "minor_differences" not in no_ngram


# ---------------------------------------------------------------------------------------------------------
# mauve_against_references


def _featurizer(texts):
    """Each text's own features: 8 normal draws seeded by its CRC-32."""
    import zlib

    import numpy as np

    return np.array([np.random.default_rng(zlib.crc32(t.encode())).normal(size=8) for t in texts])


def test_mauve_is_the_mean_and_population_spread_over_sample_indices_with_its_seed() -> None:
    pytest.importorskip("mauve")
    records = [{**r, "samples": r["samples"] + ["x" * (i + 1)]} for i, r in enumerate(_records(2, n=30))]
    refs = [f"a human reference number {i}" for i in range(30)]
    p = _featurizer(refs)
    qs = [_featurizer([r["samples"][j] for r in records]) for j in range(3)]
    for seed, given in ((25, {}), (7, {"seed": 7})):  # MAUVE's default seed, 25; --seed
        out = E.mauve_against_references(records, refs, featurizer=_featurizer, **given)
        values = [
            M.mauve_score(None, None, p_features=p, q_features=q, featurizer=_featurizer, seed=seed)["mauve"]
            for q in qs
        ]
        mean = sum(values) / 3
        assert len(set(values)) > 1
        assert out["mauve"] == pytest.approx(mean, rel=1e-12) and out["mauve_runs"] == 3
        assert out["mauve_std"] == pytest.approx((sum((v - mean) ** 2 for v in values) / 3) ** 0.5, rel=1e-9)
    other = M.mauve_score(None, None, p_features=p, q_features=qs[0], featurizer=_featurizer, seed=25)[
        "mauve"
    ]
    assert other != values[0]  # the seed matters for these features


def test_gpt2_large_features_in_batches_of_64(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MAUVE's published numbers use gpt2-large features: a model folder of that name is loaded as it, and its
    texts go through it 64 at a time (the documented default batch size), references and samples alike."""
    pytest.importorskip("mauve")
    import torch

    shutil.copytree(checkpoint(), tmp_path / "gpt2-large")
    monkeypatch.chdir(tmp_path)
    records = _records(1, n=70)
    refs = [f"a human reference number {i}" for i in range(70)]
    batches: list[int] = []

    def hook(module: torch.nn.Module, args: tuple) -> None:
        if isinstance(module, torch.nn.Embedding):  # the model's token embedding: one call per batch
            batches.append(args[0].shape[0])

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        out = E.mauve_against_references(records, refs, featurizer="gpt2-large")
    finally:
        handle.remove()
    assert batches == [64, 6, 64, 6]
    assert out["mauve_featurizer"] == "lm:gpt2-large" and out["mauve_comparable_to_published"] is True
    assert out["mauve_runs"] == 1 and out["mauve_std"] == 0.0


def test_the_missing_references_refusal() -> None:
    with pytest.raises(InputError) as err:
        E.mauve_against_references(_records(1), [None], featurizer=_featurizer)
    assert str(err.value) == (
        "--metrics mauve needs human references: a 'reference' field in every prompt record (carried over by "
        "generate from the prompts file) or --references FILE."
    )


# ---------------------------------------------------------------------------------------------------------
# nexttoken_result


def test_the_nexttoken_result_defaults(capsys: pytest.CaptureFixture) -> None:
    long = " ".join(["the sea is blue and wide"] * 260)
    records = [f"line {i} of the text" for i in range(8)] + [long]
    with use_model() as (model, calls):
        capsys.readouterr()  # the first load's own progress output
        result = E.nexttoken_result(model, tokenizer(), model_name="tiny", records=records, probes=["Hi"])
        stats_calls = calls[:-1]
    assert capsys.readouterr().err == ""
    assert result["format_version"] == 1 and result["benchmark"] is None
    assert [c["input_ids"].shape[0] for c in stats_calls] == [8, 1]
    assert stats_calls[1]["input_ids"].shape[1] == 1024
    assert len(result["probes"][0]["tokens"]) == 10
    with use_model() as (model, _):
        shown = E.nexttoken_result(
            model,
            tokenizer(),
            model_name="tiny",
            records=records[:2],
            probes=[],
            benchmark="b",
            progress=True,
        )
    assert shown["benchmark"] == "b"
    assert capsys.readouterr().err.strip().split("\r")[-1].startswith("next-token stats: 100%|")


def test_the_probes_follow_the_chat_template_choice() -> None:
    with use_model() as (model, _):
        plain = E.nexttoken_result(model, tokenizer(), model_name="tiny", probes=["Hi"], chat_template=False)
        expected = M.next_token_distribution(model, tokenizer(), "Hi", top_k=10, chat_template=False)
        templated = M.next_token_distribution(model, tokenizer(), "Hi", top_k=10)
    assert plain["probes"] == [expected] and expected != templated


# ---------------------------------------------------------------------------------------------------------
# paper_sbert_or_default


def test_an_unavailable_paper_model_falls_back_with_a_warning(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SbertUnavailableError) as err:
        M.load_sbert(M.GEM_SBERT_MODEL, device="cpu")
    reason = f"{M.GEM_SBERT_MODEL} could not be loaded ({err.value.reason})"
    assert E.paper_sbert_or_default("cpu") == (None, reason)
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == _warning(reason)


def _warning(reason: str) -> str:
    return (
        f"distmatch-eval diversity: warning: {reason}; Sentence-BERT diversity uses the offline default instead "
        "(not comparable with GEM's Table 2). Give a local copy with --sbert-model PATH.\n"
    )


def test_without_sentence_transformers_the_reason_is_the_import_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """An ImportError has no `reason`: its message, on one line, is the reason."""
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ImportError) as err:
        M.load_sbert(M.GEM_SBERT_MODEL, device="cpu")
    message = " ".join(str(err.value).split())
    assert " " in message and len(message) <= 300
    reason = f"{M.GEM_SBERT_MODEL} could not be loaded ({message})"
    assert E.paper_sbert_or_default("cpu") == (None, reason)
    assert capsys.readouterr().err == _warning(reason)


def test_the_statistics_take_the_given_batches_length_and_template() -> None:
    records = [{"prompt": f"say {i} things", "completion": "the sea is blue and wide " * 4} for i in range(5)]
    with use_model() as (model, calls):
        result = E.nexttoken_result(
            model,
            tokenizer(),
            model_name="tiny",
            records=records,
            probes=[],
            batch_size=2,
            max_length=16,
            chat_template=False,
        )
        given = [tuple(c["input_ids"].shape) for c in calls]
        expected = M.next_token_stats(model, tokenizer(), records, max_length=16, chat_template=False)
        templated = M.next_token_stats(model, tokenizer(), records, max_length=16)
    assert [rows for rows, _ in given] == [2, 2, 1] and max(width for _, width in given) == 16
    assert result["stats"] == pytest.approx(expected.to_dict()) and expected.to_dict() != templated.to_dict()
