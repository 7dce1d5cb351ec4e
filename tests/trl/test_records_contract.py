"""The run record's contract, in process, on real folders (`trl_ext/resume.py`; docs/trl.md "Resuming: the run
record", docs/refusals.md's rows on `distmatch.json`, `resume_from_checkpoint`, `overwrite_run`,
`allow_loss_change`): every recorded value read back, each refusal as the whole line the user reads (the setting,
the record file, what is accepted), the resume's result for each case the docs list, and the output folder's
checks. No trainer, no subprocess, no torch model: the model folders are a `config.json` and a safetensors file
written here.
"""

from __future__ import annotations

import json
import locale
import os
import struct
from pathlib import Path

import pytest

from distmatch.checkpoints import last_checkpoint, run_records
from distmatch.errors import DistMatchConfigError
from trl_ext import __version__
from trl_ext.options import DISTMATCH_LOSSES, OPTION_DEFAULTS, loss_params
from trl_ext.resume import (
    check_checkpoint_folder,
    check_new_run,
    checkpoint_folder,
    describe,
    read_record,
    resolve_resume,
    write_record,
)

#: Options of `prob` other than its defaults (q=1, min_p=0, max_p=1).
PROB = {"prob_q": 0.5, "prob_min_p": 0.1, "prob_max_p": 0.9}
#: The end of every refusal a resume's record check gives: how to go on anyway.
ALLOW = "`allow_loss_change: true` (--allow_loss_change)"
#: What `resume_from_checkpoint` accepts, as its refusals say it.
ACCEPTED = "give a checkpoint-N folder a run saved (it holds trainer_state.json), or true for the last one"


def _model(folder: Path, fill: float) -> Path:
    """A model folder as save_pretrained leaves it, for what a record reads of it: config.json and one
    safetensors file (an 8 x 2 LM head filled with `fill`: two fills are two models of one architecture)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"vocab_size": 8}))
    header = json.dumps(
        {"lm_head.weight": {"dtype": "F32", "shape": [8, 2], "data_offsets": [0, 64]}}
    ).encode()
    header += b" " * (-len(header) % 8)
    data = struct.pack("<16f", *[fill] * 16)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data)
    return folder


def _checkpoint(
    folder: Path, loss: str = "prob", options: dict | None = None, framework: str = "trl"
) -> Path:
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    write_record(folder, loss, PROB if options is None else options, framework)
    return folder


def _rewrite(folder: Path, edit=None, **json_args) -> Path:
    """Read the record, change it as a person (or a script) would, and save it again."""
    path = folder / "distmatch.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    if edit is not None:
        edit(data)
    path.write_bytes(json.dumps(data, **json_args).encode("utf-8"))
    return path


def _refusal(call) -> str:
    with pytest.raises(DistMatchConfigError) as caught:
        call()
    return str(caught.value)


# --- what the record holds, read back -----------------------------------------------------------------------------


def test_every_recorded_value_is_read_back(tmp_path):
    """The record: the loss, every loss option with its default filled in, the framework and the version."""
    folder = _checkpoint(tmp_path / "checkpoint-4", "prob", PROB, framework="axolotl")
    record = read_record(folder)
    assert record.loss == "prob"
    assert record.options == {**OPTION_DEFAULTS, **PROB}
    assert record.path == folder / "distmatch.json"
    assert record.framework == "axolotl"
    assert record.version == __version__
    assert (record.unknown, record.references, record.history) == ((), {}, ())


def test_a_record_without_options_is_the_loss_with_its_defaults(tmp_path):
    """Options are recorded with their defaults filled in: a record naming only the loss trained the defaults."""
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    (folder / "distmatch.json").write_text(json.dumps({"loss": "gem_ls"}))
    resume = resolve_resume(folder, None, {})
    assert (resume.action, resume.loss, resume.options) == ("adopt", "gem_ls", OPTION_DEFAULTS)
    assert resolve_resume(folder, "gem_ls", {}).action == "same"


@pytest.fixture
def ascii_locale():
    """A user whose locale's encoding is ASCII (LC_CTYPE=C), for the rest of the test."""
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        if locale.getpreferredencoding(False).lower().replace("-", "") == "utf8":
            pytest.skip("Python's UTF-8 mode: the locale's encoding is not used")
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, before)


