"""distmatch_humaneval / distmatch_mbpp_plus through lm-eval: the tiny model on the fixture problems (the datasets'
own row formats, through the real loaders), lm-eval's unsafe-code gate, the chat prompt, and pass@k of known
completions through the task class."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.code.code_tasks import completion_program, prompt_text
from eval_tasks.sandbox import MAX_TIMEOUT_S, execute
from tests.eval.lm_eval_tasks.helpers import (
    _check,
    _lm_eval_cmd,
    _model_args,
    _results,
    _run,
    _samples,
    needs_lm_eval,
)
from tests.eval.sandbox.test_sandbox import EARLY_EXITS, IN_CHECK
from tests.helpers.env import REPO_ROOT

pytestmark = [
    needs_lm_eval,
    pytest.mark.skipif(shutil.which("unshare") is None, reason="the sandbox needs unshare"),
]
FIXTURES = REPO_ROOT / "tests" / "eval" / "fixtures" / "code"
TASKS = ("distmatch_humaneval", "distmatch_mbpp_plus")


@pytest.fixture(scope="module")
def code_env(workdir: Path, env: dict[str, str]) -> dict[str, str]:
    return dict(env, DISTMATCH_EVAL_DATA_DIR=str(FIXTURES), DISTMATCH_LM_EVAL_HOOK="0")


@pytest.fixture(scope="module")
def code_run(workdir: Path, code_env: dict[str, str]) -> Path:
    out = workdir / "out_code"
    cmd = _lm_eval_cmd(
        workdir / "model", ",".join(TASKS), out, {"code_samples": 3}, "--gen_kwargs", "max_gen_toks=24"
    )
    _check(_run([*cmd, "--confirm_run_unsafe_code"], code_env, workdir))
    return out


def test_tiny_model_run_scores_every_sample_in_the_sandbox(code_run: Path) -> None:
    results = _results(code_run)
    for task in TASKS:
        metrics = results["results"][task]
        scores = {k for k in metrics if k.startswith("pass@") and "_stderr" not in k}
        assert scores == {"pass@1,none"}  # only the k <= 3 samples
        samples = _samples(code_run, task)
        assert len(samples) == 2
        per_doc = []
        for sample in samples:
            doc = sample["doc"]
            assert sample["arguments"]["gen_args_0"]["arg_0"] == prompt_text(doc, task, "raw")[0]
            (completions,) = sample["filtered_resps"]  # the filter keeps all 3 samples
            assert len(completions) == 3
            # The logged score is the share of completions whose program passes when run again here.
            passed = [execute(completion_program(doc, task, c), 10, allow=True).passed for c in completions]
            assert sample["pass@1"] == pytest.approx(100 * sum(passed) / 3)
            per_doc.append(sample["pass@1"])
        assert metrics["pass@1,none"] == pytest.approx(sum(per_doc) / len(per_doc))
    config = results["configs"]["distmatch_humaneval"]
    assert config["generation_kwargs"]["temperature"] == 0.6 and config["generation_kwargs"]["top_k"] == 50
    assert config["generation_kwargs"]["top_p"] == 0.9 and config["repeats"] == 3


def _task(metadata: dict[str, Any], name: str = "distmatch_humaneval") -> Any:
    from lm_eval.tasks import TaskManager

    manager = TaskManager(
        include_path=str(REPO_ROOT / "eval_tasks"),
        include_defaults=False,
        metadata=metadata,
    )
    return manager.load([name])["tasks"][name]


def test_lm_eval_refuses_without_confirm_run_unsafe_code(code_env: dict[str, str], monkeypatch) -> None:
    from lm_eval.evaluator import evaluate

    for key, value in code_env.items():
        monkeypatch.setenv(key, value)
    task = _task({"code_samples": 2})
    with pytest.raises(ValueError, match="confirm_run_unsafe_code=True"):
        evaluate(lm=None, task_dict={"distmatch_humaneval": task}, confirm_run_unsafe_code=False)


def test_pass_at_k_of_known_completions_through_the_task(code_env: dict[str, str], monkeypatch) -> None:
    for key, value in code_env.items():
        monkeypatch.setenv(key, value)
    task = _task({"code_samples": 12, "code_workers": 2, "code_timeout": 1})
    assert [m["metric"] for m in task.config.metric_list] == ["pass@1", "pass@10"]
    assert task.config.repeats == 12
    doc = next(iter(task.test_docs()))
    good, bad = doc["canonical_solution"], "    return 'wrong'\n"
    # 1 of 12 correct: pass@1 = 1/12, pass@10 = 1 - C(11,10)/C(12,10) = 1 - 11/66 = 5/6.
    scores = task.process_results(doc, [[good] + [bad] * 11])
    assert scores == pytest.approx({"pass@1": 100 / 12, "pass@10": 100 * 5 / 6})
    assert task.process_results(doc, [[good] * 12]) == pytest.approx({"pass@1": 100.0, "pass@10": 100.0})
    timed_out = ["    while True: pass\n"] + [bad] * 11
    assert task.process_results(doc, [timed_out]) == {"pass@1": 0.0, "pass@10": 0.0}
    assert _task({"protocol": "gem_official"}).config.repeats == 200


def test_chat_prompt_puts_the_response_prefix_in_the_assistant_turn(
    workdir: Path, code_env: dict[str, str], monkeypatch
) -> None:
    from lm_eval.models.huggingface import HFLM

    for key, value in code_env.items():
        monkeypatch.setenv(key, value)
    task = _task({"code_prompt": "chat"}, "distmatch_mbpp_plus")
    lm = HFLM(pretrained=str(workdir / "model"), device="cpu", dtype="float32")
    task.build_all_requests(limit=1, apply_chat_template=True, chat_template=lm.apply_chat_template)
    context = task.instances[0].arguments[0]
    doc = task.instances[0].doc
    user, prefix = prompt_text(doc, "distmatch_mbpp_plus", "chat")
    expected = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )
    assert context == expected + prefix, json.dumps([context, expected + prefix])


def test_completions_that_end_the_interpreter_early_score_zero(code_env: dict[str, str], monkeypatch) -> None:
    """Through the task: every way of ending the interpreter before the checks end (sys.exit(0),
    unittest.main(), os._exit(0), atexit, excepthook, signals, threads, forks, printed markers, SystemExit inside
    the checks) is a failed sample, so pass@k of wrong completions that try them is 0; a correct one still counts."""
    for key, value in code_env.items():
        monkeypatch.setenv(key, value)
    wrong = "    return 'wrong'\n\n"
    completions = [wrong + tail for tail in EARLY_EXITS.values()] + list(IN_CHECK.values())
    task = _task({"code_samples": len(completions), "code_workers": 2, "code_timeout": 5})
    doc = next(iter(task.test_docs()))
    scores = task.process_results(doc, [completions])
    assert set(scores) == {"pass@1", "pass@10"} and set(scores.values()) == {0.0}, scores
    good = task.process_results(doc, [[doc["canonical_solution"]] + completions[1:]])
    assert good["pass@1"] == pytest.approx(100 / len(completions))


def test_a_code_timeout_above_the_maximum_is_refused_when_the_task_is_built(
    code_env: dict[str, str], monkeypatch
) -> None:
    """It used to be accepted, and `execute` raised OverflowError once every sample had been generated."""
    for key, value in code_env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(DistMatchConfigError, match="code_timeout=10000000000 is invalid for the code tasks"):
        _task({"code_timeout": 10_000_000_000})
    assert _task({"code_timeout": MAX_TIMEOUT_S}).resolved["code_timeout"] == MAX_TIMEOUT_S


@pytest.mark.slow
def test_lm_eval_refuses_a_code_timeout_above_the_maximum_before_the_model_loads(
    wheel_python: Path, workdir: Path, env: dict[str, str]
) -> None:
    """`lm_eval run --metadata '{"code_timeout": 10000000000}'`: one error line, exit status 2, before the model."""
    cmd = [str(wheel_python), "-m", "lm_eval", "run", "--model", "hf", "--model_args", _model_args(workdir)]
    cmd += ["--tasks", "distmatch_humaneval", "--device", "cpu", "--confirm_run_unsafe_code"]
    cmd += ["--metadata", json.dumps({"code_timeout": 10_000_000_000})]
    proc = _run(cmd, dict(env, DISTMATCH_EVAL_DATA_DIR=str(FIXTURES)), workdir)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    expected = f"code_timeout=10000000000 is invalid for the code tasks (HumanEval, MBPP+); expected an integer >= 1 and <= {MAX_TIMEOUT_S}"
    assert expected in line, line
    assert "Initializing hf model" not in output  # before the model, so before any sample is generated
