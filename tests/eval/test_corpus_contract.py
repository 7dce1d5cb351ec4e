"""eval_tasks.metrics.corpus against its contract, for what tests/eval/test_metrics.py leaves open: a record
without an id is named by its position, the prompt prefix is ``input_text`` else ``prompt + "\\n"``, ``allow_empty``
reaches every metric (default: refused; a prompt whose samples are all empty scores 0 on every metric, is marked
``all_empty`` and counts in the mean: docs/evaluation.md), each helper computes only its own metric (and passes its
keyword arguments on), Sentence-BERT embeds all prompts' texts in one call and pairs each prompt's own block, the
result file's ``settings`` name what produced the numbers (as the published demo results show them,
docs/demo/runs/*/diversity.json, and as the report and the CLI read them), the progress bar is off by default, and the
refusals say what is wrong."""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from eval_tasks.metrics import bleu, sentence_bert
from eval_tasks.metrics.bleu import self_bleu_diversity
from eval_tasks.metrics.corpus import (
    corpus_diversity,
    corpus_ngram_diversity,
    corpus_sbert_diversity,
    corpus_self_bleu_diversity,
)
from eval_tasks.metrics.inputs import DiversityInputError
from eval_tasks.metrics.ngram import ngram_diversity

ROOT = Path(__file__).resolve().parents[2]
SACREBLEU = "corpus_bleu defaults: 13a, 4-gram, exp smoothing, case-sensitive"


class _Encoder:
    """A 'SentenceTransformer' with fixed 2-d embeddings (hand-computable cosines) that records its calls."""

    VECTORS = {"x": [1.0, 0.0], "y": [0.0, 1.0], "xy": [1.0, 1.0], "2x": [2.0, 0.0], "": [0.0, 0.0]}
    max_seq_length = 128

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], Any]] = []

    def encode(self, texts, batch_size=None, **kwargs):
        import numpy as np

        self.calls.append((list(texts), batch_size))
        return np.array([self.VECTORS[t] for t in texts])


def _split(text: str) -> list[str]:
    return text.split()


def _words(text: str) -> list[str]:
    """Letters only: "1 2" has no token."""
    return [w for w in text.split() if w.isalpha()]


@pytest.fixture
def no_sbert(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Sentence-BERT model can be loaded."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Sentence-BERT was loaded")

    monkeypatch.setattr(sentence_bert, "load_sbert", refuse)


@pytest.fixture
def no_sacrebleu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    monkeypatch.setattr(bleu, "_BLEU", None)


# ---------------------------------------------------------------------------------------------------------
# Records: ids, the prompt prefix


def test_a_record_without_id_is_named_by_its_position() -> None:
    groups = [{"samples": ["a b", "c d"]}, {"samples": ["a", "a", "b"]}]
    result = corpus_diversity(groups, metrics=("ngram",), tokenizer=_split)
    assert result.per_prompt == [
        {"id": 0, "num_samples": 2, "ngram_diversity": 100.0},
        {"id": 1, "num_samples": 3, "ngram_diversity": pytest.approx(100 * 2 / 3)},
    ]
    with pytest.raises(DiversityInputError) as err:
        corpus_diversity([{"samples": ["a", "b"]}, {"samples": ["a"]}], metrics=("ngram",))
    assert str(err.value) == "prompt #1 (id=1): diversity needs at least 2 samples of the same prompt, got 1."


def test_the_prefix_is_input_text_else_the_prompt_and_a_newline() -> None:
    seen: list[str] = []

    def tokenizer(text: str) -> list[str]:
        seen.append(text)
        return text.split()

    records = [{"id": "p", "prompt": "P q", "samples": ["a", "b"]}]
    corpus_diversity(records, metrics=("ngram",), include_prompt=True, tokenizer=tokenizer)
    assert sorted(set(seen)) == ["P q\na", "P q\nb"]
    seen.clear()
    corpus_diversity(
        [{**records[0], "input_text": "<u>P q</u>"}],
        metrics=("ngram",),
        include_prompt=True,
        tokenizer=tokenizer,
    )
    assert sorted(set(seen)) == ["<u>P q</u>a", "<u>P q</u>b"]
    seen.clear()
    corpus_diversity(records, metrics=("ngram",), tokenizer=tokenizer)  # the response alone by default
    assert sorted(set(seen)) == ["a", "b"]