def test_a_record_saved_as_utf8_is_read_whatever_the_locale(tmp_path, ascii_locale):
    """JSON is UTF-8: a record a script saved with a non-ASCII folder name unescaped is read as written, by the
    resume and by a new run's check of the output folder, also where the locale's encoding is ASCII."""
    reference = _model(tmp_path / "modèles" / "réf", 1.0)
    out = tmp_path / "out"
    folder = _checkpoint(out / "checkpoint-4", "asft", {"anchor_reference": str(reference)})
    _rewrite(folder, ensure_ascii=False)
    resume = resolve_resume(folder, None, {})
    assert (resume.action, resume.options["anchor_reference"]) == ("adopt", str(reference))
    assert "holds another run (loss=asft, recorded in" in _refusal(lambda: check_new_run(out, None, False))


# --- a record that is not what distmatch writes: refused in one line naming the file -----------------------------


@pytest.mark.parametrize("data", [{"loss": "prob", "options": [["prob_q", 0.5]]}, {"loss": 3, "options": {}}])
def test_a_record_that_is_not_the_object_distmatch_writes_is_refused(tmp_path, data):
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    path = folder / "distmatch.json"
    path.write_text(json.dumps(data))
    assert _refusal(lambda: read_record(folder)) == (
        f"resume_from_checkpoint={str(folder)!r}: {path} is not a readable distmatch record (TypeError: `loss` "
        "must be a string and `options` a mapping); it must be the JSON object distmatch writes (`loss`, "
        "`options`). Restore it, or delete it to resume this checkpoint like a run without a distmatch loss."
    )


