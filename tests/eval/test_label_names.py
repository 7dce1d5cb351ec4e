"""Label id -> class name -> verbalizer of every classification task, pinned to the datasets' own metadata.

The fixtures (tests/eval/fixtures/dataset_labels/, see its README) hold what the Hub states for each dataset, in the
dataset's own format: a ``datasets`` ``dataset_info`` features dict (``ClassLabel`` names, read with the ``datasets``
library) or, for the SetFit sets that have no ``ClassLabel``, their rows' ``label`` / ``label_text`` pairs. The
verbalizer each class name must get is the EMO paper's Table 5 (and the EMO code's ``icl.py`` for ``emo_code``).
Checked for every id: eval_tasks.nlu's label names, the lm-eval prompts built from them, the shipped OpenCompass
configs (read as text, both template variants) and MMLU's answer letters.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from eval_tasks.nlu import nlu
from tests.helpers.env import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures" / "dataset_labels"
OC_DATASETS = REPO_ROOT / "eval_tasks" / "opencompass_configs" / "datasets" / "distmatch"

#: Dataset class name -> the label word of the EMO paper's Table 5 ("paper") and of the EMO code ("emo_code").
VERBALIZERS = {
    "tweet_emotion": {n: (n, n) for n in ("anger", "joy", "optimism", "sadness")},
    "sst2": {"negative": ("negative",) * 2, "positive": ("positive",) * 2},
    "trec": {
        "ABBR": ("abbreviation",) * 2,
        "ENTY": ("entity",) * 2,
        "DESC": ("description and abstract concept",) * 2,
        "HUM": ("human being",) * 2,
        "LOC": ("location",) * 2,
        "NUM": ("numerical value", "numeric value"),
    },
    "subj": {"objective": ("objective",) * 2, "subjective": ("subjective",) * 2},
    "cr": {"negative": ("negative",) * 2, "positive": ("positive",) * 2},
    "rt": {"neg": ("negative",) * 2, "pos": ("positive",) * 2},
    "ag_news": {
        "World": ("world",) * 2,
        "Sports": ("sports",) * 2,
        "Business": ("business",) * 2,
        "Sci/Tech": ("science and technology",) * 2,
    },
}
VARIANTS = ("paper", "emo_code")


def dataset_class_names(key: str) -> list[str]:
    """Label id -> class name, as the dataset itself states it."""
    json_file = FIXTURES / f"{key}.json"
    if json_file.exists():
        from datasets import Features

        info = json.loads(json_file.read_text())
        features = Features.from_dict(info["features"])
        field = "answer" if key == "mmlu" else nlu.ICL_TASKS[key].label_field
        label = features[field]
        return [label.int2str(i) for i in range(label.num_classes)]
    rows = [json.loads(line) for line in (FIXTURES / f"{key}.jsonl").read_text().splitlines()]
    names = {row["label"]: row["label_text"] for row in rows}
    return [names[i] for i in range(len(names))]


def _ends_with_word(template: str, word: str) -> bool:
    text = template.rstrip(".")
    return text.endswith(f" {word}")


def test_fixtures_name_the_datasets_the_tasks_load() -> None:
    for key in ("tweet_emotion", "trec", "rt", "ag_news"):
        info = json.loads((FIXTURES / f"{key}.json").read_text())
        spec = nlu.ICL_TASKS[key]
        assert info["dataset_name"] == spec.path, key
        assert info["config_name"] == (spec.name or "default"), key
    info = json.loads((FIXTURES / "mmlu.json").read_text())
    assert (info["dataset_name"], info["config_name"]) == (nlu.MMLU.path, nlu.MMLU.name)
    for key in ("sst2", "subj", "cr"):
        assert nlu.ICL_TASKS[key].path.lower() == f"setfit/{key}", key
    assert set(VERBALIZERS) == set(nlu.ICL_TASKS)


@pytest.mark.parametrize("key", list(nlu.ICL_TASKS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_each_label_id_gets_its_class_verbalizer(key: str, variant: str) -> None:
    """nlu's templates and the lm-eval documents: the prompt for label id k ends with class k's word."""
    spec = nlu.ICL_TASKS[key]
    names = dataset_class_names(key)
    assert len(spec.labels) == len(names), key
    words = [VERBALIZERS[key][name][VARIANTS.index(variant)] for name in names]
    template = spec.template(variant)
    for i, word in enumerate(words):
        assert _ends_with_word(template[spec.labels[i]], word), (key, variant, i, names[i])
    # The lm-eval documents: full_prompts[k] is the test input with label k's word; demonstrations carry their own.
    pool = [{spec.text_field: f"pool {i}", spec.label_field: i} for i in range(len(names))]
    test = [{spec.text_field: "probe", spec.label_field: i} for i in range(len(names))]
    docs = nlu.build_icl_rows(spec, test, pool, [[i] for i in range(len(names))], variant=variant)
    for i, doc in enumerate(docs):
        assert doc["label"] == i and doc["label_name"] == spec.labels[i]
        demo, prompt = doc["full_prompts"][0].split("\n")[0], doc["full_prompts"]
        assert _ends_with_word(demo, words[i]) and f"pool {i}" in demo, (key, variant, i)
        for k, full in enumerate(prompt):
            assert "probe" in full.split("\n")[-1] and _ends_with_word(full, words[k]), (key, variant, k)


def _oc_templates(path: Path, name: str) -> dict:
    """A dict literal assigned to `name` in a shipped OpenCompass config (read as text: no OpenCompass needed)."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not in {path}")


