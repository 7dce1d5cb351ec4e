"""The run record and resuming in Python (`trl_ext/resume.py`, `DistMatchLossMixin.train` / `save_model`,
`DistMatchSFTTrainer`), and the loss settings validated again when the trainer is built and when training starts.

Real `DistMatchSFTTrainer` runs on the tiny Llama (`models` / `data` fixtures: tests/trl/conftest.py), one step each.
The command lines (`trl sft`, `distmatch-trl sft`): tests/trl/cli/test_trl_resume.py. Runs in `.venv` (TRL 1.16) and
`.venv-axolotl` (TRL 1.9): the `trl_trainer` marker (set on tests/trl/).
"""

from __future__ import annotations

import json
import logging

import pytest

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from transformers import AutoTokenizer, TrainerCallback  # noqa: E402

import distmatch  # noqa: E402
from tests.helpers.model_card import read_card  # noqa: E402
from tests.helpers.sft import load_model, make_config, make_trainer, step_logs  # noqa: E402
from trl_ext.checks import DistMatchConfigError  # noqa: E402
from trl_ext.options import OPTION_DEFAULTS  # noqa: E402
from trl_ext.resume import used_options  # noqa: E402
from trl_ext.trainer import DistMatchSFTTrainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

SAVE = {"save_strategy": "steps", "save_steps": 1}


@pytest.fixture(scope="module")
def emo_checkpoint(models, data, tmp_path_factory):
    """checkpoint-1 of a one-step EMO run (its output folder: the parent)."""
    base = tmp_path_factory.mktemp("emo_run")
    trainer = make_trainer(models["plain"], data, base, loss="emo", max_steps=1, **SAVE)
    trainer.train()
    trainer.save_model()
    return base / "out" / "checkpoint-1"


def _resumed(models, data, tmp_path, checkpoint, **overrides):
    trainer = make_trainer(models["plain"], data, tmp_path, max_steps=2, **overrides)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    return trainer


def _distmatch_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("distmatch: resuming")]


def test_record_in_the_checkpoint_and_the_output_folder(emo_checkpoint):
    for folder in (emo_checkpoint, emo_checkpoint.parent):
        record = json.loads((folder / "distmatch.json").read_text())
        assert record["loss"] == "emo" and record["framework"] == "trl", record
        assert record["options"] == OPTION_DEFAULTS
    tags, section = read_card(emo_checkpoint.parent)
    assert {"distmatch", "distmatch-loss-emo", "sft", "trl"} <= set(tags), tags
    assert section == {
        "loss": "emo",
        "framework": "TRL",
        "version": distmatch.__version__,
        "options": used_options("emo", OPTION_DEFAULTS),
        "paper": "[EMO: Earth Mover Distance Optimization for Auto-Regressive Language Modeling (Ren et al., ICLR "
        "2024)](https://arxiv.org/abs/2310.04691)",
    }, section


def test_every_loss_names_its_paper_on_the_card(tmp_path):
    from trl_ext.losses import LOSSES
    from trl_ext.model_card import PAPERS, add_section

    assert set(PAPERS) == set(LOSSES)  # a new loss needs its paper here, or its runs' cards fail to write
    for loss in LOSSES:
        card = tmp_path / loss / "README.md"
        card.parent.mkdir()
        card.write_text("---\ntags:\n- trl\n---\n")
        assert add_section(str(card), loss, {}, "trl")
        assert read_card(card.parent)[1]["loss"] == loss


def test_the_card_section_is_written_once_with_the_latest_values(tmp_path):
    from trl_ext.model_card import add_section

    card = tmp_path / "README.md"
    assert not add_section(str(card), "gem_ls", {"gem_beta": 0.5}, "trl")  # no card: nothing written
    card.write_text("---\ntags:\n- trl\n---\n\n# model\n")
    add_section(str(card), "gem_ls", {"gem_beta": 0.5}, "trl")
    add_section(str(card), "gem_ls", {"gem_beta": 0.7, "emo_ratio_clamp": None}, "axolotl")
    tags, section = read_card(tmp_path)
    assert tags == ["trl"] and card.read_text().startswith("---\ntags:\n- trl\n---\n\n# model\n\n<!--")
    assert (
        section["options"] == {"gem_beta": 0.7, "emo_ratio_clamp": None} and section["framework"] == "Axolotl"
    )
    assert "https://arxiv.org/abs/2408.16673" in section["paper"]


def test_resume_without_loss_continues_with_the_recorded_loss(models, data, tmp_path, emo_checkpoint, caplog):
    caplog.set_level(logging.WARNING)
    trainer = _resumed(models, data, tmp_path, emo_checkpoint)
    assert trainer.args.loss == "emo" and trainer.distmatch_request.name == "emo"
    assert "demd" in step_logs(trainer)[-1]
    (line,) = _distmatch_lines(caplog)
    assert "training continues with the recorded loss=emo" in line and str(emo_checkpoint) in line


