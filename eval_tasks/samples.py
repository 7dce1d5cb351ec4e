"""Sample I/O of ``distmatch-eval``: prompt files in, sample JSONL / result JSON out, and the benchmark of a prompt set.

A *samples file* (written by ``distmatch-eval generate`` and the demo) is JSON Lines, one record per prompt:
``id``, ``prompt``, ``input_text`` (the prompt as the model saw it), ``samples`` (the K sampled responses),
``meta`` (generation settings), when the prompt file has one, ``reference`` (a human text, for MAUVE), and
``input_truncated: true`` when the prompt was longer than the model's context allows (``input_text`` is then the
last tokens it kept, as lm-eval keeps them).
The records of one file must agree on the settings of :data:`SETTING_FLAGS`: :func:`check_resume` refuses to continue
a file with other settings, :func:`check_same_settings` refuses a file whose records were made with different ones.

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
    "SETTING_FLAGS",
    "InputError",
    "check_resume",
    "check_same_settings",
    "check_unique_ids",
    "detect_benchmark",
    "prompt_text",
    "read_jsonl",
    "read_prompts",
    "read_references",
    "read_text",
    "write_json",
    "write_jsonl",
]


class InputError(ValueError):
    """Bad input to an evaluation command (a missing or malformed file, a bad flag value): one line, exit status 2."""


def read_text(path: str | os.PathLike[str]) -> str:
    """The text of a UTF-8 file; a file that is not UTF-8 is refused naming the file, line and column."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file.")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")  # a leading byte-order mark (Windows editors) is dropped
    except UnicodeDecodeError as err:
        body = err.object  # without the byte-order mark
        line_start = body.rfind(b"\n", 0, err.start) + 1
        line = body.count(b"\n", 0, err.start) + 1
        raise InputError(
            f"{path}:{line}: not UTF-8 (byte 0x{body[err.start]:02x} at column {err.start - line_start + 1}); "
            "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE > NEW) and give that."
        ) from None


def read_jsonl(path: str | os.PathLike[str]) -> list[Any]:
    """Records of a JSONL file (a ``.json`` file holding a list also works); errors name the line.

    Lines end at ``\n`` only (a record may hold U+2028 and the like unescaped, as ``write_jsonl`` writes them).
    A last line that is not JSON and has no line end is reported as cut off (an interrupted ``generate``), with
    how to continue."""
    path = Path(path)
    text = read_text(path)
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}: not valid JSON ({err}).") from err
        if not isinstance(data, list):
            raise InputError(f"{path}: a .json input must hold a list of records.")
        return data
    records = []
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):  # no line end after it: cut off while being written
                keep = len("\n".join(lines[:-1]).encode("utf-8")) + (1 if len(lines) > 1 else 0)
                raise InputError(
                    f"{path}:{number}: the last line is cut off (not JSON, no line end). If an interrupted "
                    f"`distmatch-eval generate` wrote it: remove it (truncate -s {keep} {path}), then run the same "
                    "generate command with --resume, which generates its prompt again; else fix the line."
                ) from err
            raise InputError(f"{path}:{number}: not valid JSON ({err.msg}).") from err
    return records


def check_unique_ids(records: Sequence[Any], path: str | os.PathLike[str], key: str = "id") -> None:
    """Refuse a file in which two records have the same `key` (compared as text): each prompt would count twice."""
    seen: dict[str, int] = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict) or key not in record:
            continue
        first = seen.setdefault(str(record[key]), i)
        if first != i:
            raise InputError(
                f"{path}: records #{first} and #{i} have the same {key} {_shown(record[key])}: the file holds a "
                "prompt twice (two files joined, or a run appended to twice?) and it would count twice. Keep one "
                "record per prompt (or score each run's file on its own)."
            )


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
        lines = [line for line in read_text(path).splitlines() if line.strip()]
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
    rows = read_jsonl(path)
    check_unique_ids(rows, path)  # two references of one prompt: which one counts?
    for i, r in enumerate(rows):
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


