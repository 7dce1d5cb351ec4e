"""Each refusal's conditions one at a time: a guard that fires only when two of its conditions hold together (an `and`
for an `or`) is invisible to tests that set them all at once. For every guard of `trl_ext/checks.py`, the trainer's
`_reject_incompatible`, EMO's option check, the Axolotl args' conflict table (`axolotl_distmatch/args.py`, pure: no
Axolotl needed) and the patched forward (`trl_ext/model_forward.py`): each condition alone fires, and where the
condition is a threshold, the value just below it does not. EMO's live cost embedding under each adapter state alone
(LoRA active / disabled / merged, DoRA refused): tests/trl/test_cost_embedding.py.

Real objects throughout: accelerate's own `ParallelismConfig`, transformers' model configs, tiny models in code.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("trl")

from accelerate.parallelism_config import ParallelismConfig  # noqa: E402

from axolotl_distmatch.args import conflicts  # noqa: E402
from tests.helpers.sft import make_trainer  # noqa: E402
from tests.helpers.tiny_model import tiny_llama_in_memory  # noqa: E402
from trl_ext.checks import (  # noqa: E402
    DistMatchConfigError,
    check_loss_type,
    framework_conflicts,
)
from trl_ext.model_forward import LossRequest, choose_path, install_loss_forward  # noqa: E402
from trl_ext.options import loss_params  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# ---------------------------------------------------------------------------------------------------------
# trl_ext/checks.py


@pytest.mark.parametrize(
    ("loss", "loss_type", "default", "refused"),
    [
        (None, "dft", "nll", False),  # no distmatch loss: TRL's loss_type is the user's choice
        ("emo", None, "nll", False),  # loss_type unset
        ("emo", "chunked_nll", "chunked_nll", False),  # TRL's default, indistinguishable from unset
        ("dft", "dft", "nll", False),  # the same loss named twice
        ("emo", "nll", None, False),  # plain cross-entropy: the objective a distmatch loss replaces
        ("emo", "dft", "nll", True),  # anything else: two objectives
        ("emo", "chunked_nll", "nll", True),
    ],
)
def test_loss_type_check_each_condition(loss, loss_type, default, refused):
    if not refused:
        check_loss_type(loss, loss_type, default)
        return
    with pytest.raises(DistMatchConfigError, match=f"loss={loss!r} and loss_type={loss_type!r}"):
        check_loss_type(loss, loss_type, default)


def test_loss_type_refusal_says_which_loss_the_name_selects():
    """`loss: dft` is distmatch's DFT, not TRL's: the refusal must not send the user to it for TRL's `dft`."""
    with pytest.raises(
        DistMatchConfigError, match=r"`loss: dft` selects distmatch's own 'dft'; TRL's cannot"
    ):
        check_loss_type("gem_ls", "dft", "nll", ("gem_ls", "dft"))
    with pytest.raises(DistMatchConfigError, match=r"`loss: chunked_nll` selects TRL's own 'chunked_nll'\)"):
        check_loss_type("gem_ls", "chunked_nll", "nll", ("gem_ls", "dft"))


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"use_liger_kernel": True}, ["use_liger_kernel"]),
        ({"label_smoothing_factor": 0.1}, ["label_smoothing_factor"]),
        (
            {"use_liger_kernel": True, "label_smoothing_factor": 0.1},
            ["use_liger_kernel", "label_smoothing_factor"],
        ),
        ({"use_liger_kernel": False, "label_smoothing_factor": 0.0}, []),
        ({"label_smoothing_factor": None}, []),
    ],
)
def test_trl_framework_conflicts_each_alone(values, named):
    found = framework_conflicts(values)
    assert [entry.split("=", 1)[0] for entry in found] == named


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"context_parallel_size": 2}, ["context_parallel_size"]),
        ({"context_parallel_size": 1}, []),  # 1 is no parallelism
        ({"sequence_parallel_degree": 2}, ["sequence_parallel_degree"]),
        ({"sequence_parallel_degree": 1}, []),
        ({"label_smoothing_factor": 0.1}, ["label_smoothing_factor"]),
        ({"label_smoothing_factor": 0.0}, []),
        ({"rl": "dpo"}, ["rl"]),
        ({"cut_cross_entropy": True}, ["cut_cross_entropy"]),
        ({"cut_cross_entropy": False, "use_dft": False, "rl": None}, []),
    ],
)
def test_axolotl_conflicts_each_alone(values, named):
    found = conflicts("gem_ls", values)
    assert len(found) == len(named)
    for key, message in zip(named, found):
        assert key in message


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ({"emo_weighting": "emo1", "emo_ratio_clamp": 3.0}, False),
        ({"emo_weighting": "emo2"}, False),
        ({"emo_ratio_clamp": 3.0}, False),  # emo1 is the default
        ({"emo_weighting": "emo2", "emo_ratio_clamp": 3.0}, True),
    ],
)
def test_emo_ratio_clamp_only_with_emo1(options, refused):
    if not refused:
        assert loss_params("emo", options)["weighting"] == options.get("emo_weighting", "emo1")
        return
    with pytest.raises(ValueError, match="ratio_clamp=3.0 bounds emo1's ratio"):
        loss_params("emo", options)


