"""`swift sft --loss_type gem_ls --external_plugins <swift_distmatch>` trains a tiny Llama built in code for real.

The logged first-step loss is compared with the float64 closed form of gem_ls (tests/helpers/loss_oracles.py, written
from the formula) on the same batch: the model's initial weights (the first step's loss is computed before its update)
and the batch encoded by ms-swift's own template. Every step sees the whole data set (batch = data set size), so the
batch does not depend on shuffling. A setting that would make ms-swift train its own cross-entropy is refused as one
line before training.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.loss_oracles import oracle
from tests.helpers.tiny_model import build_tiny_llama, write_sft_jsonl

swift = pytest.importorskip("swift", reason="ms-swift is installed only in .venv-swift (make test-swift)")

from swift_distmatch import OPTIONS_ENV, PLUGIN_FILE  # noqa: E402

N_EXAMPLES = 6
BETA = 0.5
STEPS = 3


def _swift_sft(
    workdir: Path, model: Path, data: Path, loss_type: str, options: str | None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != OPTIONS_ENV}
    env.update(
        OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"
    )
    if options is not None:
        env[OPTIONS_ENV] = options
    swift_cli = Path(sys.executable).parent / "swift"
    args = [
        str(swift_cli),
        "sft",
        "--model",
        str(model),
        "--model_type",
        "llama",
        "--template",
        "default",
        "--dataset",
        str(data),
        "--split_dataset_ratio",
        "0",
        "--tuner_type",
        "full",
        "--loss_type",
        loss_type,
        "--external_plugins",
        str(PLUGIN_FILE),
        "--max_steps",
        str(STEPS),
        "--per_device_train_batch_size",
        str(N_EXAMPLES),
        "--learning_rate",
        "1e-2",
        "--logging_steps",
        "1",
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--dataloader_num_workers",
        "0",
        "--output_dir",
        str(workdir / "out"),
        # Offline: without it ms-swift's trainer asks modelscope.cn whether the local model is the latest, and its
        # retries wait about 22 s of each run (no network here but the package registries).
        "--check_model",
        "false",
    ]
    return subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)


def _step_logs(out: Path) -> list[dict]:
    files = sorted(out.glob("*/logging.jsonl"))
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]
    return [r for r in rows if "loss" in r and "train_runtime" not in r]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("swift")
    model = build_tiny_llama(root / "model")
    data = write_sft_jsonl(root / "data.jsonl", n=N_EXAMPLES)
    return root, model, data


def _oracle_on_first_batch(model_dir: Path, data: Path, beta: float) -> tuple[float, float]:
    """gem_ls and CE, float64, token mean over the whole data set as ms-swift encodes it, initial weights."""
    from swift import get_processor, get_template
    from transformers import AutoModelForCausalLM

    template = get_template(get_processor(str(model_dir), model_type="llama"), template_type="default")
    template.set_mode("train")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    batch = template.data_collator([template.encode(row) for row in rows])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    # Written here from the causal-LM convention, not taken from the plugin: logits at t score the label at t + 1.
    labels = batch["labels"][:, 1:].reshape(-1)
    logits = logits[:, :-1].reshape(-1, logits.shape[-1])
    want = oracle("gem_ls", logits, labels, beta=beta)
    n = want.valid.sum().item()
    assert n > 50, "the batch must hold enough predicted tokens to compare"
    return want.value.sum().item() / n, want.ce.sum().item() / n


def test_gem_ls_trains_and_logs_our_loss(tiny: tuple[Path, Path, Path]) -> None:
    root, model, data = tiny
    workdir = root / "gem_ls"
    workdir.mkdir()
    done = _swift_sft(workdir, model, data, "gem_ls", json.dumps({"gem_beta": BETA}))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logs = _step_logs(workdir / "out")
    assert len(logs) == STEPS, logs
    want_loss, want_ce = _oracle_on_first_batch(model, data, BETA)
    first = logs[0]
    assert first["loss"] == pytest.approx(want_loss, rel=1e-4), (first, want_loss)
    assert first["ce"] == pytest.approx(want_ce, rel=1e-5), (first, want_ce)
    # Not cross-entropy, and the option reached the loss (the default beta gives another value).
    assert abs(first["loss"] - first["ce"]) > 1.0
    default_beta, _ = _oracle_on_first_batch(model, data, 0.7)
    assert first["loss"] != pytest.approx(default_beta, rel=1e-3)
    # Trained for real: the weights moved, so the same batch's loss changed.
    assert all(r["grad_norm"] > 0 for r in logs)
    assert logs[-1]["ce"] != pytest.approx(first["ce"], rel=1e-6)


def test_options_without_a_distmatch_loss_type_are_refused_before_training(
    tiny: tuple[Path, Path, Path],
) -> None:
    root, model, data = tiny
    workdir = root / "refused"
    workdir.mkdir()
    done = _swift_sft(workdir, model, data, "cross_entropy", json.dumps({"gem_beta": BETA}))
    assert done.returncode == 2, done.stderr[-3000:]  # the one-line printer's status, through `swift sft`
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error: ")]
    assert lines == [
        f"error: {OPTIONS_ENV} sets gem_beta but --loss_type is 'cross_entropy', not a distmatch loss, so training "
        "would use ms-swift's own loss; add --loss_type with one of: " + ", ".join(_loss_names()) + "."
    ], done.stderr[-3000:]
    assert "Traceback" not in done.stderr.split("error: ")[-1]
    assert _step_logs(workdir / "out") == []


def _loss_names() -> tuple[str, ...]:
    from trl_ext.losses import LOSS_NAMES

    return LOSS_NAMES
