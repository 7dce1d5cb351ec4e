"""Tiny offline copies of the evaluation datasets, with the real datasets' columns (for both harnesses' tests).

``write_eval_data(root)`` writes ``<root>/<task key>/<split>.jsonl`` - the layout the loaders read when the data
folder (``DISTMATCH_EVAL_DATA_DIR`` / ``data_dir``) is set. Pure Python: importable in every venv.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# Topic words per label, so that a sentence encoder retrieves same-label neighbours more often than not.
_TOPICS = {
    "tweet_emotion": [
        ("furious angry rage hate annoyed", "traffic boss delay queue"),
        ("happy joy laughing delighted fun", "party friends sunshine music"),
        ("hopeful optimistic tomorrow better believe", "future plans dreams goals"),
        ("sad crying lonely miss grief", "goodbye rain loss funeral"),
    ],
    "sst2": [
        ("dull boring tedious awful mess", "plot acting script film"),
        ("brilliant moving delightful superb charming", "performance story film direction"),
    ],
    "trec": [
        ("what does stand for abbreviation", "NASA FBI UN CPU"),
        ("what kind of animal object", "dog car instrument plant"),
        ("why how does explain definition", "rain gravity democracy inflation"),
        ("who invented wrote discovered", "telephone novel penicillin theory"),
        ("where is located city country", "Paris river mountain Nile"),
        ("how many how much when year", "people miles dollars century"),
    ],
    "subj": [
        ("the film follows a man who travels", "city family war village"),
        ("i think it is a wonderful silly", "mess joy bore charm"),
    ],
    "cr": [
        ("broke stopped working terrible battery", "phone camera player router"),
        ("great excellent love works perfectly", "phone camera player router"),
    ],
    "rt": [
        ("clumsy lifeless unfunny flat", "comedy drama sequel thriller"),
        ("gripping warm funny smart", "comedy drama sequel thriller"),
    ],
    "ag_news": [
        ("government minister election talks", "iraq president troops summit"),
        ("team wins match season coach", "football cup olympic league"),
        ("shares profit company market", "stocks oil bank merger"),
        ("software internet researchers space", "microsoft nasa chip google"),
    ],
}

_FIELDS = {  # task key -> (label field, label texts or None, extra fields)
    "tweet_emotion": ("label", None),
    "sst2": ("label", ("negative", "positive")),
    "trec": ("coarse_label", None),
    "subj": ("label", ("objective", "subjective")),
    "cr": ("label", ("negative", "positive")),
    "rt": ("label", None),
    "ag_news": ("label", None),
}


def _sentence(rng: random.Random, topic: tuple[str, str]) -> str:
    words, nouns = topic[0].split(), topic[1].split()
    picked = rng.sample(words, 3) + rng.sample(nouns, 2)
    rng.shuffle(picked)
    return " ".join(picked) + rng.choice([".", "!", " ..."])


def _rows(key: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(f"{key}-{seed}")
    topics = _TOPICS[key]
    label_field, label_texts = _FIELDS[key]
    rows, seen = [], set()
    while len(rows) < n:
        label = len(rows) % len(topics)
        text = _sentence(rng, topics[label])
        if text in seen:
            continue
        seen.add(text)
        row = {"text": text, label_field: label}
        if label_texts:
            row["label_text"] = label_texts[label]
        if key == "trec":
            row["fine_label"] = label * 3
        rows.append(row)
    rng.shuffle(rows)
    return rows


MMLU_SUBJECTS = ("astronomy", "high_school_geography")


def _mmlu_rows(split: str, per_subject: int) -> list[dict]:
    rows = []
    for s, subject in enumerate(MMLU_SUBJECTS):
        for i in range(per_subject):
            answer = (i + s) % 4
            choices = [f"{subject.split('_')[-1]} option {chr(65 + c)}{i}" for c in range(4)]
            rows.append(
                {
                    "question": f"{split} question {i} about {subject.replace('_', ' ')}?",
                    "subject": subject,
                    "choices": choices,
                    "answer": answer,
                }
            )
    return rows


IFEVAL_ROWS = [
    {
        "key": 1000,
        "prompt": "Write a short note about rivers. Your entire response should be in lowercase letters.",
        "instruction_id_list": ["change_case:english_lowercase"],
        "kwargs": [{}],
    },
    {
        "key": 1001,
        "prompt": "Describe a storm in at least 5 sentences.",
        "instruction_id_list": ["length_constraints:number_sentences"],
        "kwargs": [{"relation": "at least", "num_sentences": 5}],
    },
    {
        "key": 1002,
        "prompt": "Tell me about the sea. Do not use any commas in your response.",
        "instruction_id_list": ["punctuation:no_comma"],
        "kwargs": [{}],
    },
    {
        "key": 1003,
        "prompt": "Write a poem about winter with fewer than 40 words.",
        "instruction_id_list": ["length_constraints:number_words"],
        "kwargs": [{"relation": "less than", "num_words": 40}],
    },
]

#: Rows per split of the classification fixtures.
POOL_ROWS, TEST_ROWS = 20, 6


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as stream:
        for row in rows:
            stream.write(json.dumps(row) + "\n")
    return path


def write_eval_data(root: Path) -> Path:
    """Write every task's fixture splits under `root`; returns `root`."""
    for key in _TOPICS:
        write_jsonl(root / key / "train.jsonl", _rows(key, POOL_ROWS, 0))
        write_jsonl(root / key / "test.jsonl", _rows(key, TEST_ROWS, 1))
    write_jsonl(root / "mmlu" / "dev.jsonl", _mmlu_rows("dev", 6))
    write_jsonl(root / "mmlu" / "test.jsonl", _mmlu_rows("test", 3))
    write_jsonl(root / "ifeval" / "train.jsonl", IFEVAL_ROWS)
    return root


def write_lm_eval_results(path: Path, accs: dict[str, float]) -> Path:
    """A results file with the structure lm-eval 0.4.13 writes (keys 'metric,filter', stderr, sample_len)."""
    results = {
        task: {
            "name": task,
            "alias": task,
            "sample_len": 10,
            "acc,none": acc,
            "acc_stderr,none": 0.05,
            "acc_norm,none": acc / 2,
            "acc_norm_stderr,none": 0.05,
        }
        for task, acc in accs.items()
    }
    data = {
        "results": results,
        "group_subtasks": {t: [] for t in accs},
        "configs": {t: {"task": t} for t in accs},
        "versions": dict.fromkeys(accs, 1.0),
        "n-shot": dict.fromkeys(accs, 0),
        "config": {"model": "hf", "model_args": "pretrained=x"},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path
