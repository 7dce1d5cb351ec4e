"""The ms-swift plugin's refusals and its loss call, in process, on ms-swift's real argument and loss classes.

Each refused setting raises `DistMatchConfigError` naming the setting; none of them trains ms-swift's own
cross-entropy instead. The loss call on a real tiny model's output is compared with the float64 closed form.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distmatch.errors import DistMatchConfigError
from tests.helpers.loss_oracles import oracle
from tests.helpers.tiny_model import build_tiny_llama

pytest.importorskip("swift", reason="ms-swift is installed only in .venv-swift (make test-swift)")

from swift.loss import loss_map  # noqa: E402
from swift.trainers import Seq2SeqTrainingArguments  # noqa: E402
from swift.trainers.mixin import SwiftMixin  # noqa: E402

from swift_distmatch import OPTIONS_ENV  # noqa: E402
from swift_distmatch.loss import register, shift_labels  # noqa: E402
from trl_ext.losses import LOSS_NAMES, LOSSES  # noqa: E402


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPTIONS_ENV, raising=False)
    register()


def _args(tmp_path: Path, **settings: object) -> Seq2SeqTrainingArguments:
    return Seq2SeqTrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", **settings)


def test_register_adds_every_loss_and_is_idempotent() -> None:
    register()
    assert set(LOSS_NAMES) <= set(loss_map)
    assert loss_map["cross_entropy"].__module__.startswith("swift.")  # ms-swift's own entries are kept


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"enable_dft_loss": True}, "--enable_dft_loss"),
        ({"label_smoothing_factor": 0.1}, "--label_smoothing_factor 0"),
        ({"use_liger_kernel": True}, "--use_liger_kernel"),
        ({"enable_channel_loss": True}, "--enable_channel_loss"),
        ({"tuner_backend": "unsloth"}, "--tuner_backend peft"),
    ],
)
def test_settings_that_replace_the_logits_or_the_loss_are_refused(
    tmp_path: Path, settings: dict, named: str
) -> None:
    args = _args(tmp_path)
    for key, value in settings.items():  # set after __post_init__: it asserts that liger-kernel is installed
        setattr(args, key, value)
    with pytest.raises(DistMatchConfigError, match=f"loss='gem_ls' cannot be combined with .*{named}"):
        loss_map["gem_ls"](args, None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("{gem_beta: 0.5}", f"{OPTIONS_ENV}='{{gem_beta: 0.5}}' is not JSON"),
        ("[0.5]", "is not a JSON object"),
        ('{"gem_bta": 0.5}', "names unknown option\\(s\\) gem_bta; the options are: .*gem_beta"),
        (
            '{"gem_beta": -1}',
            f"{OPTIONS_ENV}: Loss 'gem_ls': gem_beta=-1 is invalid; expected a finite number > 0",
        ),
    ],
)
def test_bad_options_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: str, message: str
) -> None:
    monkeypatch.setenv(OPTIONS_ENV, options)
    with pytest.raises(DistMatchConfigError, match=message):
        loss_map["gem_ls"](_args(tmp_path), None)


def test_an_option_of_another_loss_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = next(o.name for spec in LOSSES.values() if spec.name != "gem_ls" for o in spec.options)
    monkeypatch.setenv(OPTIONS_ENV, json.dumps({other: _default_of(other)}))
    with pytest.raises(DistMatchConfigError, match=f"{other}=.* has no effect with loss='gem_ls'"):
        loss_map["gem_ls"](_args(tmp_path), None)


def _default_of(option: str) -> object:
    from trl_ext.options import OPTION_DEFAULTS

    return OPTION_DEFAULTS[option]


@pytest.mark.parametrize(
    "name", [n for n, s in LOSSES.items() if s.needs_cost_embedding or s.needs_reference]
)
def test_losses_the_plugin_cannot_feed_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(
        DistMatchConfigError, match=f"--loss_type {name} is not available in the ms-swift plugin"
    ):
        loss_map[name](_args(tmp_path), None)


def test_unknown_loss_type_and_options_without_our_loss_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(
        DistMatchConfigError, match="--loss_type 'gem_lss' is unknown; the distmatch losses are: "
    ):
        SwiftMixin.create_loss_and_eval_metric(None, _args(tmp_path, loss_type="gem_lss"))
    monkeypatch.setenv(OPTIONS_ENV, '{"gem_beta": 0.5}')
    with pytest.raises(DistMatchConfigError, match="--loss_type is unset"):
        SwiftMixin.create_loss_and_eval_metric(None, _args(tmp_path))


def test_loss_call_matches_the_closed_form_with_loss_scale(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_llama(tmp_path / "model"), dtype=torch.float32)
    torch.manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (2, 12))
    labels = input_ids.clone()
    labels[:, :4] = -100
    labels[1, 9:] = -100
    outputs = model(input_ids=input_ids)
    scale = torch.rand(2 * 12) + 0.5
    loss = loss_map["gem_ls"](_args(tmp_path), None)
    got = loss(outputs, labels, num_items_in_batch=None, loss_scale=scale)
    targets = torch.cat([labels[:, 1:], torch.full((2, 1), -100)], dim=1).reshape(-1)
    assert torch.equal(shift_labels(labels).reshape(-1), targets)
    want = oracle("gem_ls", outputs.logits.reshape(-1, outputs.logits.shape[-1]), targets)
    expected = (want.value * scale.double()).sum() / want.valid.sum()
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    got.backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_bad_options_are_refused_when_the_plugin_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPTIONS_ENV, '{"gem_bta": 0.5}')
    with pytest.raises(DistMatchConfigError, match="names unknown option\\(s\\) gem_bta"):
        register()


def test_path_settings_reach_the_loss_from_the_options_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory-efficient paths' settings: an option in DISTMATCH_SWIFT_OPTIONS, else the environment's fallback;
    bad or unusable ones (the kernel on a CPU) refused when the loss is built, naming the setting."""
    monkeypatch.setenv(OPTIONS_ENV, '{"loss_chunk_memory_mb": 0.5}')
    monkeypatch.setenv("DISTMATCH_KERNELS", "torch")
    settings = loss_map["gem_ls"](_args(tmp_path), None).settings
    assert (settings.chunk_memory_mb, settings.kernels) == (0.5, "torch")
    # the option wins: the variable is not its fallback
    monkeypatch.setenv("DISTMATCH_CHUNK_MEMORY_MB", "abc")
    assert loss_map["gem_ls"](_args(tmp_path), None).settings.chunk_memory_mb == 0.5
    monkeypatch.delenv(OPTIONS_ENV)
    with pytest.raises(DistMatchConfigError, match="DISTMATCH_CHUNK_MEMORY_MB='abc' is invalid"):
        loss_map["gem_ls"](_args(tmp_path), None)
    monkeypatch.delenv("DISTMATCH_CHUNK_MEMORY_MB")
    if not torch.cuda.is_available():
        monkeypatch.setenv(OPTIONS_ENV, '{"loss_grad_weight_accum": "tiles"}')
        with pytest.raises(
            DistMatchConfigError, match="loss_grad_weight_accum='tiles' needs the Triton row kernel"
        ):
            loss_map["gem_ls"](_args(tmp_path), None)


def test_the_loss_computes_with_its_own_settings_not_the_environment_at_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings are resolved when the loss is built and passed to every call: a variable changed later (here
    to a kernel this CPU cannot run) does not reach the loss."""
    from transformers.modeling_outputs import CausalLMOutput

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(OPTIONS_ENV, '{"loss_kernels": "torch"}')
    loss = loss_map["gem_ls"](_args(tmp_path), None)
    monkeypatch.setenv("DISTMATCH_KERNELS", "triton")
    labels = torch.tensor([[1, 2, 3, -100]])
    value = loss(CausalLMOutput(logits=torch.randn(1, 4, 9)), labels, num_items_in_batch=None)
    assert torch.isfinite(value)
