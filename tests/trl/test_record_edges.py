"""Run records and resumes (`trl_ext.resume`, the history kept by `trl_ext.loss_mixin`), in process, against the
documented behaviour (trl_ext/resume.py's docstring, docs/refusals.md rows on `distmatch.json`, `overwrite_run`,
`allow_loss_change`, `resume_from_checkpoint`): each guard condition alone, each recorded value read back.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from distmatch.errors import DistMatchConfigError
from trl_ext.loss_mixin import DistMatchLossMixin
from trl_ext.resume import (
    check_checkpoint_folder,
    check_new_run,
    read_record,
    resolve_resume,
    write_record,
)


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """A model folder as save_pretrained leaves it, for what the record reads: config.json and a weight file."""
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "models" / "ref"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"vocab_size": 8}))
    save_file({"lm_head.weight": torch.arange(16.0).reshape(8, 2)}, str(folder / "model.safetensors"))
    return folder


#: Options of `prob` other than its defaults (q=1, min_p=0, max_p=1): a resume must keep each of them.
PROB = {"prob_q": 0.5, "prob_min_p": 0.1, "prob_max_p": 0.9}


def _checkpoint(root: Path, name: str = "checkpoint-4", **record) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": int(name.rsplit("-", 1)[1])}))
    write_record(folder, record.pop("loss", "prob"), record.pop("options", PROB), "trl", **record)
    return folder


def _edit(folder: Path, edit) -> None:
    path = folder / "distmatch.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_a_resume_without_loss_continues_with_every_recorded_option(tmp_path):
    resume = resolve_resume(_checkpoint(tmp_path), None, {})
    assert resume.action == "adopt" and resume.loss == "prob"
    assert {k: resume.options[k] for k in PROB} == PROB
    assert "prob_q=0.5" in resume.message() and "prob_min_p=0.1" in resume.message()


def test_a_resume_with_the_recorded_options_is_the_same_run_and_another_value_is_refused(tmp_path):
    folder = _checkpoint(tmp_path)
    assert resolve_resume(folder, "prob", dict(PROB)).action == "same"
    with pytest.raises(DistMatchConfigError, match="prob_q=0.5.*prob_q=0.6"):
        resolve_resume(folder, "prob", {**PROB, "prob_q": 0.6})


def test_a_newer_versions_record_with_an_unknown_option_is_refused_unless_allowed(tmp_path):
    """A record written by a later distmatch (it names its version) with an option this one does not know."""
    folder = _checkpoint(tmp_path)
    _edit(folder, lambda d: (d["options"].update(prob_future=3), d.update(distmatch_version="99.0")))
    for loss in (None, "prob"):
        with pytest.raises(DistMatchConfigError) as caught:
            resolve_resume(folder, loss, dict(PROB))
        message = str(caught.value)
        assert "prob_future" in message and "99.0" in message and "allow_loss_change" in message
    assert resolve_resume(folder, None, {}, allow_change=True).options["prob_q"] == 0.5


@pytest.mark.parametrize(
    ("option", "value"), [("prob_q", -1), ("prob_min_p", "abc"), ("prob_max_p", 0), ("prob_q", 11)]
)
def test_a_hand_edited_record_value_is_refused_naming_distmatch_json(tmp_path, option, value):
    folder = _checkpoint(tmp_path)
    _edit(folder, lambda d: d["options"].update({option: value}))
    for read in (lambda: read_record(folder), lambda: resolve_resume(folder, None, {})):
        with pytest.raises(DistMatchConfigError) as caught:
            read()
        assert str(folder / "distmatch.json") in str(caught.value) and option in str(caught.value)


def test_the_record_stores_the_reference_folder_by_absolute_path_and_weights(
    model_folder, tmp_path, monkeypatch
):
    """`anchor_reference` given relative to the working directory: the record holds the absolute folder and each
    weight file's size (the file's size on disk) and hashes."""
    monkeypatch.chdir(model_folder.parent)
    relative = model_folder.name
    folder = _checkpoint(tmp_path, loss="asft", options={"anchor_reference": relative})
    recorded = json.loads((folder / "distmatch.json").read_text())["references"]["anchor_reference"]
    assert recorded["path"] == os.path.realpath(model_folder)
    weights = recorded["weights"]
    assert weights and all(
        info["size"] == (model_folder / name).stat().st_size and len(info["header_sha256"]) == 64
        for name, info in weights.items()
    )
    # another working directory: the same relative name is another (missing) folder
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DistMatchConfigError, match=r"which is no folder \(moved or removed\?\)") as info:
        resolve_resume(folder, "asft", {"anchor_reference": relative})
    assert "other weights" not in str(info.value)


def test_a_new_run_is_refused_by_a_record_in_the_folder_or_in_any_checkpoint(tmp_path):
    only_checkpoint = tmp_path / "a"
    _checkpoint(only_checkpoint, "checkpoint-2", loss="gem_ls", options={"gem_beta": 0.3})
    with pytest.raises(DistMatchConfigError, match=r"holds another run \(loss=gem_ls.*overwrite_run"):
        check_new_run(only_checkpoint, None, False)
    final = tmp_path / "b"
    final.mkdir()
    write_record(final, "emo", {}, "trl")
    with pytest.raises(DistMatchConfigError, match="loss=emo"):
        check_new_run(final, None, False)
    # a resume, no output folder, or a folder without a record: nothing refused
    assert check_new_run(final, str(final / "checkpoint-9"), False) == []
    assert check_new_run(None, None, False) == []
    (tmp_path / "c").mkdir()
    assert check_new_run(tmp_path / "c", None, False) == []


def test_overwrite_run_removes_the_old_checkpoints_and_record(tmp_path):
    out = tmp_path / "out"
    old = [_checkpoint(out, f"checkpoint-{n}") for n in (2, 4)]
    write_record(out, "prob", PROB, "trl")
    (out / "model.safetensors").write_text("kept")
    removed = check_new_run(out, None, True)
    assert sorted(removed) == sorted(str(p) for p in old)
    assert not any(p.exists() for p in old) and not (out / "distmatch.json").exists()
    assert (out / "model.safetensors").is_file()
    assert check_new_run(out, None, False) == []  # nothing left to refuse


def test_a_resume_folder_that_is_not_a_checkpoint_is_refused(model_folder, tmp_path):
    out = tmp_path / "out"
    good = _checkpoint(out)
    check_checkpoint_folder(str(good), out)
    check_checkpoint_folder(None, out)
    check_checkpoint_folder(True, out)
    with pytest.raises(DistMatchConfigError, match="no such folder"):
        check_checkpoint_folder(str(tmp_path / "missing"), out)
    (out / "trainer_state.json").write_text("{}")
    with pytest.raises(DistMatchConfigError, match="the output folder itself"):
        check_checkpoint_folder(str(out), out)
    with pytest.raises(DistMatchConfigError, match=r"no trainer_state.json: a model folder\?"):
        check_checkpoint_folder(str(model_folder), out)  # config.json and weights, no trainer state


def _trainer(history: list[dict], step: int, **more) -> SimpleNamespace:
    return SimpleNamespace(_distmatch_history=history, state=SimpleNamespace(global_step=step), **more)


def test_the_history_after_a_loss_change_starts_where_the_previous_loss_ended():
    """Steps 0-4 with ce, then (allow_loss_change) gem_ls to step 7: the new entry is steps 4-7."""
    before = [{"loss": "ce", "options": {}, "from_step": 0, "to_step": 4}]
    history = DistMatchLossMixin.distmatch_history(_trainer(before, 7), "gem_ls", {"gem_beta": 0.3})
    assert history == [
        *before,
        {"loss": "gem_ls", "options": {"gem_beta": 0.3}, "from_step": 4, "to_step": 7},
    ]
    two = [*before, {"loss": "gem_ls", "options": {"gem_beta": 0.3}, "from_step": 4, "to_step": 6}]
    again = DistMatchLossMixin.distmatch_history(_trainer(two, 9), "emo", {})
    assert again[-1]["from_step"] == 6 and again[-1]["to_step"] == 9 and again[-1]["loss"] == "emo"
    # the same loss and options continue the last entry
    same = DistMatchLossMixin.distmatch_history(_trainer(before, 8), "ce", {})
    assert same == [{"loss": "ce", "options": {}, "from_step": 0, "to_step": 8}]


@pytest.mark.parametrize(("loss", "allowed", "action"), [(None, False, "adopt"), ("gem_ls", True, "change")])
def test_the_resume_line_is_logged_as_a_warning(tmp_path, caplog, loss, allowed, action):
    """TRL's default log level shows warnings only: the line saying which loss training continues with must be
    one."""
    folder = _checkpoint(tmp_path)
    adopted = []
    trainer = _trainer(
        [],
        0,
        args=SimpleNamespace(process_index=0),
        distmatch_settings=lambda: (loss, {}),
        distmatch_allows_loss_change=lambda: allowed,
        use_distmatch_settings=lambda *a: adopted.append(a),
    )
    with caplog.at_level(logging.DEBUG, logger="trl_ext"):
        resume = DistMatchLossMixin.resume_distmatch(trainer, str(folder))
    assert resume.action == action and bool(adopted) == (loss is None)
    lines = [r for r in caplog.records if "distmatch: resuming from" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]
    assert trainer._distmatch_history == [{"loss": "prob", "options": PROB, "from_step": 0, "to_step": 4}]
