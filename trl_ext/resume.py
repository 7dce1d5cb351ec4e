"""The run record: which distmatch loss (and options) trained a checkpoint, and what a resume does with it.

Every save of a trainer that trains a distmatch loss writes `distmatch.json` next to the weights (each
`checkpoint-N/` folder and the final output folder): the loss, every loss option with its default filled in, the
framework and the distmatch version. A run that resumes from such a checkpoint

* without a `loss` continues with the recorded loss and options (one log line says so);
* with the recorded loss and the same options (the options that loss uses) resumes as usual;
* with another loss or other options is refused (one line naming both and the record file) unless
  `allow_loss_change` is set.

A checkpoint without the record (a plain TRL or Axolotl run) resumes as before. The checks are plain functions over
the record and the requested settings, used by the TRL parser checks (`trl_ext.cli`), the trainers
(`trl_ext.loss_mixin`) and the Axolotl plugin (`axolotl_distmatch.plugin`), so that all give the same answers.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distmatch.checkpoints import RECORD_FILE, last_checkpoint, run_records
from distmatch.errors import DistMatchConfigError
from distmatch.model_folder import fingerprint

from . import __version__
from .options import DISTMATCH_LOSSES, OPTION_DEFAULTS, loss_params, options_of

__all__ = [
    "ALLOW_CHANGE",
    "OVERWRITE",
    "RECORD_FILE",
    "Resume",
    "RunRecord",
    "check_checkpoint_folder",
    "check_new_run",
    "checkpoint_folder",
    "describe",
    "last_checkpoint",
    "read_record",
    "resolve_resume",
    "used_options",
    "write_record",
]

#: The setting that lets a resume train another loss or other options than the checkpoint's record.
ALLOW_CHANGE = "allow_loss_change"
#: The setting that lets a new run (not a resume) replace the run recorded in its output folder.
OVERWRITE = "overwrite_run"


@dataclass(frozen=True)
class RunRecord:
    """A checkpoint's `distmatch.json`: the loss and every loss option (defaults filled in) that trained it."""

    loss: str
    options: dict[str, Any]
    path: Path  # the file it was read from
    framework: str | None = None
    version: str | None = None
    unknown: tuple[str, ...] = ()  # recorded options this distmatch does not know (a newer version's)
    references: dict[str, Any] | None = None  # option -> fingerprint of the model folder it named
    history: tuple[dict[str, Any], ...] = ()  # each loss with its options and the steps it trained

    def history_until(self, step: int) -> list[dict[str, Any]]:
        """The recorded history, or (a record without one) the recorded loss trained steps 0 - `step`."""
        if self.history:
            return [dict(h) for h in self.history]
        return [{"loss": self.loss, "options": self.used_options(), "from_step": 0, "to_step": step}]

    def used_options(self) -> dict[str, Any]:
        """The recorded options the recorded loss uses."""
        return used_options(self.loss, self.options)


def _plain(value: Any) -> Any:
    """`value` as JSON gives it back (tuples become lists, ...), so recorded and requested values compare equal."""
    return json.loads(json.dumps(value))