def test_a_record_of_a_loss_this_version_does_not_know_is_refused(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-4")
    path = _rewrite(folder, lambda d: d.update(loss="gem_future"))
    assert _refusal(lambda: resolve_resume(folder, None, {})) == (
        f"resume_from_checkpoint={str(folder)!r}: {path} records loss='gem_future', which this distmatch "
        f"({__version__}) does not know (known: {', '.join(DISTMATCH_LOSSES)}); resume with the distmatch version "
        "that wrote it."
    )


def test_a_hand_edited_invalid_value_is_refused_naming_the_record(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-4")
    path = _rewrite(folder, lambda d: d["options"].update(prob_q=-1))
    with pytest.raises(ValueError) as invalid:  # the option's own words, as the option's check gives them
        loss_params("prob", {**PROB, "prob_q": -1})
    assert _refusal(lambda: read_record(folder)) == (
        f"resume_from_checkpoint={str(folder)!r}: {path} records an invalid option: {invalid.value} Restore the "
        "value distmatch wrote (or delete the file to resume like a run without a distmatch loss)."
    )


@pytest.mark.parametrize("version", ["99.0", None])
def test_a_newer_versions_unknown_options_are_refused_naming_each(tmp_path, version):
    """Named with the version that wrote them, or, a record without a version, without one."""
    folder = _checkpoint(tmp_path / "checkpoint-4")

    def edit(data):
        data["options"].update(prob_future=1, prob_other=2)
        data.pop("distmatch_version")
        if version:
            data["distmatch_version"] = version

    path = _rewrite(folder, edit)
    for loss in (None, "prob"):
        assert _refusal(lambda loss=loss: resolve_resume(folder, loss, dict(PROB))) == (
            f"resume_from_checkpoint={str(folder)!r}: {path} was written by distmatch "
            f"{version or '(unknown version)'} with option prob_future, prob_other, which this distmatch "
            f"({__version__}) does not know and would drop; resume with distmatch {version or 'that wrote it'}, or "
            f"set {ALLOW} to train without it."
        )


# --- what a resume does ------------------------------------------------------------------------------------------


def test_describe_names_the_loss_and_the_options_it_uses():
    assert describe("prob", PROB) == "loss=prob (prob_q=0.5, prob_min_p=0.1, prob_max_p=0.9)"
    assert describe("ce", {}) == "loss=ce"  # memory-efficient paths' defaults: nothing to say
    assert describe(None, {}) == "no `loss`"


def test_a_resume_with_the_recorded_settings_trains_them_and_says_nothing(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-4")
    resume = resolve_resume(folder, "prob", dict(PROB))
    assert (resume.action, resume.checkpoint, resume.loss) == ("same", str(folder), "prob")
    assert resume.options == {**OPTION_DEFAULTS, **PROB}  # every option, defaults filled in
    assert resume.message() is None


def test_another_loss_is_refused_naming_both_and_allowed_saying_so(tmp_path):
    folder = _checkpoint(tmp_path / "checkpoint-4")
    path = folder / "distmatch.json"
    assert _refusal(lambda: resolve_resume(folder, "ce", {})) == (
        f"resume_from_checkpoint={str(folder)!r} was trained with loss=prob (prob_q=0.5, prob_min_p=0.1, "
        f"prob_max_p=0.9) (recorded in {path}) but this run asks for loss=ce; resume with the recorded loss and "
        f"options (or leave `loss` unset to continue with them), or set {ALLOW} to train ce from this checkpoint."
    )
    resume = resolve_resume(folder, "ce", {}, allow_change=True)
    assert (resume.action, resume.loss) == ("change", "ce")
    assert resume.message() == (
        f"distmatch: resuming from {folder}, trained with loss=prob (prob_q=0.5, prob_min_p=0.1, prob_max_p=0.9) "
        f"(recorded in {path}), with loss=ce as asked (allow_loss_change)."
    )


# --- the reference folders the record fingerprints ---------------------------------------------------------------


def test_a_reference_folder_holding_other_weights_is_refused_unless_allowed(tmp_path):
    reference = _model(tmp_path / "models" / "ref", 1.0)
    folder = _checkpoint(tmp_path / "checkpoint-4", "asft", {"anchor_reference": str(reference)})
    path = folder / "distmatch.json"
    _model(reference, 2.0)  # the folder now holds another model
    line = (
        f"resume_from_checkpoint={str(folder)!r} was trained against anchor_reference="
        f"{os.path.realpath(reference)!r} (fingerprinted in {path}) but anchor_reference={str(reference)!r} is now "
        f"{os.path.realpath(reference)!r}, which holds other weights; give the folder the run trained against, or "
        f"set {ALLOW} to train against this one."
    )
    assert _refusal(lambda: resolve_resume(folder, None, {})) == line
    assert _refusal(lambda: resolve_resume(folder, "asft", {"anchor_reference": str(reference)})) == line
    # allowed: a resume without a loss continues with the record's, one with the loss trains other options
    assert resolve_resume(folder, None, {}, allow_change=True).action == "adopt"
    changed = resolve_resume(folder, "asft", {"anchor_reference": str(reference)}, allow_change=True)
    assert changed.action == "change"


def test_a_relative_reference_that_names_no_folder_now_is_refused_as_given(tmp_path, monkeypatch):
    reference = _model(tmp_path / "models" / "ref", 1.0)
    monkeypatch.chdir(reference.parent)
    folder = _checkpoint(tmp_path / "checkpoint-4", "asft", {"anchor_reference": "ref"})
    monkeypatch.chdir(tmp_path)  # another working directory: `ref` is no folder there
    assert _refusal(lambda: resolve_resume(folder, "asft", {"anchor_reference": "ref"})) == (
        f"resume_from_checkpoint={str(folder)!r} was trained against anchor_reference="
        f"{os.path.realpath(reference)!r} (fingerprinted in {folder / 'distmatch.json'}) but anchor_reference='ref' "
        f"is now 'ref', which is no folder (moved or removed?); give the folder the run trained against, or set "
        f"{ALLOW} to train against this one."
    )


def test_the_same_weights_under_another_path_are_the_same_options(tmp_path):
    reference = _model(tmp_path / "models" / "ref", 1.0)
    folder = _checkpoint(tmp_path / "checkpoint-4", "asft", {"anchor_reference": str(reference)})
    moved = _model(tmp_path / "moved" / "ref", 1.0)
    assert resolve_resume(folder, "asft", {"anchor_reference": str(moved)}).action == "same"


def test_another_loss_from_a_run_with_a_reference_is_refused_as_a_loss_change(tmp_path):
    """The reference belongs to the recorded loss: a run asking for a loss without one is told about the loss."""
    reference = _model(tmp_path / "models" / "ref", 1.0)
    folder = _checkpoint(tmp_path / "checkpoint-4", "asft", {"anchor_reference": str(reference)})
    assert _refusal(lambda: resolve_resume(folder, "ce", {})) == (
        f"resume_from_checkpoint={str(folder)!r} was trained with loss=asft (anchor_reference={str(reference)!r}, "
        f"anchor_kl_weight=0.1) (recorded in {folder / 'distmatch.json'}) but this run asks for loss=ce; resume "
        f"with the recorded loss and options (or leave `loss` unset to continue with them), or set {ALLOW} to "
        "train ce from this checkpoint."
    )


def test_the_used_reference_is_checked_after_a_fingerprint_of_another_losss_option(tmp_path):
    """A record that also fingerprints a folder option its loss does not use (EMO's cost embedding, listed
    first): the reference the loss uses is still checked."""
    reference = _model(tmp_path / "models" / "ref", 1.0)
    folder = _checkpoint(tmp_path / "checkpoint-4", "asft", {"anchor_reference": str(reference)})

    def edit(data):
        data["references"] = {
            "emo_cost_embedding": {"path": str(tmp_path / "emb"), "weights": {}},
            **data["references"],
        }

    _rewrite(folder, edit)
    _model(reference, 2.0)
    message = _refusal(lambda: resolve_resume(folder, "asft", {"anchor_reference": str(reference)}))
    assert "which holds other weights" in message and "emo_cost_embedding" not in message


@pytest.mark.parametrize("references", [["anchor_reference"], {"anchor_reference": "not a fingerprint"}])
def test_a_damaged_fingerprint_is_refused_in_one_line_or_the_options_compared_by_value(tmp_path, references):
    """Never a traceback: either the record file is named in a refusal, or the resume goes on as the recorded
    options say (the same reference folder, unchanged)."""
    reference = _model(tmp_path / "models" / "ref", 1.0)
    folder = _checkpoint(tmp_path / "checkpoint-4", "asft", {"anchor_reference": str(reference)})
    path = _rewrite(folder, lambda d: d.update(references=references))
    try:
        resume = resolve_resume(folder, "asft", {"anchor_reference": str(reference)})
    except DistMatchConfigError as refused:
        assert str(path) in str(refused)
    else:
        assert resume.action == "same"


# --- `resume_from_checkpoint`: the folder ------------------------------------------------------------------------


def test_checkpoint_folder_resolves_true_to_the_last_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "out"
    for step in (2, 10):
        _checkpoint(out / f"checkpoint-{step}")
    assert checkpoint_folder(True, out) == str(out / "checkpoint-10")
    assert checkpoint_folder(str(out / "checkpoint-2"), out) == str(out / "checkpoint-2")
    assert checkpoint_folder(out / "checkpoint-2", None) == str(out / "checkpoint-2")
    for unset in (None, False, ""):
        assert checkpoint_folder(unset, out) is None
    assert checkpoint_folder(True, tmp_path / "empty") is None  # no checkpoint yet
    # no output_dir: no checkpoint, whatever the working directory holds
    _checkpoint(tmp_path / "None" / "checkpoint-3")
    monkeypatch.chdir(tmp_path)
    assert checkpoint_folder(True, None) is None


def test_a_resume_folder_that_is_not_a_checkpoint_is_refused_naming_what_is_accepted(tmp_path, monkeypatch):
    out = tmp_path / "out"
    good = _checkpoint(out / "checkpoint-4")
    check_checkpoint_folder(str(good), out)
    missing = str(tmp_path / "missing")
    assert _refusal(lambda: check_checkpoint_folder(missing, out)) == (
        f"resume_from_checkpoint={missing!r}: no such folder; {ACCEPTED}."
    )
    (out / "trainer_state.json").write_text("{}")
    assert _refusal(lambda: check_checkpoint_folder(str(out), out)) == (
        f"resume_from_checkpoint={str(out)!r} is the output folder itself, not a checkpoint; {ACCEPTED}."
    )
    model = _model(tmp_path / "model", 1.0)
    assert _refusal(lambda: check_checkpoint_folder(model, out)) == (
        f"resume_from_checkpoint={str(model)!r} is not a training checkpoint (no trainer_state.json: a model "
        f"folder?); {ACCEPTED}, or start from a model with model_name_or_path."
    )
    # unset (None, False, an empty string) or true: nothing to check here
    monkeypatch.chdir(model)
    for unset in (None, False, "", True):
        check_checkpoint_folder(unset, out)


# --- a new run into a folder that holds a run --------------------------------------------------------------------


def test_a_new_run_into_a_folder_with_an_unreadable_record_is_refused_saying_so(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "distmatch.json").write_text("{not json")
    assert _refusal(lambda: check_new_run(out, None, False)) == (
        f"output_dir={str(out)!r} holds another run (loss=(unreadable record), recorded in {out / 'distmatch.json'})"
        "; resume it with resume_from_checkpoint, give another output_dir, or set `overwrite_run: true` "
        "(--overwrite_run) to replace it (its checkpoints are removed)."
    )


def test_overwrite_run_removes_a_stopped_runs_checkpoints(tmp_path):
    """A run stopped before its final save: the records are in its checkpoints only."""
    out = tmp_path / "out"
    old = [_checkpoint(out / f"checkpoint-{step}") for step in (2, 4)]
    assert check_new_run(out, None, True) == [str(p) for p in old]
    assert not any(p.exists() for p in old)
    assert last_checkpoint(out) is None and run_records(out) == []


def test_overwrite_run_goes_on_when_a_checkpoint_is_already_gone(tmp_path):
    """A checkpoint removed before its turn (as by another rank; here a link to a checkpoint removed first):
    the old run is still gone, no error."""
    out = tmp_path / "out"
    old = _checkpoint(out / "checkpoint-2")
    (out / "checkpoint-last").symlink_to(old, target_is_directory=True)
    removed = check_new_run(out, None, True)
    assert str(old) in removed and not old.exists()
    assert last_checkpoint(out) is None and run_records(out) == []
    assert check_new_run(out, None, False) == []


def test_overwrite_run_removes_a_link_to_a_checkpoint_elsewhere_and_keeps_its_target(tmp_path):
    """A `checkpoint-N` that is a link to a checkpoint outside output_dir: the link is removed (no later
    `resume_from_checkpoint: true` picks it) and the folder it points to, not the run's to remove, stays."""
    out = tmp_path / "out"
    _checkpoint(out / "checkpoint-2")
    elsewhere = _checkpoint(tmp_path / "archive" / "checkpoint-9")
    (out / "checkpoint-9").symlink_to(elsewhere, target_is_directory=True)
    removed = check_new_run(out, None, True)
    assert removed == [str(out / "checkpoint-2"), str(out / "checkpoint-9")]
    assert not (out / "checkpoint-9").is_symlink() and not (out / "checkpoint-9").exists()
    assert (elsewhere / "distmatch.json").is_file()
    assert last_checkpoint(out) is None and run_records(out) == []


def test_only_the_options_that_name_a_model_folder_are_fingerprinted(tmp_path, monkeypatch):
    """A record fingerprints the model folders the run trained against (`anchor_reference`, a cost-embedding
    folder: the options whose value says where a model comes from), never a keyword option whose value happens to
    name a folder of the working directory (loss_kernels='auto' beside a folder ./auto): such a record would refuse
    every later resume from another directory as 'trained against a folder that is no folder'."""
    monkeypatch.chdir(tmp_path)
    for keyword in ("auto", "float32", "frozen", "initial", "excluded"):
        (tmp_path / keyword).mkdir()
    reference = _model(tmp_path / "reference_model", 0.5)
    options = {"loss_kernels": "auto", "anchor_reference": str(reference)}
    record = read_record(_checkpoint(tmp_path / "run" / "checkpoint-4", "asft", options))
    assert record is not None and set(record.references) == {"anchor_reference"}
    gem = read_record(_checkpoint(tmp_path / "gem" / "checkpoint-4", "gem_ls", {"loss_kernels": "auto"}))
    assert gem is not None and gem.references == {}
    # resumed from another working directory: the keyword is still a keyword, and the run goes on
    monkeypatch.chdir(tmp_path / "run")
    resume = resolve_resume(tmp_path / "gem" / "checkpoint-4", "gem_ls", {"loss_kernels": "auto"})
    assert resume is not None
    # a record an older version wrote, with the keyword fingerprinted as a folder: the resume checks only the
    # options that name a model folder, so it goes on here too
    _rewrite(
        tmp_path / "gem" / "checkpoint-4",
        lambda data: data.update(
            references={"loss_kernels": {"path": str(tmp_path / "auto"), "weights": {}}}
        ),
    )
    resume = resolve_resume(tmp_path / "gem" / "checkpoint-4", "gem_ls", {"loss_kernels": "auto"})
    assert resume is not None and resume.action == "same"