# ---------------------------------------------------------------------------------------------------------
# DistMatchSFTTrainer._reject_incompatible: each setting alone


@pytest.fixture
def ce_trainer(models, data, tmp_path):
    return make_trainer(models["plain"], data, tmp_path, loss="ce")


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("sp", "sequence / context parallelism"),
        ("cp", "sequence / context parallelism"),
        ("moe_router_logits", "output_router_logits"),
    ],
)
def test_trainer_refuses_each_setting_alone(ce_trainer, monkeypatch, kind, expected):
    ce_trainer._reject_incompatible("ce")  # the plain trainer passes
    if kind in ("sp", "cp"):
        # The accelerator reads it from its (process-wide) state: restored after the test.
        monkeypatch.setattr(
            ce_trainer.accelerator.state, "parallelism_config", ParallelismConfig(**{f"{kind}_size": 2})
        )
        assert (
            ce_trainer.accelerator.parallelism_config.sp_enabled,
            ce_trainer.accelerator.parallelism_config.cp_enabled,
        ) == (
            kind == "sp",
            kind == "cp",
        )
    else:
        ce_trainer.model.config.output_router_logits = True
    with pytest.raises(ValueError, match=expected) as info:
        ce_trainer._reject_incompatible("ce")
    assert str(info.value).startswith("loss='ce' cannot be combined with ")


def test_label_smoothing_set_after_the_trainer_is_refused_when_training_starts(ce_trainer):
    """Label smoothing is one of the config's conflicts (`TRL_CONFLICTS`), checked again by `train()`."""
    ce_trainer.args.label_smoothing_factor = 0.1
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        ce_trainer.train()


def test_trainer_accepts_parallelism_without_sequence_or_context_sharding(ce_trainer, monkeypatch):
    monkeypatch.setattr(
        ce_trainer.accelerator.state, "parallelism_config", ParallelismConfig(sp_size=1, cp_size=1)
    )
    ce_trainer._reject_incompatible("ce")


# ---------------------------------------------------------------------------------------------------------
# The patched forward: unsupported logit transforms, each alone; the path chosen for each head property alone


def _run(model: nn.Module) -> Any:
    install_loss_forward(model)
    ids = torch.arange(6).reshape(1, 6)
    return model(input_ids=ids, labels=ids, distmatch_loss=LossRequest("ce", {}))


@pytest.mark.parametrize("attribute", ["output_multiplier", "lm_head_multiplier", "logits_scaling"])
def test_unsupported_logit_multipliers_are_refused_each_alone(attribute):
    model = tiny_llama_in_memory()
    setattr(model.config, attribute, 2.0)
    with pytest.raises(ValueError, match=f"scales its logits with `{attribute}`"):
        _run(model)
    for neutral in (None, 1, 1.0):  # no scaling: trained as usual
        setattr(model.config, attribute, neutral)
        assert torch.isfinite(_run(model).per_token_loss).all()


def test_forward_without_labels_is_refused():
    model = tiny_llama_in_memory()
    install_loss_forward(model)
    with pytest.raises(ValueError, match="distmatch losses need `labels`"):
        model(input_ids=torch.arange(4).reshape(1, 4), distmatch_loss=LossRequest("ce", {}))


@pytest.mark.parametrize("change", ["none", "force", "softcap", "bias", "not_linear"])
def test_each_head_property_alone_picks_the_path(change):
    model = tiny_llama_in_memory()
    request = LossRequest("ce", {}, force_logits_path=change == "force")
    if change == "softcap":
        model.config.final_logit_softcapping = 30.0
    elif change == "bias":
        model.lm_head = nn.Linear(8, 32, bias=True)
    elif change == "not_linear":

        class Head(nn.Linear):  # a wrapper class (PEFT, modules_to_save): its own forward must run
            pass

        model.lm_head = Head(8, 32, bias=False)
    assert choose_path(model, request) == ("fused" if change == "none" else "logits")
