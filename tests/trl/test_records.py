"""The run record's checks as plain functions (`trl_ext/resume.py`, `distmatch/model_folder.py`, the model
card), on folders built in the test: no trainer, no subprocess. The same guarantees through `trl sft`:
tests/trl/cli/test_trl_records.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from distmatch.errors import DistMatchConfigError
from distmatch.model_folder import fingerprint, weights_problem
from tests.helpers.tiny_model import build_tiny_llama
from trl_ext.model_card import section
from trl_ext.resume import (
    check_checkpoint_folder,
    check_new_run,
    read_record,
    resolve_resume,
    write_record,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("record_models")
    return {"a": build_tiny_llama(base / "a"), "b": build_tiny_llama(base / "b", seed=1)}


def _checkpoint(folder: Path, loss: str, options: dict, step: int = 1) -> Path:
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    write_record(folder, loss, options, "trl")
    return folder


def _edit(folder: Path, **changes: object) -> None:
    record = json.loads((folder / "distmatch.json").read_text())
    for key, value in changes.items():
        if key == "options":
            record["options"].update(value)  # type: ignore[arg-type]
        else:
            record[key] = value
    (folder / "distmatch.json").write_text(json.dumps(record))


def test_the_fingerprint_tells_two_models_of_one_architecture_apart(models, tmp_path):
    copy = shutil.copytree(models["a"], tmp_path / "copy")
    assert fingerprint(copy)["weights"] == fingerprint(models["a"])["weights"]
    assert fingerprint(models["b"])["weights"] != fingerprint(models["a"])["weights"]
    assert fingerprint(copy)["path"] == str(copy.resolve())


def test_a_relative_reference_that_is_another_model_on_resume_is_refused(models, tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copytree(models["a"], tmp_path / "a" / "refdir")
    shutil.copytree(models["b"], tmp_path / "b" / "refdir")
    monkeypatch.chdir(tmp_path / "a")
    checkpoint = _checkpoint(tmp_path / "run" / "checkpoint-1", "asft", {"anchor_reference": "refdir"})
    assert resolve_resume(checkpoint, "asft", {"anchor_reference": "refdir"}).action == "same"
    same_model = str(tmp_path / "a" / "refdir")  # the same weights under another path: the same options
    assert resolve_resume(checkpoint, "asft", {"anchor_reference": same_model}).action == "same"
    monkeypatch.chdir(tmp_path / "b")
    for loss in (None, "asft"):
        with pytest.raises(DistMatchConfigError, match="which holds other weights") as info:
            resolve_resume(checkpoint, loss, {"anchor_reference": "refdir"})
        assert str(tmp_path / "b" / "refdir") in str(info.value) and "allow_loss_change" in str(info.value)
    assert (
        resolve_resume(checkpoint, "asft", {"anchor_reference": "refdir"}, allow_change=True).action
        == "change"
    )


def test_a_newer_versions_unknown_option_is_refused_unless_allowed(tmp_path):
    checkpoint = _checkpoint(tmp_path / "checkpoint-1", "gem_ls", {})
    _edit(checkpoint, distmatch_version="9.9.9", options={"gem_future": 1})
    with pytest.raises(DistMatchConfigError) as info:
        resolve_resume(checkpoint, None, {})
    message = str(info.value)
    assert "distmatch 9.9.9" in message and "gem_future" in message and "\n" not in message
    assert resolve_resume(checkpoint, None, {}, allow_change=True).options.get("gem_future") is None


@pytest.mark.parametrize("value", [0, "abc", -1.0])
def test_a_hand_edited_record_value_is_refused_naming_the_record(tmp_path, value):
    checkpoint = _checkpoint(tmp_path / "checkpoint-1", "gem_ls", {})
    _edit(checkpoint, options={"gem_beta": value})
    with pytest.raises(DistMatchConfigError) as info:
        read_record(checkpoint)
    assert f"gem_beta={value!r}" in str(info.value) and str(checkpoint / "distmatch.json") in str(info.value)


def test_a_resume_folder_that_is_no_checkpoint_is_refused(models, tmp_path):
    out = _checkpoint(tmp_path / "out", "emo", {})
    cases = {
        str(models["a"]): "no trainer_state.json",
        str(tmp_path / "missing"): "no such folder",
        str(out): "output folder itself",
    }
    for value, expected in cases.items():
        with pytest.raises(DistMatchConfigError, match=expected):
            check_checkpoint_folder(value, out)
    check_checkpoint_folder(str(out), tmp_path / "elsewhere")  # a checkpoint folder given as one
    check_checkpoint_folder(None, out)


def test_a_new_run_into_a_recorded_folder_is_refused_or_overwritten(tmp_path):
    out = tmp_path / "out"
    _checkpoint(out / "checkpoint-1", "emo", {})
    _checkpoint(out / "checkpoint-2", "emo", {}, step=2)
    write_record(out, "emo", {}, "trl")
    with pytest.raises(DistMatchConfigError) as info:
        check_new_run(out, None, overwrite=False)
    message = str(info.value)
    assert f"output_dir={str(out)!r}" in message and "loss=emo" in message and "overwrite_run" in message
    assert check_new_run(out, str(out / "checkpoint-2"), overwrite=False) == []  # a resume
    removed = check_new_run(out, None, overwrite=True)
    assert sorted(Path(p).name for p in removed) == ["checkpoint-1", "checkpoint-2"]
    assert not list(out.glob("checkpoint-*")) and not (out / "distmatch.json").exists()
    assert check_new_run(out, None, overwrite=False) == []


def test_the_history_is_kept_in_the_record_and_the_card(tmp_path):
    checkpoint = _checkpoint(tmp_path / "checkpoint-3", "emo", {}, step=3)
    history = read_record(checkpoint).history_until(3)
    assert [(h["loss"], h["from_step"], h["to_step"]) for h in history] == [("emo", 0, 3)]
    history.append({"loss": "gem_ls", "options": {"gem_beta": 0.7}, "from_step": 3, "to_step": 5})
    later = tmp_path / "later"
    later.mkdir()
    write_record(later, "gem_ls", {}, "trl", history)
    assert [h["loss"] for h in read_record(later).history] == ["emo", "gem_ls"]
    card = section("gem_ls", {"gem_beta": 0.7}, "trl", history)
    assert "steps 0-3: `emo`" in card and "steps 3-5: `gem_ls` (`gem_beta`=`0.7`)" in card


@pytest.mark.parametrize("damage", ["no_weights", "truncated", "header"])
def test_weights_problem_finds_missing_and_truncated_weights(models, tmp_path, damage):
    folder = shutil.copytree(models["a"], tmp_path / "m")
    assert weights_problem(folder) is None
    (weights,) = folder.glob("*.safetensors")
    data = weights.read_bytes()
    if damage == "no_weights":
        weights.unlink()
    elif damage == "truncated":
        weights.write_bytes(data[: len(data) - 1])
    else:
        weights.write_bytes(data[:20])
    expected = {"no_weights": "has no weight file", "truncated": "is truncated", "header": "is truncated"}[
        damage
    ]
    assert expected in (weights_problem(folder) or "")


def test_reference_and_cost_embedding_folders_without_weights_are_refused(models, tmp_path):
    from trl_ext.anchor import check_reference_source
    from trl_ext.cost_embedding.checkpoint import check_cost_embedding_source

    folder = shutil.copytree(models["a"], tmp_path / "m")
    check_reference_source(str(folder), str(models["a"]))
    check_cost_embedding_source(str(folder))
    (weights,) = folder.glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[:-100])
    for check, option in (
        (check_reference_source, "anchor_reference"),
        (check_cost_embedding_source, "emo_"),
    ):
        with pytest.raises(DistMatchConfigError, match="model.safetensors is truncated") as info:
            check(str(folder))
        assert str(info.value).startswith(option) and "\n" not in str(info.value)
    weights.unlink()
    for check in (check_reference_source, check_cost_embedding_source):
        with pytest.raises(DistMatchConfigError, match="has no weight file"):
            check(str(folder))


def test_a_folder_missing_a_shard_is_refused_in_the_same_words_for_either_option(models, tmp_path):
    """A sharded folder whose index names a shard that is not there (an interrupted download): the reference and
    EMO's cost embedding (whose missing shard is the head's) refuse it at configuration time, before any model
    loads, through the one reader of model folders."""
    from trl_ext.anchor import check_reference_source
    from trl_ext.cost_embedding.checkpoint import check_cost_embedding_source

    folder = shutil.copytree(models["a"], tmp_path / "m")
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    header = (folder / "model-00001-of-00002.safetensors").read_bytes()
    names = json.loads(header[8 : 8 + int.from_bytes(header[:8], "little")])
    weight_map = {name: "model-00001-of-00002.safetensors" for name in names if name != "__metadata__"}
    weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    expected = "model-00002-of-00002.safetensors is missing (named by model.safetensors.index.json)"
    for check, option in (
        (check_reference_source, "anchor_reference"),
        (check_cost_embedding_source, "emo_cost_embedding"),
    ):
        with pytest.raises(DistMatchConfigError) as info:
            check(str(folder))
        assert str(info.value).startswith(f"{option}={str(folder)!r}: ") and expected in str(info.value)