def used_options(loss: str | None, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options `loss` uses (defaults filled in, as JSON gives them back), and the memory-efficient paths'
    settings that differ from their defaults: two settings train the same run when their loss and these are equal.
    (The record's `options` hold every option; the history, the messages and the model card these.)"""
    if loss not in DISTMATCH_LOSSES:
        return {}
    values = {o.name: (o, _plain(options.get(o.name, o.default))) for o in options_of(loss)}
    return {name: value for name, (o, value) in values.items() if not (o.path and value == _plain(o.default))}


def folder_options(loss: str | None) -> tuple[str, ...]:
    """The options of `loss` whose value names a model folder (`from_model`: `anchor_reference`, a cost-embedding
    folder): the only ones a record fingerprints and a resume checks. A keyword option (loss_kernels='auto') names
    none, even beside a folder ./auto."""
    return tuple(o.name for o in options_of(loss) if o.from_model) if loss in DISTMATCH_LOSSES else ()


def references_of(loss: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The model folders `loss`'s options name (`anchor_reference`, a cost-embedding folder): option -> its absolute
    path and weights' fingerprint (`distmatch.model_folder.fingerprint`)."""
    found: dict[str, Any] = {}
    for name in folder_options(loss):
        value = options.get(name, OPTION_DEFAULTS[name])
        if isinstance(value, str) and value and Path(value).expanduser().is_dir():
            found[name] = fingerprint(value)
    return found


def write_record(
    folder: str | os.PathLike,
    loss: str,
    options: Mapping[str, Any],
    framework: str,
    history: list[dict[str, Any]] | None = None,
) -> Path:
    """Write `folder/distmatch.json` (atomically: a killed save never leaves half a record)."""
    record = {
        "loss": loss,
        "options": _plain({**OPTION_DEFAULTS, **options}),
        "framework": framework,
        "distmatch_version": __version__,
        "references": references_of(loss, options),
    }
    if history:
        record["history"] = _plain(history)
    path = Path(folder) / RECORD_FILE
    partial = path.with_name(f".{RECORD_FILE}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def read_record(checkpoint: str | os.PathLike) -> RunRecord | None:
    """The record of `checkpoint` (a folder), or None when it has none (a run without a distmatch loss)."""
    path = Path(checkpoint) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        loss, options = data["loss"], data.get("options", {})
        if not isinstance(loss, str) or not isinstance(options, dict):
            raise TypeError("`loss` must be a string and `options` a mapping")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise DistMatchConfigError(
            f"resume_from_checkpoint={str(checkpoint)!r}: {path} is not a readable distmatch record "
            f"({type(err).__name__}: {err}); it must be the JSON object distmatch writes (`loss`, `options`). "
            f"Restore it, or delete it to resume this checkpoint like a run without a distmatch loss."
        ) from None
    if loss not in DISTMATCH_LOSSES:
        raise DistMatchConfigError(
            f"resume_from_checkpoint={str(checkpoint)!r}: {path} records loss={loss!r}, which this distmatch "
            f"({__version__}) does not know (known: {', '.join(DISTMATCH_LOSSES)}); resume with the distmatch "
            "version that wrote it."
        )
    unknown = tuple(sorted(k for k in options if k not in OPTION_DEFAULTS))
    try:
        loss_params(loss, {k: v for k, v in options.items() if k in OPTION_DEFAULTS})
    except ValueError as err:  # a hand-edited value: name the record file, not only the option
        raise DistMatchConfigError(
            f"resume_from_checkpoint={str(checkpoint)!r}: {path} records an invalid option: {err} Restore the "
            "value distmatch wrote (or delete the file to resume like a run without a distmatch loss)."
        ) from None
    references = data.get("references") if isinstance(data.get("references"), dict) else {}
    history = data.get("history") if isinstance(data.get("history"), list) else []
    return RunRecord(
        loss,
        options,
        path,
        data.get("framework"),
        data.get("distmatch_version"),
        unknown,
        references,
        tuple(h for h in history if isinstance(h, dict)),
    )


def checkpoint_folder(value: object, output_dir: str | os.PathLike | None) -> str | None:
    """The folder a `resume_from_checkpoint` value resumes from: a path as given, True for the last checkpoint of
    `output_dir` (as `Trainer.train` resolves it), None for None / False / no checkpoint yet."""
    if value is True:
        return None if output_dir is None else last_checkpoint(output_dir)
    if isinstance(value, (str, os.PathLike)) and str(value):
        return str(value)
    return None


def describe(loss: str | None, options: Mapping[str, Any]) -> str:
    """`loss=emo (emo_cost_embedding='frozen', ...)`: the loss and the options it uses."""
    if loss is None:
        return "no `loss`"
    used = used_options(loss, options)
    return f"loss={loss}" + (f" ({', '.join(f'{k}={v!r}' for k, v in used.items())})" if used else "")


@dataclass(frozen=True)
class Resume:
    """What a resume from a recorded checkpoint does: `action` is "adopt" (no loss asked: continue with the
    record's), "same" (the record's loss and options) or "change" (another one, allowed by `allow_loss_change`)."""

    action: str
    record: RunRecord
    checkpoint: str
    loss: str  # the loss to train
    options: dict[str, Any]  # every option, defaults filled in

    def message(self) -> str | None:
        """The one log line for the user (None when nothing changes)."""
        recorded = describe(self.record.loss, self.record.options)
        if self.action == "adopt":
            return (
                f"distmatch: resuming from {self.checkpoint} without a loss: training continues with the "
                f"recorded {recorded} (from {self.record.path})."
            )
        if self.action == "change":
            return (
                f"distmatch: resuming from {self.checkpoint}, trained with {recorded} (recorded in "
                f"{self.record.path}), with {describe(self.loss, self.options)} as asked ({ALLOW_CHANGE})."
            )
        return None


def resolve_resume(
    checkpoint: str | os.PathLike | None,
    loss: str | None,
    options: Mapping[str, Any],
    *,
    allow_change: bool = False,
) -> Resume | None:
    """Compare the run's `loss` / `options` with `checkpoint`'s record (None: no checkpoint or no record).

    `loss`: the objective the run asks for (a distmatch loss, TRL's own loss type, or None when unset); `options`:
    its loss options (unset ones may be missing). Raises `DistMatchConfigError` (one line naming both settings and
    the record file) when they differ and `allow_change` is false.
    """
    if checkpoint is None:
        return None
    record = read_record(checkpoint)
    if record is None:
        return None
    checkpoint = str(checkpoint)
    if record.unknown and not allow_change:
        raise DistMatchConfigError(
            f"resume_from_checkpoint={checkpoint!r}: {record.path} was written by distmatch "
            f"{record.version or '(unknown version)'} with option {', '.join(record.unknown)}, which this distmatch "
            f"({__version__}) does not know and would drop; resume with distmatch {record.version or 'that wrote it'}, "
            f"or set `{ALLOW_CHANGE}: true` (--{ALLOW_CHANGE}) to train without it."
        )
    recorded = record.used_options()
    if loss is None:
        adopted = {**OPTION_DEFAULTS, **{k: v for k, v in record.options.items() if k in OPTION_DEFAULTS}}
        _check_references(record, checkpoint, record.loss, adopted, allow_change)
        return Resume("adopt", record, checkpoint, record.loss, adopted)
    full = {**OPTION_DEFAULTS, **options}
    same_references = _check_references(record, checkpoint, loss, full, allow_change)
    if loss == record.loss and {**used_options(loss, full), **same_references} == recorded:
        return Resume("same", record, checkpoint, loss, full)
    if allow_change:
        return Resume("change", record, checkpoint, loss, full)
    raise DistMatchConfigError(
        f"resume_from_checkpoint={checkpoint!r} was trained with {describe(record.loss, record.options)} "
        f"(recorded in {record.path}) but this run asks for {describe(loss, full)}; resume with the recorded loss "
        f"and options (or leave `loss` unset to continue with them), or set `{ALLOW_CHANGE}: true` "
        f"(--{ALLOW_CHANGE}) to train {loss} from this checkpoint."
    )


def _check_references(
    record: RunRecord, checkpoint: str, loss: str, options: Mapping[str, Any], allow_change: bool
) -> dict[str, Any]:
    """The model folders the record fingerprinted, against those `options` name now: a folder that holds other
    weights (a relative path resolved in another working directory, a replaced model) is refused unless
    `allow_change`. Returns option -> recorded value for the folders that hold the recorded weights (under any
    path), so that naming the same model by another path resumes as the same options, and None for a folder
    holding other weights (allowed by `allow_change`), so that the options differ from the record's."""
    same: dict[str, Any] = {}
    used = set(folder_options(loss))  # a record of an older version may fingerprint a keyword option too
    for name, recorded in (record.references or {}).items():
        value = options.get(name)
        if name not in used or not isinstance(value, str) or not isinstance(recorded, dict):
            continue
        exists = Path(value).expanduser().is_dir()
        now = fingerprint(value) if exists else {"path": value, "weights": None}
        if now["weights"] == recorded.get("weights"):
            same[name] = record.options.get(name, value)
            continue
        if allow_change:
            same[name] = None  # another model under the recorded value: not the same options
            continue
        raise DistMatchConfigError(
            f"resume_from_checkpoint={checkpoint!r} was trained against {name}={recorded.get('path')!r} "
            f"(fingerprinted in {record.path}) but {name}={value!r} is now {now['path']!r}, "
            f"{'which holds other weights' if exists else 'which is no folder (moved or removed?)'}; give the "
            f"folder the run trained against, or set `{ALLOW_CHANGE}: true` "
            f"(--{ALLOW_CHANGE}) to train against this one."
        )
    return same


def check_checkpoint_folder(value: object, output_dir: str | os.PathLike | None) -> None:
    """A `resume_from_checkpoint` folder, before any model is loaded: it exists, is not the output folder itself
    and is a training checkpoint (`trainer_state.json`), not a model folder."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        return
    folder = Path(value).expanduser()
    accepted = (
        "give a checkpoint-N folder a run saved (it holds trainer_state.json), or true for the last one"
    )
    if not folder.is_dir():
        raise DistMatchConfigError(f"resume_from_checkpoint={str(value)!r}: no such folder; {accepted}.")
    if output_dir is not None and folder.resolve() == Path(output_dir).expanduser().resolve():
        raise DistMatchConfigError(
            f"resume_from_checkpoint={str(value)!r} is the output folder itself, not a checkpoint; {accepted}."
        )
    if not (folder / "trainer_state.json").is_file():
        raise DistMatchConfigError(
            f"resume_from_checkpoint={str(value)!r} is not a training checkpoint (no trainer_state.json: a model "
            f"folder?); {accepted}, or start from a model with model_name_or_path."
        )


def _recorded_loss(path: Path) -> str:
    try:
        return str(json.loads(path.read_text(encoding="utf-8")).get("loss"))
    except (OSError, ValueError, AttributeError):
        return "(unreadable record)"


def check_new_run(output_dir: str | os.PathLike | None, checkpoint: str | None, overwrite: bool) -> list[str]:
    """A new run (`checkpoint` None: not a resume) into a folder that holds another run's record (its final model or
    a `checkpoint-N`) is refused, naming the folder and the recorded loss; with `overwrite` the old run's
    checkpoints and record are removed (returned) so that no later `resume_from_checkpoint: true` picks one."""
    if checkpoint is not None or output_dir is None or not Path(output_dir).expanduser().is_dir():
        return []
    root = Path(output_dir).expanduser()
    records = [Path(r) for r in run_records(root)]
    if not records:
        return []
    if not overwrite:
        raise DistMatchConfigError(
            f"output_dir={str(output_dir)!r} holds another run (loss={_recorded_loss(records[0])}, recorded in "
            f"{records[0]}); resume it with resume_from_checkpoint, give another output_dir, or set "
            f"`{OVERWRITE}: true` (--{OVERWRITE}) to replace it (its checkpoints are removed)."
        )
    checkpoints = sorted(p for p in root.glob("checkpoint-*") if p.is_dir())
    for path in checkpoints:
        if path.is_symlink():  # a link to a checkpoint elsewhere: the link goes, what it points to stays
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)  # (another rank may remove it first)
    (root / RECORD_FILE).unlink(missing_ok=True)
    return [str(p) for p in checkpoints]
