"""The run record's guarantees through the real `trl sft`: a reference folder is identified by
its weights, not by the path as typed; a record is validated (its values, a newer version's options) and refused in
one line naming the record file; a new run never lands in another run's folder unless `--overwrite_run`; a resume
folder is checked before any model loads; a changed loss keeps the history.

One real run builds the shared checkpoint: `trl sft --loss asft --anchor_reference refdir` (a relative folder) in
`a/`, one step. Every other test either is refused while parsing (nothing loaded) or trains one or two steps.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import WheelVenv, tail, tiny_sft_args
from tests.helpers.tiny_model import build_tiny_llama, write_sft_jsonl
from tests.helpers.warm_cli import WarmCli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory, wheel_venv: WheelVenv, warm_cli: WarmCli) -> dict[str, Path]:
    """`a/first`: one step of `asft` against `a/refdir` (given as the relative `refdir`); `b/refdir`: another model."""
    base = tmp_path_factory.mktemp("records")
    (base / "data").mkdir()
    write_sft_jsonl(base / "data" / "train.jsonl", n=16)
    model = build_tiny_llama(base / "model")
    (base / "a").mkdir()
    (base / "b").mkdir()
    shutil.copytree(model, base / "a" / "refdir")
    build_tiny_llama(base / "b" / "refdir", seed=1)
    tiny = {"model": model, "data": base / "data"}
    first = base / "a" / "first"
    flags = ["--loss", "asft", "--anchor_reference", "refdir"]
    out = warm_cli.run([wheel_venv.trl, "sft", *flags, *tiny_sft_args(tiny, first, 1)], base / "a")
    assert out.returncode == 0, tail(out)
    return {**tiny, "base": base, "first": first, "checkpoint": first / "checkpoint-1"}


def _one_line_error(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, tail(out)
    assert "Traceback" not in out.stderr, tail(out)
    errors = [line for line in out.stderr.splitlines() if "error: " in line]
    assert len(errors) == 1, tail(out)
    return errors[0]


def _edited_checkpoint(run: dict[str, Path], tmp_path: Path, **changes: object) -> Path:
    """A copy of the shared checkpoint whose record has `changes` (top-level keys; `options` merged)."""
    checkpoint = tmp_path / "checkpoint-1"
    shutil.copytree(run["checkpoint"], checkpoint)
    record = json.loads((checkpoint / "distmatch.json").read_text())
    for key, value in changes.items():
        if key == "options":
            record["options"].update(value)  # type: ignore[arg-type]
        else:
            record[key] = value
    (checkpoint / "distmatch.json").write_text(json.dumps(record))
    return checkpoint


def test_the_record_identifies_the_reference_by_path_and_weights(run):
    record = json.loads((run["checkpoint"] / "distmatch.json").read_text())
    reference = record["references"]["anchor_reference"]
    assert reference["path"] == str((run["base"] / "a" / "refdir").resolve()), reference
    (weights,) = reference["weights"].values()
    assert weights["size"] > 0 and len(weights["header_sha256"]) == len(weights["sample_sha256"]) == 64, (
        reference
    )
    assert record["history"] == [
        {
            "loss": "asft",
            "options": {
                "anchor_kl_weight": record["options"]["anchor_kl_weight"],
                "anchor_reference": "refdir",
            },
            "from_step": 0,
            "to_step": 1,
        }
    ]


def test_a_relative_reference_that_is_another_model_on_resume_is_refused(wheel_venv, warm_cli, run, tmp_path):
    """Resumed from `b/`, `refdir` is another model: refused, naming both folders and the record."""
    resume = ["--resume_from_checkpoint", str(run["checkpoint"])]
    out = warm_cli.run(
        [wheel_venv.trl, "sft", *resume, *tiny_sft_args(run, tmp_path / "out", 2)], run["base"] / "b"
    )
    line = _one_line_error(out)
    assert "anchor_reference=" in line and str(run["base"] / "b" / "refdir") in line, line
    assert str(run["checkpoint"] / "distmatch.json") in line and "other weights" in line, line
    assert not (tmp_path / "out").exists()


def test_a_newer_versions_unknown_option_is_refused(wheel_venv, warm_cli, run, tmp_path):
    checkpoint = _edited_checkpoint(run, tmp_path, distmatch_version="9.9.9", options={"asft_future": 1})
    resume = ["--resume_from_checkpoint", str(checkpoint)]
    out = warm_cli.run(
        [wheel_venv.trl, "sft", *resume, *tiny_sft_args(run, tmp_path / "out", 2)], run["base"] / "a"
    )
    line = _one_line_error(out)
    assert "distmatch 9.9.9" in line and "asft_future" in line and "allow_loss_change" in line, line


@pytest.mark.parametrize("value", [0, "abc"])
def test_a_hand_edited_record_value_is_refused_naming_the_record(wheel_venv, warm_cli, run, tmp_path, value):
    checkpoint = _edited_checkpoint(run, tmp_path, loss="gem_ls", options={"gem_beta": value})
    resume = ["--resume_from_checkpoint", str(checkpoint)]
    out = warm_cli.run(
        [wheel_venv.trl, "sft", *resume, *tiny_sft_args(run, tmp_path / "out", 2)], run["base"] / "a"
    )
    line = _one_line_error(out)
    assert f"gem_beta={value!r}" in line and str(checkpoint / "distmatch.json") in line, line


@pytest.mark.parametrize("where", ["model", "missing", "output"])
def test_a_resume_folder_that_is_no_checkpoint_is_refused_before_loading(
    wheel_venv, warm_cli, run, tmp_path, where
):
    out_dir = tmp_path / "out"
    folder = {"model": run["model"], "missing": tmp_path / "nowhere", "output": out_dir}[where]
    if where == "output":
        # a folder with trainer_state.json, given as the output too
        shutil.copytree(run["checkpoint"], out_dir)
    flags = ["--loss", "asft", "--resume_from_checkpoint", str(folder)]
    out = warm_cli.run([wheel_venv.trl, "sft", *flags, *tiny_sft_args(run, out_dir, 2)], run["base"] / "a")
    line = _one_line_error(out)
    expected = {
        "model": "no trainer_state.json",
        "missing": "no such folder",
        "output": "output folder itself",
    }
    assert expected[where] in line and f"resume_from_checkpoint={str(folder)!r}" in line, line
    assert "Loading" not in out.stderr


def test_a_new_run_into_a_recorded_folder_is_refused(wheel_venv, warm_cli, run):
    flags = ["--loss", "gem_ls"]
    out = warm_cli.run(
        [wheel_venv.trl, "sft", *flags, *tiny_sft_args(run, run["first"], 1)], run["base"] / "a"
    )
    line = _one_line_error(out)
    assert f"output_dir={str(run['first'])!r}" in line and "loss=asft" in line, line
    assert "resume_from_checkpoint" in line and "overwrite_run" in line, line
    assert json.loads((run["checkpoint"] / "distmatch.json").read_text())["loss"] == "asft"  # untouched


@pytest.mark.parametrize("given", ["flag", "config"])
def test_a_plain_run_into_a_recorded_folder_is_refused(wheel_venv, warm_cli, run, tmp_path, given):
    """`trl sft` without `--loss` (TRL's own loss) would overwrite the distmatch run's model and checkpoints while
    their records still name `asft`, and a later resume would continue "with the recorded loss": refused in one line,
    the output folder named as a flag or in a `--config` YAML."""
    old = tmp_path / "old"
    shutil.copytree(run["first"], old)
    args = tiny_sft_args(run, old, 1)
    if given == "config":
        at = args.index("--output_dir")
        del args[at : at + 2]
        (tmp_path / "plain.yaml").write_text(f"output_dir: {old}\n")
        args += ["--config", str(tmp_path / "plain.yaml")]
    out = warm_cli.run([wheel_venv.trl, "sft", *args], tmp_path)
    line = _one_line_error(out)
    assert f"output_dir={str(old)!r} holds another run (loss=asft" in line and "overwrite_run" in line, line
    assert "Loading" not in out.stderr
    assert sorted(p.name for p in old.glob("checkpoint-*")) == ["checkpoint-1"]
    assert json.loads((old / "checkpoint-1" / "distmatch.json").read_text())["loss"] == "asft"  # untouched


def test_a_plain_run_with_overwrite_run_leaves_no_record_of_the_old_loss(wheel_venv, warm_cli, run, tmp_path):
    """With `--overwrite_run` the plain run replaces the old one: its checkpoints and records go first, so no record
    in the folder claims a loss the new run did not train."""
    old = tmp_path / "old"
    shutil.copytree(run["first"], old)
    out = warm_cli.run([wheel_venv.trl, "sft", "--overwrite_run", *tiny_sft_args(run, old, 1)], tmp_path)
    assert out.returncode == 0, tail(out)
    assert (old / "checkpoint-1" / "trainer_state.json").is_file()  # the plain run's own checkpoint
    assert not list(old.rglob("distmatch.json")), sorted(p.as_posix() for p in old.rglob("distmatch.json"))


def test_an_option_change_within_the_same_loss_starts_a_new_history_entry(
    wheel_venv, warm_cli, run, tmp_path
):
    """The history is each (loss, options) the run trained and the steps it trained them: the same loss with another
    option value is a new entry, in the record and in the model card."""
    recorded = json.loads((run["checkpoint"] / "distmatch.json").read_text())["options"]
    assert recorded["anchor_kl_weight"] != 0.25
    resume = ["--resume_from_checkpoint", str(run["checkpoint"]), "--allow_loss_change"]
    flags = ["--loss", "asft", "--anchor_reference", "refdir", "--anchor_kl_weight", "0.25", *resume]
    out = warm_cli.run(
        [wheel_venv.trl, "sft", *flags, *tiny_sft_args(run, tmp_path / "out", 2)], run["base"] / "a"
    )
    assert out.returncode == 0, tail(out)
    record = json.loads((tmp_path / "out" / "distmatch.json").read_text())
    entries = [
        (h["loss"], h["options"]["anchor_kl_weight"], h["from_step"], h["to_step"]) for h in record["history"]
    ]
    assert entries == [("asft", recorded["anchor_kl_weight"], 0, 1), ("asft", 0.25, 1, 2)], record["history"]
    card = (tmp_path / "out" / "README.md").read_text()
    assert (
        "steps 0-1: `asft`" in card and "steps 1-2: `asft`" in card and "`anchor_kl_weight`=`0.25`" in card
    ), card


def test_overwrite_run_removes_the_old_runs_checkpoints(wheel_venv, warm_cli, run, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(run["first"], old)
    shutil.copytree(old / "checkpoint-1", old / "checkpoint-2")  # the old run went further than the new one
    flags = ["--loss", "gem_ls", "--overwrite_run"]
    out = warm_cli.run([wheel_venv.trl, "sft", *flags, *tiny_sft_args(run, old, 1)], run["base"] / "a")
    assert out.returncode == 0, tail(out)
    # no old checkpoint-2 to resume
    assert sorted(p.name for p in old.glob("checkpoint-*")) == ["checkpoint-1"]
    assert json.loads((old / "checkpoint-1" / "distmatch.json").read_text())["loss"] == "gem_ls"
    assert json.loads((old / "distmatch.json").read_text())["loss"] == "gem_ls"


def test_a_loss_change_keeps_the_history_in_the_record_and_the_card(wheel_venv, warm_cli, run, tmp_path):
    resume = ["--resume_from_checkpoint", str(run["checkpoint"]), "--allow_loss_change"]
    flags = ["--loss", "gem_ls", *resume]
    out = warm_cli.run(
        [wheel_venv.trl, "sft", *flags, *tiny_sft_args(run, tmp_path / "out", 2)], run["base"] / "a"
    )
    assert out.returncode == 0, tail(out)
    record = json.loads((tmp_path / "out" / "distmatch.json").read_text())
    steps = [(h["loss"], h["from_step"], h["to_step"]) for h in record["history"]]
    assert steps == [("asft", 0, 1), ("gem_ls", 1, 2)], record["history"]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "steps 0-1: `asft`" in card and "steps 1-2: `gem_ls`" in card, card


@pytest.mark.parametrize("option", ["anchor_reference", "emo_cost_embedding"])
@pytest.mark.parametrize("damage", ["no_weights", "truncated"])
def test_a_reference_folder_without_complete_weights_is_refused_while_parsing(
    wheel_venv, warm_cli, run, tmp_path, option, damage
):
    folder = shutil.copytree(run["model"], tmp_path / "ref")
    (weights,) = folder.glob("*.safetensors")
    if damage == "no_weights":
        weights.unlink()
    else:
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    flags = ["--loss", "asft" if option == "anchor_reference" else "emo", f"--{option}", str(folder)]
    out = warm_cli.run([wheel_venv.trl, "sft", *flags, *tiny_sft_args(run, tmp_path / "out", 1)], tmp_path)
    line = _one_line_error(out)
    expected = "has no weight file" if damage == "no_weights" else "model.safetensors is truncated"
    assert line.startswith(f"error: {option}={str(folder)!r}") and expected in line, line
    assert "Loading" not in out.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--loss", "prob", "--prob_min_p", "0.5", "--prob_max_p", "0.5"],
            "prob_min_p=0.5 = prob_max_p=0.5 keeps no",
        ),
        (
            ["--loss", "prob", "--prob_q", "1e300"],
            "prob_q=1e+300 is invalid; expected a number >= 0 and <= 10",
        ),
        (
            ["--loss", "asft", "--anchor_kl_weight", "1e30"],
            "anchor_kl_weight=1e+30 is invalid; expected a number",
        ),
    ],
    ids=["equal_p_bounds", "prob_q_overflow", "kl_weight_overflow"],
)
def test_options_that_train_nothing_or_overflow_are_refused(
    wheel_venv, warm_cli, run, tmp_path, flags, expected
):
    out = warm_cli.run([wheel_venv.trl, "sft", *flags, *tiny_sft_args(run, tmp_path / "out", 1)], tmp_path)
    line = _one_line_error(out)
    assert expected in line, line
    assert not (tmp_path / "out").exists()