def test_resume_from_the_config_takes_the_loss_at_construction(
    models, data, tmp_path, emo_checkpoint, caplog
):
    """`args.resume_from_checkpoint` (what `trl sft --resume_from_checkpoint` sets): the recorded loss is taken when
    the trainer is built (before TRL sets itself up), and `train()` resumes from it."""
    caplog.set_level(logging.WARNING)
    trainer = make_trainer(
        models["plain"], data, tmp_path, max_steps=2, resume_from_checkpoint=str(emo_checkpoint)
    )
    assert trainer.distmatch_request.name == "emo" and len(_distmatch_lines(caplog)) == 1
    steps: list[int] = []
    trainer.add_callback(type("Steps", (TrainerCallback,), {"on_step_end": lambda *a, **k: steps.append(1)}))
    trainer.train()
    assert len(steps) == 1 and "demd" in step_logs(trainer)[-1]  # step 1 restored, step 2 trained
    assert len(_distmatch_lines(caplog)) == 1  # said once


def test_resume_with_the_recorded_loss_says_nothing(models, data, tmp_path, emo_checkpoint, caplog):
    caplog.set_level(logging.WARNING)
    trainer = _resumed(models, data, tmp_path, emo_checkpoint, loss="emo", emo_weighting="emo1")
    assert trainer.state.global_step == 2 and _distmatch_lines(caplog) == []


@pytest.mark.parametrize(
    ("overrides", "requested"),
    [({"loss": "gem_ls"}, "loss=gem_ls (gem_beta=0.7)"), ({"loss": "emo", "emo_weighting": "emo2"}, "emo2")],
)
def test_resume_with_another_loss_or_options_is_refused(
    models, data, tmp_path, emo_checkpoint, overrides, requested
):
    trainer = make_trainer(models["plain"], data, tmp_path, max_steps=2, **overrides)
    with pytest.raises(DistMatchConfigError) as refused:
        trainer.train(resume_from_checkpoint=str(emo_checkpoint))
    message = str(refused.value)
    assert "\n" not in message and "trained with loss=emo" in message and requested in message, message
    assert str(emo_checkpoint / "distmatch.json") in message and "allow_loss_change" in message
    assert trainer.state.global_step == 0  # refused before the checkpoint was loaded or a step was taken


def test_allow_loss_change_trains_the_new_loss(models, data, tmp_path, emo_checkpoint, caplog):
    caplog.set_level(logging.WARNING)
    trainer = _resumed(models, data, tmp_path, emo_checkpoint, loss="gem_ls", allow_loss_change=True)
    assert trainer.distmatch_request.name == "gem_ls" and "demd" not in step_logs(trainer)[-1]
    (line,) = _distmatch_lines(caplog)
    assert "trained with loss=emo" in line and "with loss=gem_ls" in line


def test_checkpoint_without_record_resumes_as_before(models, data, tmp_path, emo_checkpoint):
    """A plain TRL run's checkpoint has no record: the requested loss trains, nothing is refused."""
    import shutil

    plain = tmp_path / "plain-checkpoint"
    shutil.copytree(emo_checkpoint, plain)
    (plain / "distmatch.json").unlink()
    trainer = _resumed(models, data, tmp_path, plain, loss="gem_ls")
    assert trainer.state.global_step == 2 and trainer.distmatch_request.name == "gem_ls"


def test_unreadable_record_is_refused_naming_the_file(models, data, tmp_path, emo_checkpoint):
    import shutil

    broken = tmp_path / "broken-checkpoint"
    shutil.copytree(emo_checkpoint, broken)
    (broken / "distmatch.json").write_text('{"loss": ')
    trainer = make_trainer(models["plain"], data, tmp_path, max_steps=2)
    with pytest.raises(DistMatchConfigError, match="distmatch.json is not a readable distmatch record"):
        trainer.train(resume_from_checkpoint=str(broken))


# ---------------------------------------------------------------------------------------------------------
# Settings assigned after construction: validated again (never a silent fall-back to TRL's cross-entropy)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("loss", "bogus", "loss='bogus' is not a known loss"), ("gem_beta", 0.0, "gem_beta=0.0 is invalid")],
)
def test_settings_assigned_after_the_config_are_checked_by_the_trainer(
    models, data, tmp_path, field, value, message
):
    args = make_config(tmp_path, loss="gem_ls")
    setattr(args, field, value)
    with pytest.raises(DistMatchConfigError, match=message):
        DistMatchSFTTrainer(
            model=load_model(models["plain"]),
            args=args,
            train_dataset=data["train"],
            processing_class=AutoTokenizer.from_pretrained(models["plain"]),
        )


def test_settings_assigned_after_the_trainer_are_checked_when_training_starts(models, data, tmp_path):
    trainer = make_trainer(models["plain"], data, tmp_path, loss="gem_ls", max_steps=1)
    trainer.args.loss = "bogus"
    with pytest.raises(DistMatchConfigError, match="loss='bogus' is not a known loss"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_loss_assigned_after_the_trainer_is_the_one_trained(models, data, tmp_path):
    """A valid change is honoured at `train()`: the loss is set up again (here no loss at construction)."""
    trainer = make_trainer(models["plain"], data, tmp_path, max_steps=1)
    assert trainer.distmatch_request is None
    trainer.args.loss = "emo"
    trainer.train()
    assert trainer.distmatch_request.name == "emo" and "demd" in step_logs(trainer)[-1]
