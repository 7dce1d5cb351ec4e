"""Loading the evaluation data (`eval_tasks/dataset_loading.py`): the Hub loader's pinned arguments, local JSONL folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_tasks import dataset_loading as data
from eval_tasks.nlu import nlu
from tests.helpers.eval_fixtures import write_eval_data


@pytest.mark.slow  # as in tests/eval/lm_eval_tasks/, where it came from
def test_hub_load_arguments() -> None:
    """The real loader's arguments: pinned ids, configs, revisions and splits (AG News pool = first 36,000 rows)."""
    got = {
        key: [
            data.load_arguments(key, spec.path, spec.name, spec.revision, split, None)
            for split in (spec.test_split, spec.pool_split)
        ]
        for key, spec in nlu.ICL_TASKS.items()
    }
    assert got["tweet_emotion"][0] == {
        "path": "cardiffnlp/tweet_eval",
        "name": "emotion",
        "revision": "main",
        "split": "test",
    }
    assert got["trec"][1] == {"path": "CogComp/trec", "revision": "refs/convert/parquet", "split": "train"}
    assert got["ag_news"][1] == {"path": "fancyzhx/ag_news", "revision": "main", "split": "train[:36000]"}
    assert [a[0]["path"] for a in got.values()] == [
        "cardiffnlp/tweet_eval",
        "SetFit/sst2",
        "CogComp/trec",
        "SetFit/subj",
        "SetFit/CR",
        "cornell-movie-review-data/rotten_tomatoes",
        "fancyzhx/ag_news",
    ]
    m = nlu.MMLU
    assert data.load_arguments(m.key, m.path, m.name, m.revision, "dev", None) == {
        "path": "cais/mmlu",
        "name": "all",
        "revision": "main",
        "split": "dev",
    }
    i = data.IFEVAL
    assert data.load_arguments(i["key"], i["path"], i["name"], i["revision"], i["split"], None) == {
        "path": "google/IFEval",
        "revision": "main",
        "split": "train",
    }


@pytest.mark.slow  # as in tests/eval/lm_eval_tasks/, where it came from
def test_local_load_arguments(tmp_path: Path) -> None:
    write_eval_data(tmp_path)
    args = data.load_arguments("ag_news", "fancyzhx/ag_news", None, "main", "train[:36000]", tmp_path)
    assert args == {
        "path": "json",
        "data_files": {"train": str(tmp_path / "ag_news" / "train.jsonl")},
        "split": "train[:36000]",
    }
    with pytest.raises(data.DataUnavailableError, match=r"expected .*/sst2/validation\.jsonl"):
        data.load_arguments("sst2", "SetFit/sst2", None, "main", "validation", tmp_path)
