"""`distmatch.checkpoints`: the checkpoint a run resumes from, as TRL's `resume_from_checkpoint=True` and Axolotl's
`auto_resume_from_checkpoints` pick it (transformers' `get_last_checkpoint`: the largest step number, compared as a
number), and whether it carries a distmatch run record."""

from __future__ import annotations

from pathlib import Path

import pytest

from distmatch.checkpoints import RECORD_FILE, axolotl_resume_checkpoint, has_record, last_checkpoint


def _folders(root: Path, *names: str) -> None:
    for name in names:
        (root / name).mkdir()


def test_last_checkpoint_is_the_largest_step_as_a_number(tmp_path: Path) -> None:
    _folders(tmp_path, "checkpoint-9", "checkpoint-10", "checkpoint-2", "checkpoint-x", "runs")
    (tmp_path / "checkpoint-11").write_text("a file, not a checkpoint folder")
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")


def test_last_checkpoint_agrees_with_transformers(tmp_path: Path) -> None:
    trainer_utils = pytest.importorskip("transformers.trainer_utils")
    _folders(tmp_path, "checkpoint-100", "checkpoint-99", "checkpoint-1000", "other")
    assert last_checkpoint(tmp_path) == trainer_utils.get_last_checkpoint(str(tmp_path))


def test_no_checkpoint_or_no_folder_is_none(tmp_path: Path) -> None:
    assert last_checkpoint(tmp_path) is None
    assert last_checkpoint(tmp_path / "missing") is None


def test_has_record_needs_the_record_file_in_a_folder(tmp_path: Path) -> None:
    assert RECORD_FILE == "distmatch.json"  # the name written into checkpoints (docs/trl.md, docs/axolotl.md)
    assert not has_record(str(tmp_path)) and not has_record(True) and not has_record(None)
    (tmp_path / RECORD_FILE).write_text("{}")
    assert has_record(str(tmp_path))


def test_axolotl_resume_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _folders(tmp_path, "checkpoint-3", "checkpoint-12")
    out = str(tmp_path)
    assert (
        axolotl_resume_checkpoint({"resume_from_checkpoint": "x", "auto_resume_from_checkpoints": True})
        == "x"
    )
    assert axolotl_resume_checkpoint({"output_dir": out}) is None  # no auto resume: nothing
    auto = {"output_dir": out, "auto_resume_from_checkpoints": True}
    assert axolotl_resume_checkpoint(auto) == str(tmp_path / "checkpoint-12")
    monkeypatch.chdir(tmp_path)  # Axolotl's default output_dir
    _folders(tmp_path, "model-out", "model-out/checkpoint-5")
    assert axolotl_resume_checkpoint({"auto_resume_from_checkpoints": True}) == "./model-out/checkpoint-5"