@pytest.mark.parametrize("key", list(nlu.ICL_TASKS))
def test_opencompass_configs_map_ids_to_the_dataset_classes(key: str) -> None:
    names = dataset_class_names(key)
    paper = _oc_templates(OC_DATASETS / f"distmatch_{key}_topk_ppl.py", f"distmatch_{key}_template")
    code = _oc_templates(OC_DATASETS / "distmatch_nlu_emo_code_topk_ppl.py", "_emo_code_templates")
    code = code[f"distmatch_{key}"]
    for templates, v in ((paper, 0), (code, 1)):
        assert sorted(templates) == list(range(len(names))), key
        for i, name in enumerate(names):
            assert _ends_with_word(templates[i], VERBALIZERS[key][name][v]), (key, VARIANTS[v], i, name)
            assert (
                templates[i].startswith("</E>") and "{" + nlu.ICL_TASKS[key].text_field + "}" in templates[i]
            )


def test_mmlu_answer_ids_are_the_dataset_letters() -> None:
    names = dataset_class_names("mmlu")
    assert list(nlu.MMLU.letters) == names
    shots = [
        {"subject": "virology", "question": f"S{i}?", "choices": ["w", "x", "y", "z"], "answer": i % 4}
        for i in range(5)
    ]
    rows = [{**shots[0], "question": "T?", "answer": a} for a in range(4)]
    docs = nlu.build_mmlu_rows(rows, shots)
    for answer, doc in enumerate(docs):
        assert doc["letters"][doc["answer"]] == names[answer]
        for i, shot in enumerate(shots):  # each solved shot shows its own answer's letter
            assert f"S{i}?\nA. w\nB. x\nC. y\nD. z\nAnswer: {names[shot['answer']]}\n" in doc["context"]
    text = (OC_DATASETS / "distmatch_mmlu_ppl.py").read_text()
    assert '_letters = ["A", "B", "C", "D"]' in text and list(nlu.MMLU.letters) == names


def test_ag_news_pool_is_the_first_30_percent_of_train() -> None:
    """The EMO code retrieves AG News demonstrations from ``train[:30%]`` (the first 30 % of the rows, in order); the
    card's train split has 120,000 rows."""
    info = json.loads((FIXTURES / "ag_news.json").read_text())
    rows = info["splits"]["train"]["num_examples"]
    assert nlu.ICL_TASKS["ag_news"].pool_split == f"train[:{rows * 30 // 100}]"
    assert all(spec.pool_split == "train" for key, spec in nlu.ICL_TASKS.items() if key != "ag_news")