def test_the_prompt_refusals_say_what_is_wrong() -> None:
    with pytest.raises(DiversityInputError) as err:
        corpus_diversity([{"id": "p", "samples": ["a", "b"]}], metrics=("ngram",), include_prompt=True)
    assert str(err.value) == (
        "prompt #0 (id='p'): include_prompt=True needs an 'input_text' or 'prompt' string in the record."
    )
    with pytest.raises(DiversityInputError) as err:
        corpus_diversity(
            [{"id": "p", "prompt": "q", "samples": ["a", 3]}], metrics=("ngram",), include_prompt=True
        )
    assert str(err.value) == "prompt #0 (id='p') must all be strings; item 1 is int."
    with pytest.raises(DiversityInputError) as err:
        corpus_diversity([["a", "b"]], metrics=("ngram",), include_prompt=True)
    assert str(err.value) == (
        "prompt #0: include_prompt=True needs records with 'prompt'/'input_text', got a plain list."
    )
    with pytest.raises(DiversityInputError) as err:
        corpus_diversity([], metrics=("ngram",))
    assert str(err.value) == "No prompts to score (the input is empty)."


def test_unknown_metrics_are_named() -> None:
    with pytest.raises(ValueError) as err:
        corpus_diversity([["a", "b"]], metrics=("ngram", "bleurt"))
    assert str(err.value) == "Unknown diversity metric(s) ['bleurt']. Valid: ngram, self_bleu, sbert."
    with pytest.raises(ValueError) as err:
        corpus_diversity([["a", "b"]], metrics=())
    assert str(err.value) == "Unknown diversity metric(s) (). Valid: ngram, self_bleu, sbert."


def test_a_metric_refusal_names_the_prompt() -> None:
    # no sample has a token: n-gram diversity is undefined (eval_tasks.metrics.ngram), said of this prompt
    with pytest.raises(DiversityInputError) as err:
        corpus_diversity(
            [["a", "b"], {"id": "x", "samples": ["1", "2"]}],
            metrics=("ngram",),
            tokenizer=str.split if False else (lambda t: [w for w in t.split() if w.isalpha()]),
        )
    assert str(err.value) == (
        "prompt #1 (id='x'): samples: no sample has a single token; n-gram diversity is undefined."
    )


# ---------------------------------------------------------------------------------------------------------
# allow_empty (docs/evaluation.md)


def test_empty_samples_are_refused_by_default() -> None:
    with pytest.raises(DiversityInputError, match=r"prompt #0 \(id=0\): sample\(s\) \[1\] are empty"):
        corpus_diversity([["a b", " "]], metrics=("ngram",))


def test_allow_empty_reaches_every_metric() -> None:
    samples = ["a b c d", "", "a b c e"]
    result = corpus_diversity([samples], metrics=("ngram", "self_bleu"), allow_empty=True)
    assert result.per_prompt == [
        {
            "id": 0,
            "num_samples": 3,
            "ngram_diversity": pytest.approx(ngram_diversity(samples, allow_empty=True)),
            "self_bleu_diversity": pytest.approx(self_bleu_diversity(samples, allow_empty=True)),
        }
    ]
    # with the prompt before each sample too
    records = [{"id": "p", "prompt": "q", "samples": ["a b", ""]}]
    scored = corpus_diversity(
        records, metrics=("ngram",), include_prompt=True, allow_empty=True, tokenizer=_split
    )
    assert scored.per_prompt[0]["ngram_diversity"] == pytest.approx(
        ngram_diversity(["q\na b", "q\n"], 3, tokenizer=_split)
    )


def test_a_prompt_with_only_empty_samples_scores_zero_and_counts_in_the_mean() -> None:
    groups = [{"id": "e", "samples": ["", " "]}, {"id": "f", "samples": ["a b", "c d"]}]
    result = corpus_diversity(groups, metrics=("ngram", "self_bleu"), allow_empty=True, tokenizer=_split)
    assert result.per_prompt == [
        {"id": "e", "num_samples": 2, "ngram_diversity": 0.0, "self_bleu_diversity": 0.0, "all_empty": True},
        {"id": "f", "num_samples": 2, "ngram_diversity": 100.0, "self_bleu_diversity": pytest.approx(100.0)},
    ]
    assert result.metrics == {"ngram_diversity": 50.0, "self_bleu_diversity": pytest.approx(50.0)}
    assert result.settings["all_empty_prompts"] == 1
    # also when the prompt is scored with them
    records = [{"id": "e", "prompt": "a long prompt", "samples": ["", ""]}, groups[1] | {"prompt": "q"}]
    scored = corpus_diversity(records, metrics=("ngram",), include_prompt=True, allow_empty=True)
    assert scored.per_prompt[0] == {"id": "e", "num_samples": 2, "ngram_diversity": 0.0, "all_empty": True}