#: The generation settings in a record's ``meta`` that every record of a samples file shares, with the
#: ``distmatch-eval generate`` flag that sets each. Not compared: ``num_prompts_in_file`` (the prompts left after
#: ``--limit``, so it changes when a limited run is resumed) and the per-record ``chat_template`` (False for ``text``
#: records). A key missing from a record (files of older versions) is not compared for that record.
SETTING_FLAGS: dict[str, str] = {
    "model": "--model",
    "backend": "--backend",
    "num_samples": "-k/--num-samples",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "max_new_tokens": "--max-new-tokens",
    "min_new_tokens": "--min-new-tokens",
    "seed": "--seed",
    "chat_template_mode": "--chat-template",
    "benchmark": "--benchmark",
    "prompts_file": "--prompts",
}
_PATH_SETTINGS = ("model", "prompts_file")


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _settings_by_value(records: Sequence[Any]) -> dict[str, dict[str, list[Any]]]:
    """For each setting of :data:`SETTING_FLAGS`: its recorded values (as JSON) -> the ids of the records with it."""
    found: dict[str, dict[str, list[Any]]] = {key: {} for key in SETTING_FLAGS}
    for i, record in enumerate(records):
        meta = record.get("meta") if isinstance(record, dict) else None
        if not isinstance(meta, dict):
            continue
        for key in SETTING_FLAGS:
            if key in meta:
                found[key].setdefault(_shown(meta[key]), []).append(record.get("id", f"#{i}"))
    return {key: values for key, values in found.items() if values}


def check_same_settings(records: Sequence[Any], path: str | os.PathLike[str]) -> None:
    """Refuse a samples file whose records were made with different generation settings (:data:`SETTING_FLAGS`):
    one score over them would mix the settings and record those of the first record only."""
    mixed = []
    for key, values in _settings_by_value(records).items():
        if len(values) > 1:
            groups = [
                f"{value} ({len(ids)} record{'s' if len(ids) > 1 else ''}, first id {ids[0]!r})"
                for value, ids in values.items()
            ]
            mixed.append(f"{key} {' vs '.join(groups)}")
    if mixed:
        raise InputError(
            f"{path}: its records were made with different generation settings: {'; '.join(mixed)}. Score each "
            "setting on its own: generate each into its own -o file, or split this file by the records' 'meta'."
        )


def _same_path(a: Any, b: Any) -> bool:
    try:
        return os.path.samefile(str(a), str(b))
    except (OSError, ValueError):
        return False


def check_resume(
    records: Sequence[Any],
    requested: Mapping[str, Any],
    path: str | os.PathLike[str],
    prompts: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """Refuse to continue the samples file `path` (its `records`) with other generation settings than it was made
    with, or with a prompt file whose prompts differ from the records'. `requested`: the ``meta`` the new records
    would get; `prompts`: the whole prompt file (before ``--limit``).

    Returns `requested` with the recorded spelling of the model and prompt-file paths where both name the same file
    (``out/m`` and ``./out/m/``), so the file stays uniform.
    """
    for i, record in enumerate(records):
        if not isinstance(record, dict) or "id" not in record or not isinstance(record.get("meta"), dict):
            raise InputError(
                f"--resume: {path}: record #{i} has no 'id' or no generation settings ('meta'), so it cannot be "
                "checked against this run's; write to another -o file, or pass --overwrite to replace it."
            )
    agreed = dict(requested)
    different = []
    for key, values in _settings_by_value(records).items():
        if key not in requested:
            continue
        wanted = requested[key]
        recorded = [json.loads(v) for v in values]
        if recorded == [wanted]:
            continue
        if key in _PATH_SETTINGS and len(recorded) == 1 and _same_path(recorded[0], wanted):
            agreed[key] = recorded[0]
            continue
        shown = " / ".join(values)
        different.append(f"{SETTING_FLAGS[key]} recorded {shown}, requested {_shown(wanted)}")
    if different:
        raise InputError(
            f"--resume: {path} was made with other settings: {'; '.join(different)}. Resume with the recorded "
            "settings, write to another -o file, or pass --overwrite to replace it."
        )
    by_id = {str(p["id"]): prompt_text(p) for p in prompts}
    for record in records:
        key = str(record["id"])
        if key not in by_id:
            raise InputError(
                f"--resume: {path} has a record id={record['id']!r} that --prompts has not: the file was made from "
                "another prompt file. Resume with that file, write to another -o file, or pass --overwrite."
            )
        if "prompt" in record and record["prompt"] != by_id[key]:
            raise InputError(
                f"--resume: prompt id={record['id']!r} in {path} is {_shown(record['prompt'])[:80]}, in --prompts "
                f"{_shown(by_id[key])[:80]}: the prompt file changed. Resume with the file the records were made "
                "from, write to another -o file, or pass --overwrite."
            )
    return agreed
