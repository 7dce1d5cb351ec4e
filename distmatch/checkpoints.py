"""The run record's file name and the checkpoint a run resumes from: shared by the trainers (`trl_ext.resume`, the
Axolotl plugin) and the activation hooks, which must decide without importing torch whether a resumed run carries a
record."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["RECORD_FILE", "axolotl_resume_checkpoint", "has_record", "last_checkpoint", "run_records"]

#: The file a distmatch run writes into every checkpoint and output folder (its loss and options; `trl_ext.resume`).
RECORD_FILE = "distmatch.json"


def last_checkpoint(output_dir: object) -> str | None:
    """The `checkpoint-N` folder with the largest N in `output_dir` (what `resume_from_checkpoint=True` and
    Axolotl's `auto_resume_from_checkpoints` resume from), or None."""
    try:
        names = os.listdir(str(output_dir))
    except OSError:
        return None
    steps = [
        (int(name.split("-", 1)[1]), name)
        for name in names
        if name.startswith("checkpoint-")
        and name.split("-", 1)[1].isdigit()
        and os.path.isdir(os.path.join(str(output_dir), name))
    ]
    return os.path.join(str(output_dir), max(steps)[1]) if steps else None


def run_records(output_dir: object) -> list[str]:
    """The run records in `output_dir`: its own (a finished run's model) and its `checkpoint-N` folders', in that
    order; empty when it holds none or is no folder."""
    if not isinstance(output_dir, (str, os.PathLike)):
        return []
    root = os.path.expanduser(str(output_dir))
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("checkpoint-"))
    except OSError:
        return []
    folders = [root, *(os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n)))]
    return [os.path.join(f, RECORD_FILE) for f in folders if os.path.isfile(os.path.join(f, RECORD_FILE))]


def has_record(checkpoint: object) -> bool:
    """Whether `checkpoint` (a `resume_from_checkpoint` value) is a folder holding a distmatch run record."""
    return isinstance(checkpoint, str) and os.path.isfile(os.path.join(checkpoint, RECORD_FILE))


def axolotl_resume_checkpoint(cfg: Mapping) -> object:
    """`resume_from_checkpoint`, else with `auto_resume_from_checkpoints` the last `checkpoint-N` of `output_dir`
    (what Axolotl resumes from), or None: an Axolotl config, raw or validated."""
    checkpoint = cfg.get("resume_from_checkpoint")
    if checkpoint is not None or not cfg.get("auto_resume_from_checkpoints"):
        return checkpoint
    return last_checkpoint(cfg.get("output_dir") or "./model-out")