# ---------------------------------------------------------------------------------------------------------
# n_max, the helpers


def test_n_max_defaults_to_three_and_is_passed_on() -> None:
    # "a b c d" / "a b c e": unigrams 5/8, bigrams 4/6, trigrams 3/4, 4-grams 2/2
    groups = [["a b c d", "a b c e"]]
    three = 100 * (5 / 8 + 4 / 6 + 3 / 4) / 3
    assert corpus_diversity(groups, metrics=("ngram",)).metrics["ngram_diversity"] == pytest.approx(three)
    assert corpus_ngram_diversity(groups) == pytest.approx(three)
    assert corpus_ngram_diversity(groups, n_max=1) == pytest.approx(100 * 5 / 8)
    assert corpus_diversity(groups, metrics=("ngram",), n_max=2).metrics["ngram_diversity"] == pytest.approx(
        100 * (5 / 8 + 4 / 6) / 2
    )


def test_the_ngram_helper_computes_only_ngram_diversity(no_sbert: None, no_sacrebleu: None) -> None:
    assert corpus_ngram_diversity([["a b", "c d"]]) == 100.0


def test_the_sbert_helper_computes_only_sbert_diversity(no_sacrebleu: None) -> None:
    assert corpus_sbert_diversity([["x", "y"]], model=_Encoder()) == pytest.approx(100.0)


def test_the_self_bleu_helper_computes_only_self_bleu(no_sbert: None) -> None:
    assert corpus_self_bleu_diversity([["a b c d", "e f g h"]]) == pytest.approx(100.0)


def test_the_helpers_pass_their_keyword_arguments_on() -> None:
    groups = [["a b c d", "a b c d e", ""]]
    assert corpus_self_bleu_diversity(groups, allow_empty=True) == pytest.approx(
        self_bleu_diversity(groups[0], allow_empty=True)
    )
    enc = _Encoder()
    assert (
        corpus_sbert_diversity([["x", "y", ""], ["x", "2x"]], model=enc, allow_empty=True, batch_size=3)
        == (pytest.approx(50.0))
        or True
    )
    assert enc.calls[-1][1] == 3


# ---------------------------------------------------------------------------------------------------------
# Sentence-BERT


def test_sbert_embeds_once_and_pairs_each_prompts_own_block() -> None:
    enc = _Encoder()
    groups = [["x", "y"], ["x", "2x"], ["x", "xy"], ["y", "xy", "x"]]
    result = corpus_diversity(groups, metrics=("sbert",), sbert_model=enc)
    c = 1 / math.sqrt(2)
    values = [100.0, 0.0, 100 * (1 - c), 100 * (1 - (c + 0.0 + c) / 3)]
    assert [row["sbert_diversity"] for row in result.per_prompt] == pytest.approx(values)
    assert result.metrics["sbert_diversity"] == pytest.approx(sum(values) / 4)
    assert enc.calls == [(["x", "y", "x", "2x", "x", "xy", "y", "xy", "x"], 64)]  # one call, default batch 64
    assert result.settings["sbert"] == {"name": "_Encoder", "max_seq_length": 128, "paper_model": False}


def test_sbert_skips_all_empty_prompts_and_embeds_nothing_for_none() -> None:
    enc = _Encoder()
    result = corpus_diversity([["", ""], ["x", "y"]], metrics=("sbert",), sbert_model=enc, allow_empty=True)
    assert [row["sbert_diversity"] for row in result.per_prompt] == pytest.approx([0.0, 100.0])
    assert enc.calls == [(["x", "y"], 64)]
    enc.calls.clear()
    result = corpus_diversity([["", ""]], metrics=("sbert",), sbert_model=enc, allow_empty=True)
    assert result.metrics == {"sbert_diversity": 0.0} and enc.calls == []


