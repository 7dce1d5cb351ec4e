"""The demonstration counts of the EMO NLU protocol pinned to the EMO paper's text.

tests/eval/fixtures/paper_tables/emo_icl_protocol_text.txt holds the paper's sentences (Sec. 4.2.1, appendix A.4):
8 retrieved demonstrations for every task but MMLU, a fixed 5-shot prompt for MMLU, the lowest-perplexity
candidate as the prediction. The lm-eval option defaults, the OpenCompass configs as shipped and the paper-protocol
check of `distmatch-eval report` must follow them.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from eval_tasks import dataset_loading
from eval_tasks.nlu import nlu
from eval_tasks.protocols import paper_protocol_check
from eval_tasks.task_options import TASK_OPTIONS
from tests.helpers.env import REPO_ROOT

TEXT = Path(__file__).parent / "fixtures" / "paper_tables" / "emo_icl_protocol_text.txt"
OC_DATASETS = REPO_ROOT / "eval_tasks" / "opencompass_configs" / "datasets" / "distmatch"

_EMO_META = {
    "protocol": "emo_official",
    "template": "emo_code",
    "openicl_round_trip": True,
    "ppl_norm": "openicl",
    "retriever_model": "sentence-transformers/all-mpnet-base-v2",
}


def _paper() -> tuple[int, int, str]:
    text = " ".join(line for line in TEXT.read_text().splitlines() if not line.startswith("#"))
    ice = re.search(r"find the (\d+) most similar samples as the in-context demonstrations", text)
    shots = re.search(r"except for MMLU, where a fixed (\d+)-shot demonstrations", text)
    rule = re.search(r"choose the one with the (\w+) perplexity as the final prediction", text)
    assert ice and shots and rule
    return int(ice[1]), int(shots[1]), rule[1]


def test_demonstration_counts_equal_the_paper() -> None:
    ice_num, mmlu_shots, rule = _paper()
    assert (ice_num, mmlu_shots, rule) == (8, 5, "smallest")
    assert TASK_OPTIONS["ice_num"].default == ice_num
    assert inspect.signature(dataset_loading.icl_documents).parameters["ice_num"].default == ice_num
    assert nlu.MMLU.num_shots == mmlu_shots
    for key in nlu.ICL_TASKS:
        text = (OC_DATASETS / f"distmatch_{key}_topk_ppl.py").read_text()
        assert re.findall(r"\bice_num=(\d+)", text) == [str(ice_num)], key
    (ids,) = re.findall(r"fix_id_list=\[([\d, ]+)\]", (OC_DATASETS / "distmatch_mmlu_ppl.py").read_text())
    assert [int(i) for i in ids.split(",")] == list(range(mmlu_shots))


def test_report_flags_another_demonstration_count() -> None:
    ice_num, _, _ = _paper()
    full = {"original": 872, "effective": 872}
    on = paper_protocol_check("distmatch_sst2", {**_EMO_META, "ice_num": ice_num}, n_samples=full)
    assert on["comparable"] and on["differences"] == [] and on["metric"] == "acc_ppl"  # lowest perplexity
    # A results file without ice_num ran the tasks' default, which must be the paper's count.
    unset = paper_protocol_check("distmatch_sst2", _EMO_META, n_samples=full)
    assert unset["comparable"] and unset["differences"] == []
    for other in (ice_num - 4, ice_num + 8):
        check = paper_protocol_check("distmatch_sst2", {**_EMO_META, "ice_num": other}, n_samples=full)
        assert not check["comparable"]
        assert check["differences"] == [f"{other} demonstrations (paper: {ice_num})"]
