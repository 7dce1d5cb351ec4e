"""Sample I/O of ``distmatch-eval``: prompt files in, sample JSONL / result JSON out, and the benchmark of a prompt set.

A *samples file* (written by ``distmatch-eval generate`` and the demo) is JSON Lines, one record per prompt:
``id``, ``prompt``, ``input_text`` (the prompt as the model saw it), ``samples`` (the K sampled responses),
``meta`` (generation settings) and, when the prompt file has one, ``reference`` (a human text, for MAUVE).

Errors in the input raise :class:`InputError` (a ``ValueError``) naming the file and the record. Standard library
only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "InputError",
    "detect_benchmark",
    "prompt_text",
    "read_jsonl",
    "read_prompts",
    "read_references",
    "write_json",
    "write_jsonl",
]


class InputError(ValueError):
    """Bad input to an evaluation command (a missing or malformed file, a bad flag value): one line, exit status 2."""


def read_jsonl(path: str | os.PathLike[str]) -> list[Any]:
    """Records of a JSONL file (a ``.json`` file holding a list also works); errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file.")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: not valid JSON ({err}).") from err
        if not isinstance(data, list):
            raise InputError(f"{path}: a .json input must hold a list of records.")
        return data
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{number}: not valid JSON ({err.msg}).") from err
    return records


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """`data` as indented UTF-8 JSON (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_jsonl(path: str | os.PathLike[str], records: Iterable[Any]) -> None:
    """`records` as JSON Lines, one record a line (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def read_prompts(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Prompt records from ``.txt`` (one prompt a line) or JSONL / JSON with ``prompt``, ``messages`` or ``text``
    (raw text continued without a chat template); optional ``id`` and ``reference`` (human text, for MAUVE)."""
    path = Path(path)
    if path.suffix == ".txt":
        if not path.is_file():
            raise InputError(f"{path}: no such file.")
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        records: list[Any] = [{"id": i, "prompt": line} for i, line in enumerate(lines)]
    else:
        records = read_jsonl(path)
    out = []
    for i, record in enumerate(records):
        if isinstance(record, str):
            record = {"prompt": record}
        if not isinstance(record, dict):
            raise InputError(f"{path}: record #{i} is a {type(record).__name__}, expected an object.")
        kinds = [k for k in ("prompt", "messages", "text") if k in record]
        if len(kinds) != 1:
            raise InputError(
                f"{path}: record #{i} needs exactly one of 'prompt', 'messages' or 'text' (keys: {sorted(record)})."
            )
        value = record[kinds[0]]
        if kinds[0] == "messages":
            if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
                raise InputError(
                    f"{path}: record #{i}: 'messages' must be a non-empty list of {{role, content}}."
                )
        elif not isinstance(value, str) or not value.strip():
            raise InputError(f"{path}: record #{i}: '{kinds[0]}' must be a non-empty string.")
        out.append({**record, "id": record.get("id", i)})
    if not out:
        raise InputError(f"{path}: no prompts.")
    ids = [r["id"] for r in out]
    if len(set(map(str, ids))) != len(ids):
        raise InputError(f"{path}: record ids are not unique.")
    return out


def read_references(path: str | os.PathLike[str], records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The human text of each of `records` (matched by ``id``) from a JSONL of ``reference`` / ``text`` records
    (or plain strings, matched by position)."""
    by_id = {}
    for i, r in enumerate(read_jsonl(path)):
        text = (
            r if isinstance(r, str) else (r.get("reference", r.get("text")) if isinstance(r, dict) else None)
        )
        if not isinstance(text, str):
            raise InputError(f"{path}: record #{i} has no 'reference'/'text' string.")
        by_id[str(r.get("id", i)) if isinstance(r, dict) else str(i)] = text
    missing = [r["id"] for r in records if str(r["id"]) not in by_id]
    if missing:
        raise InputError(f"{path}: no reference for prompt id(s) {missing[:5]}.")
    return [by_id[str(r["id"])] for r in records]


def detect_benchmark(prompts: Sequence[str | None]) -> str | None:
    """``gem_poem`` / ``gem_story`` when every prompt is a GEM creative-writing prompt, else None."""
    from eval_tasks.published import benchmarks

    for key, spec in benchmarks().items():
        prefix = spec.get("prompt_prefix")
        if prefix and prompts and all(isinstance(p, str) and p.startswith(prefix) for p in prompts):
            return key
    return None


def prompt_text(record: Mapping[str, Any]) -> str | None:
    """The user prompt of a prompt record: ``prompt``, the last user turn of ``messages``, or ``text``."""
    if "prompt" in record:
        return record["prompt"]
    if "messages" in record:
        users = [m.get("content") for m in record["messages"] if m.get("role") == "user"]
        return users[-1] if users else None
    return record.get("text")
