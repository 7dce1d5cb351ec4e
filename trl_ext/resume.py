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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distmatch.checkpoints import RECORD_FILE, last_checkpoint
from distmatch.errors import DistMatchConfigError

from . import __version__
from .options import DISTMATCH_LOSSES, OPTION_DEFAULTS, options_of

__all__ = [
    "ALLOW_CHANGE",
    "RECORD_FILE",
    "Resume",
    "RunRecord",
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


@dataclass(frozen=True)
class RunRecord:
    """A checkpoint's `distmatch.json`: the loss and every loss option (defaults filled in) that trained it."""

    loss: str
    options: dict[str, Any]
    path: Path  # the file it was read from
    framework: str | None = None
    version: str | None = None

    def used_options(self) -> dict[str, Any]:
        """The recorded options the recorded loss uses."""
        return used_options(self.loss, self.options)


def _plain(value: Any) -> Any:
    """`value` as JSON gives it back (tuples become lists, ...), so recorded and requested values compare equal."""
    return json.loads(json.dumps(value))


def used_options(loss: str | None, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options `loss` uses (defaults filled in, as JSON gives them back): two settings train the same
    objective when their loss and these are equal."""
    if loss not in DISTMATCH_LOSSES:
        return {}
    return {o.name: _plain(options.get(o.name, o.default)) for o in options_of(loss)}


def write_record(folder: str | os.PathLike, loss: str, options: Mapping[str, Any], framework: str) -> Path:
    """Write `folder/distmatch.json` (atomically: a killed save never leaves half a record)."""
    record = {
        "loss": loss,
        "options": _plain({**OPTION_DEFAULTS, **options}),
        "framework": framework,
        "distmatch_version": __version__,
    }
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
    return RunRecord(loss, options, path, data.get("framework"), data.get("distmatch_version"))


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
    recorded = record.used_options()
    if loss is None:
        return Resume("adopt", record, checkpoint, record.loss, {**OPTION_DEFAULTS, **record.options})
    full = {**OPTION_DEFAULTS, **options}
    if loss == record.loss and used_options(loss, full) == recorded:
        return Resume("same", record, checkpoint, loss, full)
    if allow_change:
        return Resume("change", record, checkpoint, loss, full)
    raise DistMatchConfigError(
        f"resume_from_checkpoint={checkpoint!r} was trained with {describe(record.loss, record.options)} "
        f"(recorded in {record.path}) but this run asks for {describe(loss, full)}; resume with the recorded loss "
        f"and options (or leave `loss` unset to continue with them), or set `{ALLOW_CHANGE}: true` "
        f"(--{ALLOW_CHANGE}) to train {loss} from this checkpoint."
    )
