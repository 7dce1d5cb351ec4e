"""The open-ended tasks force the generation length, which HF `generate` takes as `min_new_tokens` and vLLM's
`SamplingParams` as `min_tokens` (lm-eval hands a task's generation_kwargs to either unchanged, and each refuses
the other's name): the lm-eval hook reads `--model` and tells the tasks which name to use; a backend distmatch
does not know is refused before the model loads. vLLM itself does not run on these machines (docs/evaluation.md),
so the vLLM side is checked up to the task's generation arguments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from distmatch.errors import DistMatchConfigError  # noqa: E402
from eval_tasks.lm_eval_tasks.preflight import check_generation_backend, generation_backend  # noqa: E402
from eval_tasks.open_ended import open_ended as O  # noqa: E402
from tests.eval.lm_eval_tasks.helpers import _run  # noqa: E402
from tests.helpers.env import REPO_ROOT  # noqa: E402

FIXTURES = REPO_ROOT / "tests" / "eval" / "fixtures" / "open_ended"
ENV = "DISTMATCH_GENERATION_BACKEND"


def test_backend_of_the_model_name_or_object() -> None:
    from lm_eval.models.huggingface import HFLM

    class MyHF(HFLM):  # a user's subclass counts as its base
        pass

    assert [generation_backend(m) for m in ("hf", "hf-auto", "vllm", "local-completions", "sglang")] == [
        "hf",
        "hf",
        "vllm",
        None,
        None,
    ]
    assert generation_backend(object.__new__(MyHF)) == "hf" and generation_backend(object()) is None
    open_ended = ["distmatch_open_ended"]  # the group: its corpora
    assert check_generation_backend(open_ended, {}, "vllm", {}) == {ENV: "vllm"}
    assert check_generation_backend(["distmatch_open_ended_ptb"], {}, "hf", {}) == {ENV: "hf"}
    assert check_generation_backend(["distmatch_sst2"], {}, "local-completions", {}) == {}  # no forced length
    assert (
        check_generation_backend(open_ended, {"generation_backend": "vllm"}, "sglang", {}) == {}
    )  # the user's
    assert check_generation_backend(open_ended, {}, "sglang", {ENV: "hf"}) == {}
    with pytest.raises(
        DistMatchConfigError, match="--model sglang: the open-ended tasks force the generation"
    ):
        check_generation_backend(open_ended, {}, "sglang", {})


@pytest.mark.parametrize(("backend", "name"), [("vllm", "min_tokens"), ("hf", "min_new_tokens")])
def test_the_task_asks_each_backend_by_its_own_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, name: str
) -> None:
    """The real task, built by lm-eval's TaskManager from its YAML on the PTB fixture, as the hook leaves it."""
    from lm_eval.tasks import TaskManager, get_task_dict

    (tmp_path / "ptb").mkdir()
    shutil.copy(FIXTURES / "ptb.test.txt", tmp_path / "ptb" / "test.txt")
    monkeypatch.setenv(ENV, backend)
    manager = TaskManager(  # our tasks only: indexing lm-eval's own thousands takes 15 s
        include_path=str(REPO_ROOT / "eval_tasks"),
        include_defaults=False,
        metadata={"data_dir": str(tmp_path)},
    )
    task = get_task_dict(["distmatch_open_ended_ptb"], manager)["distmatch_open_ended_ptb"]
    kwargs = task.config.generation_kwargs
    other = {"min_tokens", "min_new_tokens"} - {name}
    assert kwargs[name] == O.CORPORA["ptb"].new_tokens == 25 and kwargs["max_gen_toks"] == 26
    assert not other & set(kwargs)


@pytest.mark.slow
def test_an_unknown_backend_is_refused_before_the_model_loads(
    wheel_python: Path, workdir: Path, env: dict[str, str]
) -> None:
    cmd = [str(wheel_python), "-m", "lm_eval", "run", "--model", "local-completions"]
    cmd += [
        "--model_args",
        "model=x,base_url=http://127.0.0.1:9/v1/completions",
        "--tasks",
        "distmatch_open_ended",
    ]
    proc = _run(cmd + ["--metadata", json.dumps({"data_dir": str(workdir)})], env, workdir, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert line.startswith(
        "error: --model local-completions: the open-ended tasks force the generation length"
    )
    assert line == output.strip().splitlines()[-1]  # nothing ran after it


def test_a_bad_backend_value_is_refused_in_one_line() -> None:
    """From --metadata (the pre-flight, before the model loads) and from the environment variable (the resolver)."""
    from eval_tasks.task_options import check_task_options, resolve

    with pytest.raises(
        DistMatchConfigError, match=r"generation_backend='sglang' is invalid.*one of 'hf', 'vllm'"
    ):
        check_task_options({"generation_backend": "sglang"}, None)
    with pytest.raises(DistMatchConfigError, match=r"generation_backend.*'tgi'.*hf.*vllm"):
        resolve("open_ended", {}, environ={ENV: "tgi"})
    assert resolve("open_ended", {}, environ={ENV: "vllm"})["generation_backend"] == "vllm"
