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


def test_records_with_unicode_line_separators_read_back(tmp_path: Path) -> None:
    rows = [{"id": 0, "samples": ["a\u2028b", "c\x85d\x0ce"]}, {"id": 1, "samples": ["x", "y"]}]
    # written unescaped (ensure_ascii=False), as generate writes them
    S.write_jsonl(tmp_path / "s.jsonl", rows)
    assert S.read_jsonl(tmp_path / "s.jsonl") == rows  # lines end at \n only


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


def _meta(**changes: object) -> dict:
    meta = {
        "model": "m",
        "backend": "hf",
        "num_samples": 3,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 0.9,
        "max_new_tokens": 12,
        "seed": 42,
        "chat_template_mode": "auto",
        "benchmark": None,
        "prompts_file": "p.jsonl",
        "num_prompts_in_file": 2,
    }
    return {**meta, **changes}


def test_check_same_settings_names_each_mixed_setting(tmp_path: Path) -> None:
    same = [{"id": i, "samples": ["a", "b"], "meta": _meta(num_prompts_in_file=i + 1)} for i in range(3)]
    # num_prompts_in_file is not a setting (--limit, resumed)
    S.check_same_settings(same, tmp_path / "s.jsonl")
    S.check_same_settings(
        [{"id": 0, "samples": ["a", "b"]}, *same], "s.jsonl"
    )  # records without meta: no claim
    old = {
        "id": 9,
        "samples": ["a", "b"],
        "meta": {k: v for k, v in _meta().items() if k != "chat_template_mode"},
    }
    S.check_same_settings([*same, old], "s.jsonl")  # a key older files lack is compared where present
    mixed = [*same, {"id": "x", "samples": ["a", "b"], "meta": _meta(temperature=0.7, num_samples=4)}]
    with pytest.raises(S.InputError) as err:
        S.check_same_settings(mixed, tmp_path / "s.jsonl")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 's.jsonl'}: ")
    assert "num_samples 3 (3 records, first id 0) vs 4 (1 record, first id 'x')" in message, message
    assert "temperature 1.0 (3 records, first id 0) vs 0.7 (1 record, first id 'x')" in message, message
    assert "split this file by the records' 'meta'" in message


def test_check_resume_refuses_other_settings_and_prompts(tmp_path: Path) -> None:
    prompts = [{"id": "p0", "prompt": "a"}, {"id": "p1", "prompt": "b"}]
    records = [{"id": "p0", "prompt": "a", "samples": ["x", "y"], "meta": _meta()}]
    assert S.check_resume(records, _meta(), "o.jsonl", prompts) == _meta()
    with pytest.raises(S.InputError) as err:
        S.check_resume(records, _meta(temperature=0.7, top_k=0), "o.jsonl", prompts)
    assert str(err.value) == (
        "--resume: o.jsonl was made with other settings: --temperature recorded 1.0, requested 0.7; --top-k "
        "recorded 50, requested 0. Resume with the recorded settings, write to another -o file, or pass "
        "--overwrite to replace it."
    )
    for key, value in [
        ("model", "other"),
        ("num_samples", 4),
        ("top_p", 0.8),
        ("max_new_tokens", 8),
        ("seed", 1),
        ("backend", "vllm"),
        ("chat_template_mode", "never"),
        ("benchmark", "gem_poem"),
        ("prompts_file", "q.jsonl"),
    ]:
        with pytest.raises(
            S.InputError, match=rf"{S.SETTING_FLAGS[key]} recorded .*requested {json.dumps(value)}"
        ):
            S.check_resume(records, _meta(**{key: value}), "o.jsonl", prompts)
    # the same file under another spelling: accepted, and the recorded spelling is kept for the new records
    (tmp_path / "model").mkdir()
    (tmp_path / "p.jsonl").write_text("")
    spelled = [
        {**records[0], "meta": _meta(model=str(tmp_path / "model"), prompts_file=str(tmp_path / "p.jsonl"))}
    ]
    requested = _meta(model=f"{tmp_path}/./model/", prompts_file=f"{tmp_path}/../{tmp_path.name}/p.jsonl")
    agreed = S.check_resume(spelled, requested, "o.jsonl", prompts)
    assert (agreed["model"], agreed["prompts_file"]) == (str(tmp_path / "model"), str(tmp_path / "p.jsonl"))
    with pytest.raises(S.InputError, match=r"prompt id='p0' in o.jsonl is \"a\", in --prompts \"changed\""):
        S.check_resume(records, _meta(), "o.jsonl", [{"id": "p0", "prompt": "changed"}])
    with pytest.raises(S.InputError, match=r"has a record id='p0' that --prompts has not"):
        S.check_resume(records, _meta(), "o.jsonl", [{"id": "q0", "prompt": "a"}])
    with pytest.raises(S.InputError, match=r"record #0 has no 'id' or no generation settings"):
        S.check_resume([{"id": "p0", "samples": ["x", "y"]}], _meta(), "o.jsonl", prompts)
