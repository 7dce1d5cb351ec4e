"""eval_tasks.samples: reading prompt / sample / reference files, writing JSON and JSONL, benchmark detection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_tasks import samples as S

POEM = "Write a poem titled '{}' with no more than 200 words."
STORY = "Write a story titled '{}' with no more than 200 words."


def test_jsonl_round_trip_and_json_list(tmp_path: Path) -> None:
    rows = [{"id": 0, "samples": ["ä", "b"]}, {"id": "x", "samples": []}]
    S.write_jsonl(tmp_path / "sub" / "s.jsonl", rows)
    text = (tmp_path / "sub" / "s.jsonl").read_text(encoding="utf-8")
    assert text.splitlines()[0] == '{"id": 0, "samples": ["ä", "b"]}'  # UTF-8, not escaped
    assert S.read_jsonl(tmp_path / "sub" / "s.jsonl") == rows
    S.write_json(tmp_path / "a" / "r.json", rows)
    assert json.loads((tmp_path / "a" / "r.json").read_text()) == rows
    assert (tmp_path / "a" / "r.json").read_text().endswith("]\n")
    assert S.read_jsonl(tmp_path / "a" / "r.json") == rows  # a .json list works too


def test_read_jsonl_errors_name_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(S.InputError, match=r"no such file"):
        S.read_jsonl(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 0}\n\n{"id": \n')
    with pytest.raises(S.InputError, match=r"bad\.jsonl:3: not valid JSON"):
        S.read_jsonl(bad)
    obj = tmp_path / "obj.json"
    obj.write_text('{"id": 0}')
    with pytest.raises(S.InputError, match="must hold a list"):
        S.read_jsonl(obj)
    assert issubclass(S.InputError, ValueError)


def test_read_prompts_formats_and_checks(tmp_path: Path) -> None:
    txt = tmp_path / "p.txt"
    txt.write_text("first prompt\n\n second \n")
    assert S.read_prompts(txt) == [{"id": 0, "prompt": "first prompt"}, {"id": 1, "prompt": " second "}]
    jl = tmp_path / "p.jsonl"
    S.write_jsonl(
        jl, ["plain", {"id": "m", "messages": [{"role": "user", "content": "hi"}]}, {"text": "raw"}]
    )
    assert S.read_prompts(jl) == [
        {"prompt": "plain", "id": 0},
        {"id": "m", "messages": [{"role": "user", "content": "hi"}]},
        {"text": "raw", "id": 2},
    ]
    for rows, message in (
        ([{"prompt": "a", "text": "b"}], "exactly one of"),
        ([{"prompt": "  "}], "'prompt' must be a non-empty string"),
        ([{"messages": []}], "'messages' must be a non-empty list"),
        ([{"id": 1, "prompt": "a"}, {"id": "1", "prompt": "b"}], "ids are not unique"),
        ([], "no prompts"),
        ([3], "record #0 is a int"),
    ):
        S.write_jsonl(jl, rows)
        with pytest.raises(S.InputError, match=message):
            S.read_prompts(jl)


def test_prompt_text_and_benchmark_detection() -> None:
    assert S.prompt_text({"prompt": "p"}) == "p"
    messages = [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "u2"},
    ]
    assert S.prompt_text({"messages": messages}) == "u2"
    assert S.prompt_text({"text": "t"}) == "t"
    assert S.detect_benchmark([POEM.format("A"), POEM.format("B")]) == "gem_poem"
    assert S.detect_benchmark([STORY.format("A")]) == "gem_story"
    assert S.detect_benchmark([POEM.format("A"), STORY.format("B")]) is None
    assert S.detect_benchmark([POEM.format("A"), None]) is None
    assert S.detect_benchmark([]) is None


def test_read_references_by_id(tmp_path: Path) -> None:
    refs = tmp_path / "refs.jsonl"
    S.write_jsonl(refs, [{"id": "b", "text": "human b"}, {"id": "a", "reference": "human a"}])
    records = [{"id": "a"}, {"id": "b"}]
    assert S.read_references(refs, records) == ["human a", "human b"]
    with pytest.raises(S.InputError, match=r"no reference for prompt id\(s\) \['c'\]"):
        S.read_references(refs, [*records, {"id": "c"}])
    S.write_jsonl(refs, [{"id": "a", "reference": 3}])
    with pytest.raises(S.InputError, match="record #0 has no 'reference'/'text' string"):
        S.read_references(refs, records)
