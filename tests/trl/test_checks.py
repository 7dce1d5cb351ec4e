"""Settings that would train something else than asked are refused before any work (`trl_ext/checks.py` and the TRL
config that runs them); problems during training are reported once, with where they came from.

In-process and fast (the real CLIs are in tests/trl/cli/test_trl_sft.py,
tests/axolotl/test_activation_hook.py, tests/eval/lm_eval_tasks/):
`DistMatchSFTConfig`'s checks and real `DistMatchSFTTrainer` runs with non-finite values
injected into a tiny model. EMO's cost-embedding checks: tests/trl/test_cost_embedding.py; the error type and
its one-line printer: tests/distmatch/test_errors.py.
Runs in `.venv` (TRL 1.16) and `.venv-axolotl` (TRL 1.9): marker `trl_trainer`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")  # not in .venv-opencompass (OpenCompass pins datasets < 4; TRL needs >= 4.7)

from distmatch.errors import (
    DistMatchConfigError,  # noqa: E402
)
from tests.helpers.tiny_model import build_tiny_llama, write_sft_jsonl  # noqa: E402
from trl_ext.checks import check_option_usage  # noqa: E402
from trl_ext.config import DistMatchSFTConfig  # noqa: E402
from trl_ext.options import DISTMATCH_LOSSES, LOSS_OPTIONS  # noqa: E402

# ---------------------------------------------------------------------------------------------------------
# Configuration-time refusals (the TRL config; the Axolotl args run the same functions)


def _config(tmp_path: Path, **kwargs) -> DistMatchSFTConfig:
    return DistMatchSFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"gem_beta": 0.5}, "gem_beta=0.5 is set but `loss` is unset"),
        ({"loss": "nll", "emo_weighting": "emo2"}, "`loss` is 'nll', not a distmatch loss"),
        ({"loss": "emo", "gem_beta": 0.7}, "gem_beta=0.7 has no effect with loss='emo'"),  # even the default
        ({"loss": "gem_ls", "loss_type": "dft"}, "loss='gem_ls' and loss_type='dft'"),
        ({"loss": "nll", "loss_type": "dft"}, "loss='nll' and loss_type='dft'"),
        ({"loss": "emo", "use_liger_kernel": True}, "use_liger_kernel=True"),
        ({"loss": "tailr", "label_smoothing_factor": 0.1}, "label_smoothing_factor=0.1"),
        ({"loss": "gem_ls", "gem_beta": 0.0}, "Loss 'gem_ls': gem_beta=0.0 is invalid"),
        ({"loss": "emo", "emo_cost_embedding": "/no/such/model"}, "no such folder"),
        ({"loss": "emo", "emo_cost_embedding": "a/b/c d"}, "not a hub id"),
        ({"loss": "bogus"}, "loss='bogus' is not a known loss"),
        ({"anchor_kl_weight": 0.2}, "anchor_kl_weight=0.2 is set but `loss` is unset"),
        ({"loss": "prob", "anchor_kl_weight": 0.1}, "anchor_kl_weight=0.1 has no effect with loss='prob'"),
        ({"loss": "asft", "prob_q": 0.5}, "prob_q=0.5 has no effect with loss='asft'"),
        (
            {"loss": "prob", "prob_min_p": 0.5, "prob_max_p": 0.2},
            "Loss 'prob': prob_min_p=0.5 > prob_max_p=0.2 keeps no token",
        ),
    ],
)
def test_config_refuses(tmp_path, kwargs, expected):
    with pytest.raises(DistMatchConfigError) as err:
        _config(tmp_path, **kwargs)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)  # one line


def test_config_accepts_what_has_an_effect(tmp_path):
    assert _config(tmp_path, loss="gem_ls", gem_beta=0.5, loss_type="nll").loss_options()["gem_beta"] == 0.5
    assert _config(tmp_path, loss="nll", loss_type="nll").loss_type == "nll"
    # `dft` is both ours and TRL's: `loss` selects ours (TRL then computes no loss of its own).
    dft = _config(tmp_path, loss="dft", loss_type="dft")
    assert (dft.distmatch_loss, dft.loss_type) == ("dft", "nll")
    assert (
        _config(tmp_path, use_liger_kernel=True).loss is None
    )  # Liger without a distmatch loss: TRL's business
    config = _config(tmp_path, loss="emo", emo_weighting="emo2")
    assert (config.gem_beta, config.loss_options()["gem_beta"]) == (None, 0.7)


def test_option_usage_check_is_table_driven():
    """The check reads which losses use which option from the table it is given (one source for both frameworks)."""
    for option in LOSS_OPTIONS:
        for loss in DISTMATCH_LOSSES:
            if loss in option.losses:
                check_option_usage(loss, {option.name: option.default}, LOSS_OPTIONS, DISTMATCH_LOSSES)
            else:
                with pytest.raises(DistMatchConfigError, match=option.name):
                    check_option_usage(loss, {option.name: option.default}, LOSS_OPTIONS, DISTMATCH_LOSSES)


# ---------------------------------------------------------------------------------------------------------
# Training: non-finite values reported once with their source, counted as a metric


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    import datasets

    root = tmp_path_factory.mktemp("guard_tiny")
    path = write_sft_jsonl(root / "train.jsonl", n=16)
    train = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(root / "cache"))
    return {"model": build_tiny_llama(root / "model"), "train": train}


def _train(tiny: dict, tmp_path: Path, loss: str, spoil=None, **options):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.trainer import DistMatchSFTTrainer

    model = AutoModelForCausalLM.from_pretrained(tiny["model"], dtype=torch.float32)
    if spoil is not None:
        with torch.no_grad():
            spoil(model)
    args = _config(
        tmp_path,
        loss=loss,
        max_steps=2,
        per_device_train_batch_size=4,
        logging_steps=1,
        max_length=64,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **options,
    )
    trainer = DistMatchSFTTrainer(
        model=model,
        args=args,
        train_dataset=tiny["train"],
        processing_class=AutoTokenizer.from_pretrained(tiny["model"]),
    )
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is not finite" in r.getMessage()]


def test_finite_run_counts_zero_and_says_nothing(tiny, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_ext.trainer"):
        logs = _train(tiny, tmp_path, "gem_ls")
    assert [entry["nonfinite_tokens"] for entry in logs] == [0.0, 0.0]
    assert _warnings(caplog) == []


@pytest.mark.parametrize(
    ("spoil", "source"),
    [
        (lambda m: m.get_input_embeddings().weight.fill_(float("nan")), "the model's hidden states"),
        (lambda m: m.get_output_embeddings().weight[7].fill_(float("inf")), "the LM head weight"),
    ],
    ids=["hidden_states", "lm_head"],
)
def test_nonfinite_loss_is_reported_once_with_its_source(tiny, tmp_path, caplog, spoil, source):
    with caplog.at_level(logging.WARNING, logger="trl_ext.trainer"):
        logs = _train(tiny, tmp_path, "gem_linear", spoil)
    (message,) = _warnings(caplog)  # once, although both steps are non-finite
    assert "loss=gem_linear" in message and source in message and "nonfinite_tokens" in message
    # transformers' `logging_nan_inf_filter` (on by default) logs a NaN loss as the previous mean: the count is
    # what shows it.
    assert all(entry["nonfinite_tokens"] > 0 for entry in logs)
