"""eval_tasks.code.code_tasks: Magicoder's prompts, the completion cut, the test programs (run in the sandbox), the
loaders on fixture rows in the datasets' own formats, and the code tasks' options."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.code import code_tasks as ct
from eval_tasks.sandbox import execute
from eval_tasks.task_options import check_task_options, family_of_task, resolve

FIXTURES = Path(__file__).parent / "fixtures" / "code"
needs_unshare = pytest.mark.skipif(shutil.which("unshare") is None, reason="the sandbox needs unshare")


def rows(key: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / key / "test.jsonl").read_text().splitlines()]


def test_humaneval_prompt_is_magicoders() -> None:
    doc = rows("humaneval")[1]
    text, prefix = ct.prompt_text(doc, "distmatch_humaneval", "raw")
    stripped = doc["prompt"].strip()
    assert prefix is None
    assert text == (
        "You are an exceptionally intelligent coding assistant that consistently delivers accurate and reliable "
        "responses to user instructions.\n\n@@ Instruction\nWrite a solution to the following problem:\n"
        f"```python\n{stripped}\n```\n\n@@ Response\n```python\n{stripped}"
    )
    user, prefix = ct.prompt_text(doc, "distmatch_humaneval", "chat")
    assert text == user + "\n\n@@ Response\n" + prefix and prefix == f"```python\n{stripped}"


def test_mbpp_prompt_adds_the_full_stop_and_the_first_assertion() -> None:
    doc = rows("mbpp_plus")[1]  # its description has no final "."
    text, _ = ct.prompt_text(doc, "distmatch_mbpp_plus", "raw")
    assert text.endswith(
        "@@ Instruction\nWrite a python function to identify non-prime numbers. Your code should satisfy the "
        "following assertion:\n```python\nassert is_not_prime(2) == False\n```\n\n@@ Response\n```python"
    )
    with pytest.raises(DistMatchConfigError, match="code_prompt='plain' is not valid"):
        ct.prompt_text(doc, "distmatch_mbpp_plus", "plain")
    with pytest.raises(DistMatchConfigError, match="Unknown code task 'distmatch_apps'"):
        ct.magicoder_parts(doc, "distmatch_apps")


def test_completion_is_cut_at_the_first_fence() -> None:
    assert ct.cut_completion("    return 1\n```\nmore text ```") == "    return 1\n"
    assert ct.cut_completion("    return 1\n") == "    return 1\n"


@needs_unshare
def test_canonical_solutions_pass_and_wrong_ones_fail() -> None:
    for key in ("humaneval", "humaneval_plus"):
        for doc in rows(key):
            tests = "plus" if key.endswith("plus") else "base"
            good = ct.completion_program(
                doc, "distmatch_humaneval", doc["canonical_solution"] + "```\nok", tests
            )
            assert execute(good, 10, allow=True).passed, (key, doc["task_id"])
            bad = ct.completion_program(doc, "distmatch_humaneval", "    return None\n", tests)
            assert not execute(bad, 10, allow=True).passed
    for doc in rows("mbpp_plus"):
        for tests in ("base", "plus"):
            good = ct.completion_program(doc, "distmatch_mbpp_plus", "\n" + doc["code"] + "\n```", tests)
            assert execute(good, 10, allow=True).passed, (doc["task_id"], tests)


@needs_unshare
def test_plus_tests_catch_what_the_base_tests_miss() -> None:
    doc = rows("mbpp_plus")[1]
    # Wrong for 1 (not a prime, so True is expected): the base tests never try 1, MBPP+'s do.
    sloppy = "\ndef is_not_prime(n):\n    return any(n % i == 0 for i in range(2, n))\n"
    base = ct.completion_program(doc, "distmatch_mbpp_plus", sloppy, "base")
    plus = ct.completion_program(doc, "distmatch_mbpp_plus", sloppy, "plus")
    assert execute(base, 10, allow=True).passed
    assert not execute(plus, 10, allow=True).passed


def test_loaders_read_the_datasets_own_formats() -> None:
    data = str(FIXTURES)
    humaneval = ct.code_documents("distmatch_humaneval", data_dir=data)
    assert [d["task_id"] for d in humaneval] == ["HumanEval/0", "HumanEval/2"]
    assert set(humaneval[0]) == {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
    plus = ct.code_documents("distmatch_humaneval", tests="plus", data_dir=data)
    assert plus[1]["test"] != humaneval[1]["test"] and "inputs = " in plus[1]["test"]
    mbpp = ct.code_documents("distmatch_mbpp_plus", tests="plus", data_dir=data)
    assert [d["task_id"] for d in mbpp] == ["2", "3"]  # int ids in the dataset, strings here
    assert set(mbpp[0]) == {"task_id", "code", "prompt", "source_file", "test_imports", "test_list", "test"}


def test_the_table_names_the_hub_datasets_and_problem_counts() -> None:
    assert {k: (s.path, s.plus_path, s.problems) for k, s in ct.CODE_TASKS.items()} == {
        "humaneval": ("openai/openai_humaneval", "evalplus/humanevalplus", 164),
        "mbpp_plus": ("evalplus/mbppplus", "evalplus/mbppplus", 378),
    }


def test_code_options_and_the_gem_protocol() -> None:
    assert family_of_task("distmatch_humaneval") == family_of_task("distmatch_mbpp_plus") == "code"
    default = resolve("code", {})
    assert (default["code_samples"], default["code_prompt"], default["code_tests"]) == (10, "raw", "base")
    assert resolve("code", {"protocol": "gem_official"})["code_samples"] == 200
    assert resolve("code", {"protocol": "gem_official", "code_samples": 20})["code_samples"] == 20
    with pytest.raises(DistMatchConfigError, match="protocol 'emo_official' is for other tasks"):
        resolve("code", {"protocol": "emo_official"}, "distmatch_humaneval")
    with pytest.raises(DistMatchConfigError) as err:
        check_task_options({"code_samples": 0, "code_tests": "extra", "code_timout": 3})
    message = str(err.value)
    assert (
        "code_samples=0 is invalid for the code tasks (HumanEval, MBPP+); expected an integer >= 1" in message
    )
    assert "code_tests='extra' is invalid" in message and "one of 'base', 'plus'" in message
    assert "unknown task option 'code_timout' (did you mean 'code_timeout'?)" in message
    assert "\n" not in message


@pytest.mark.parametrize("timeout", [10_000_000_000, 601, 1e10, 0, True])
def test_a_code_timeout_the_sandbox_would_refuse_is_refused_by_the_options_check(timeout) -> None:
    """Before any sample is generated (the pre-flight and the task class run this check), not when the first
    program runs (``execute`` raised OverflowError for 1e10 after every sample was generated)."""
    from eval_tasks.sandbox import MAX_TIMEOUT_S

    with pytest.raises(
        DistMatchConfigError,
        match=rf"code_timeout={timeout!r} is invalid for the code tasks .*; expected an integer >= 1 and <= {MAX_TIMEOUT_S}",
    ):
        check_task_options({"code_timeout": timeout})
    check_task_options({"code_timeout": MAX_TIMEOUT_S})


def test_preflight_knows_the_code_tasks_options_and_data(tmp_path) -> None:
    from eval_tasks.lm_eval_tasks.preflight import check_options_apply, missing_data

    check_options_apply(["distmatch_humaneval"], {"protocol": "gem_official", "code_samples": 3})
    with pytest.raises(DistMatchConfigError, match="num_samples=3 is not read by distmatch_humaneval"):
        check_options_apply(["distmatch_humaneval"], {"num_samples": 3})
    assert missing_data(["distmatch_humaneval", "distmatch_mbpp_plus"], str(FIXTURES)) == []
    assert missing_data(["distmatch_mbpp_plus"], str(tmp_path)) == [
        f"{tmp_path / 'mbpp_plus' / 'test.jsonl'} (Hub 'evalplus/mbppplus', split 'test')"
    ]