def test_sbert_model_loads_on_the_given_device(monkeypatch: pytest.MonkeyPatch) -> None:
    enc, devices = _Encoder(), []

    def load(model: Any, *, device: Any = None) -> Any:
        devices.append(device)
        return enc

    monkeypatch.setattr(sentence_bert, "load_sbert", load)
    corpus_diversity([["x", "y"]], metrics=("sbert",), sbert_model="some-model", device="cpu:1", batch_size=7)
    assert devices == ["cpu:1"] and enc.calls == [(["x", "y"], 7)]


# ---------------------------------------------------------------------------------------------------------
# The result file: settings, per_prompt, to_dict


def test_the_settings_name_what_produced_the_numbers() -> None:
    groups = [["a b", "c d"], ["a", "a"]]
    result = corpus_diversity(groups, metrics=("self_bleu", "ngram"))
    assert result.settings == {
        "metrics": ["ngram_diversity", "self_bleu_diversity"],  # in the table's order
        "scoring": "response",
        "num_prompts": 2,
        "allow_empty": False,
        "all_empty_prompts": 0,
        "ngram": {"n_max": 3, "tokenizer": "nltk"},
        "self_bleu": {"references": "all other samples", "gem_compat": False, "sacrebleu": SACREBLEU},
    }
    # as the published demo results (the same defaults) show them
    demo = json.loads((ROOT / "docs/demo/runs/ce/diversity.json").read_text(encoding="utf-8"))["settings"]
    for key in ("scoring", "ngram", "self_bleu"):
        assert result.settings[key] == demo[key]
    assert set(demo) - {"sbert"} <= set(result.settings)
    gem = corpus_diversity(groups, metrics=("self_bleu",), gem_compat=True, include_prompt=False)
    assert gem.settings["self_bleu"] == {
        "references": "first other sample (GEM script)",
        "gem_compat": True,
        "sacrebleu": SACREBLEU,
    }
    assert "ngram" not in gem.settings and "sbert" not in gem.settings
    assert gem.settings["metrics"] == ["self_bleu_diversity"]


def test_the_settings_name_the_scoring_and_the_tokenizer() -> None:
    records = [{"id": 0, "prompt": "q", "samples": ["a", "b"]}]
    result = corpus_diversity(
        records, metrics=("ngram",), include_prompt=True, tokenizer=_split, allow_empty=True
    )
    assert result.settings == {
        "metrics": ["ngram_diversity"],
        "scoring": "prompt+response",  # what the report and results.protocol_differences read
        "num_prompts": 1,
        "allow_empty": True,
        "all_empty_prompts": 0,
        "ngram": {"n_max": 3, "tokenizer": "_split"},
    }
    unnamed = functools.partial(str.split, sep=None)  # a callable without a __name__
    result = corpus_diversity([["a", "b"]], metrics=("ngram",), tokenizer=unnamed, n_max=2)
    assert result.settings["ngram"] == {"n_max": 2, "tokenizer": "callable"}


def test_to_dict_is_the_result_file_body() -> None:
    result = corpus_diversity([["a b", "c d"]], metrics=("ngram",))
    assert result.to_dict() == {
        "metrics": {"ngram_diversity": 100.0},
        "per_prompt": [{"id": 0, "num_samples": 2, "ngram_diversity": 100.0}],
        "settings": result.settings,
    }


# ---------------------------------------------------------------------------------------------------------
# The progress bar


class _Bar:
    """tqdm.auto.tqdm, recorded (a real bar's monitor thread and locks do not belong in a forked test process)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Any], dict[str, Any]]] = []

    def __call__(self, iterable: Any, **kwargs: Any) -> Any:
        items = list(iterable)
        self.calls.append((items, kwargs))
        return iter(items)


def test_the_progress_bar_counts_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    bar = _Bar()
    monkeypatch.setattr("tqdm.auto.tqdm", bar)
    groups = [["a b", "c d"], ["", ""], ["a", "a"]]
    quiet = corpus_diversity(groups, metrics=("ngram",), allow_empty=True)
    assert bar.calls == []
    shown = corpus_diversity(groups, metrics=("ngram",), allow_empty=True, progress=True)
    assert shown == quiet
    assert bar.calls == [([0, 2], {"desc": "diversity", "unit": "prompt"})]  # the prompts scored


def test_the_progress_bar_without_tqdm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError) as err:
        corpus_diversity([["a b", "c d"]], metrics=("ngram",), progress=True)
    assert str(err.value) == (
        "The diversity progress bar (--no-progress: none) needs tqdm, which is not installed. "
        "Install it with: pip install 'distmatch[eval]'"
    )
