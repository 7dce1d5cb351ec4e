"""The checks before the model or any data loads (`eval_tasks/lm_eval_tasks/preflight.py`): options a task does not
read, a protocol of another task family, missing local data; through the real `lm_eval run` of the installed wheel
(the activation hook) and from Python."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.eval.lm_eval_tasks.helpers import _check, _model_args, _run
from tests.helpers.warm_cli import WarmCli

pytestmark = pytest.mark.slow

# What the lm-eval hook prints under DISTMATCH_DEBUG when lm-eval builds its task index (distmatch_hooks/lm_eval.py).
TASK_INDEX_BUILT = "TaskManager include_path += "


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"tempalte": "emo_code"}, "unknown task option 'tempalte' (did you mean 'template'?)"),
        ({"ice_num": -3}, "ice_num=-3 is invalid for the NLU retrieval tasks; expected an integer >= 0"),
        ({"template": "emo"}, "template='emo' is invalid"),
    ],
)
def test_bad_task_options_refused_before_the_model_loads(
    wheel_python: Path,
    warm_cli: WarmCli,
    workdir: Path,
    env: dict[str, str],
    metadata: dict[str, Any],
    expected: str,
) -> None:
    cmd = [str(wheel_python), "-m", "lm_eval", "run", "--model", "hf", "--model_args", _model_args(workdir)]
    cmd += ["--tasks", "distmatch_sst2", "--device", "cpu", "--metadata", json.dumps(metadata)]
    proc = warm_cli.run_in(cmd, workdir, env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert expected in line and "Valid options: protocol, retriever_model, template" in line, line
    assert "Initializing hf model" not in output  # before the model


def test_options_a_task_does_not_read_table_checks() -> None:
    from distmatch.errors import DistMatchConfigError
    from eval_tasks.lm_eval_tasks.preflight import check_options_apply, preflight

    with pytest.raises(
        DistMatchConfigError,
        match=r"protocol='gem_official' is for the creative writing, code generation, GSM8K / MATH voting and "
        r"AlpacaEval best-of-n tasks",
    ):
        preflight(["distmatch_sst2"], {"protocol": "gem_official"}, [])  # what the hook runs
    check_options_apply(["distmatch_nlu"], {"protocol": "emo_official", "template": "paper", "data_dir": "d"})
    check_options_apply(["distmatch_creative"], {"protocol": "gem_official", "num_samples": 3, "version": 1})
    check_options_apply(["distmatch_nlu", "distmatch_creative"], {"num_samples": 3})  # read by one of them
    check_options_apply(
        ["hellaswag", "distmatch_nope"], {"num_samples": 3}
    )  # not ours / unknown: lm-eval's call
    with pytest.raises(DistMatchConfigError) as err:
        check_options_apply(["distmatch_sst2"], {"protocol": "gem_official", "num_samples": 4})
    message = str(err.value)
    assert (
        "protocol='gem_official' is for the creative writing, code generation, GSM8K / MATH voting and AlpacaEval "
        "best-of-n tasks, not distmatch_sst2" in message
    )
    assert "accepted for distmatch_sst2: default, emo_official" in message
    assert (
        "num_samples=4 is not read by distmatch_sst2 (only by the creative writing, NoveltyBench tasks)"
        in message
    )
    with pytest.raises(
        DistMatchConfigError,
        match=r"not distmatch_creative \(creative writing\); accepted for "
        r"distmatch_nlu, distmatch_creative: default \(run the EMO NLU and the GEM",
    ):
        check_options_apply(["distmatch_nlu", "distmatch_creative"], {"protocol": "emo_official"})
    with pytest.raises(DistMatchConfigError, match=r"data_dir='d' is not read by distmatch_poem_diversity"):
        check_options_apply(["distmatch_poem_diversity"], {"data_dir": "d"})
    with pytest.raises(DistMatchConfigError, match=r"mmlu_average='micro' is not read by distmatch_ifeval"):
        check_options_apply(["distmatch_ifeval"], {"mmlu_average": "micro"})


@pytest.mark.parametrize(
    ("tasks", "metadata", "expected"),
    [
        (
            "distmatch_sst2",
            {"protocol": "gem_official"},
            "protocol='gem_official' is for the creative writing, code generation, GSM8K / MATH voting and AlpacaEval "
            "best-of-n tasks, "
            "not distmatch_sst2 (NLU retrieval tasks); "
            "accepted for distmatch_sst2: default, emo_official",
        ),
        (
            "arc_easy,distmatch_sst2",  # beside a task of lm-eval's own: the distmatch task is still checked
            {"num_samples": 4},
            "num_samples=4 is not read by distmatch_sst2 (only by the creative writing, NoveltyBench tasks), so it would be "
            "ignored; the options these tasks read: protocol, retriever_model, template,",
        ),
        (
            "distmatch_creative",
            {"protocol": "emo_official"},
            "protocol='emo_official' is for the NLU retrieval tasks, MMLU and open-ended generation tasks, not distmatch_creative",
        ),
        ("distmatch_sst2", {"template": "paper"}, None),  # control: valid options, the missing model is found
    ],
    ids=[
        "gem_protocol_on_nlu",
        "num_samples_on_nlu_beside_another_task",
        "emo_protocol_on_creative",
        "control",
    ],
)
def test_options_a_task_does_not_read_refused_before_the_model_loads(
    wheel_python: Path,
    warm_cli: WarmCli,
    workdir: Path,
    env: dict[str, str],
    tmp_path: Path,
    tasks: str,
    metadata: dict[str, Any],
    expected: str | None,
) -> None:
    """The real `lm_eval run` (the activation hook of the installed wheel) with a model folder that does not exist:
    the refusal comes before lm-eval builds its task index (the hook reports building it under DISTMATCH_DEBUG, as
    the control shows) and the model, as one line, exit status 2."""
    env = dict(env, DISTMATCH_DEBUG="1")
    missing_model = tmp_path / "no_such_model"
    cmd = [str(wheel_python), "-m", "lm_eval", "run", "--model", "hf"]
    cmd += ["--model_args", f"pretrained={missing_model},dtype=float32", "--tasks", tasks, "--device", "cpu"]
    cmd += ["--metadata", json.dumps(metadata)]
    # the control loads the model (and fails there): a cold start, as every command beyond a refusal
    proc = _run(cmd, env, workdir) if expected is None else warm_cli.run_in(cmd, workdir, env)
    output = proc.stdout + proc.stderr
    # the same command with valid options gets as far as loading the model, and fails there
    if expected is None:
        assert proc.returncode not in (0, 2) and "Initializing hf model" in output, output[-4000:]
        assert str(missing_model) in output and not any(x.startswith("error: ") for x in output.splitlines())
        assert TASK_INDEX_BUILT in output, output[-4000:]
        return
    # refused before lm-eval parsed its 14,000 task YAMLs
    assert TASK_INDEX_BUILT not in output, output[-4000:]
    assert proc.returncode == 2 and "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    # the last thing printed: nothing ran after it
    assert line == output.strip().splitlines()[-1], output[-4000:]
    assert line.startswith("error: distmatch task metadata: ") and expected in line, line
    assert (
        "Initializing hf model" not in output and str(missing_model) not in output
    )  # the model was not touched


def test_python_api_refusal_is_an_exception(wheel_python: Path, workdir: Path, env: dict[str, str]) -> None:
    """`lm_eval.simple_evaluate` from Python: the same refusal as a `DistMatchConfigError`, not a process exit."""
    script = (
        "import lm_eval; from distmatch.errors import DistMatchConfigError\n"
        "try:\n"
        "    lm_eval.simple_evaluate(model='hf', model_args='pretrained=/no/such/model', tasks=['distmatch_sst2'],"
        " metadata={'num_samples': 4})\n"
        "except DistMatchConfigError as err:\n"
        "    print('raised:', err)\n"
    )
    proc = _check(_run([str(wheel_python), "-c", script], env, workdir))
    assert "raised: distmatch task metadata: num_samples=4 is not read by distmatch_sst2" in proc.stdout, (
        proc.stdout
    )


def test_missing_local_data_listed_all_at_once(
    wheel_python: Path, warm_cli: WarmCli, workdir: Path, env: dict[str, str], tmp_path: Path
) -> None:
    cmd = [str(wheel_python), "-m", "lm_eval", "run", "--model", "hf", "--model_args", _model_args(workdir)]
    cmd += ["--tasks", "distmatch_nlu,distmatch_ifeval", "--device", "cpu"]
    proc = warm_cli.run_in(cmd, workdir, dict(env, DISTMATCH_EVAL_DATA_DIR=str(tmp_path)))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "lacks 17 split(s)" in line and "$DISTMATCH_EVAL_DATA_DIR" in line, line
    for key, split in [("sst2", "train"), ("ag_news", "test"), ("mmlu", "dev"), ("ifeval", "train")]:
        assert f"{tmp_path / key / split}.jsonl" in line, line
    assert "'google/IFEval'" in line and "'cais/mmlu'" in line  # what to download
    assert "Initializing hf model" not in output


@pytest.mark.parametrize(
    ("tasks", "metadata", "extra", "expected"),
    [
        (
            "distmatch_creative",
            {"sbert_model": "/no/such/sbert"},
            [],
            "sbert_model='/no/such/sbert': no such folder",
        ),
        (
            "distmatch_sst2",
            {"retriever_model": "./no_retriever"},
            [],
            "retriever_model='./no_retriever': no such",
        ),
        (
            "distmatch_creative",
            {"sbert_model": "nobody/no-such-sbert"},
            [],
            "is not in the local Hugging Face cache",
        ),
        ("distmatch_humaneval", {}, [], "distmatch_humaneval runs model-generated code"),
    ],
)
def test_missing_models_and_the_code_confirmation_refused_at_preflight(
    wheel_python: Path,
    warm_cli: WarmCli,
    workdir: Path,
    env: dict[str, str],
    tasks: str,
    metadata: dict[str, Any],
    extra: list[str],
    expected: str,
) -> None:
    """Found before lm-eval's task index and the model (they were found only after all generation, or after loading
    the model)."""
    cmd = [str(wheel_python), "-m", "lm_eval", "run", "--model", "hf", "--model_args", _model_args(workdir)]
    cmd += ["--tasks", tasks, "--device", "cpu", "--metadata", json.dumps(metadata), *extra]
    proc = warm_cli.run_in(cmd, workdir, dict(env, HF_HUB_OFFLINE="1", DISTMATCH_DEBUG="1"))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert expected in line, line
    assert "Initializing hf model" not in output and TASK_INDEX_BUILT not in output


def test_an_unreachable_sbert_hub_id_is_refused_before_generation_when_online(
    wheel_python: Path, workdir: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """Without HF_HUB_OFFLINE, an `sbert_model` that is neither a folder nor given by the Hub (here: the Hub
    is a closed loopback port) passed the pre-flight; every sample was generated, then the metric's load failed
    with a traceback and the results were lost. Now it is resolved before the model loads, with one request to the
    Hub (not the Hub client's retries), and refused in one line naming the option, where it came from, the tasks
    that read it and what is accepted. Run cold: the warm interpreter has read the Hub settings at its start."""
    online = {k: v for k, v in env.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    online.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf_home"), DISTMATCH_DEBUG="1")
    out = tmp_path / "out"
    cmd = [str(wheel_python), "-m", "lm_eval", "run", "--model", "hf", "--model_args", _model_args(workdir)]
    cmd += [
        "--tasks",
        "distmatch_poem_diversity",
        "--device",
        "cpu",
        "--limit",
        "1",
        "--output_path",
        str(out),
    ]
    cmd += [
        "--metadata",
        json.dumps({"sbert_model": "models/sbert", "num_samples": 2}),
        "--gen_kwargs",
        "max_gen_toks=4",
    ]
    proc = _run(cmd, online, workdir, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert line.startswith(
        "error: sbert_model='models/sbert' (--metadata; read by distmatch_poem_diversity) cannot be loaded: "
        "the Hugging Face Hub (http://127.0.0.1:9) cannot be reached"
    ), line
    assert "Give an existing model folder or a Hub id (cached, when offline), or leave it unset." in line, (
        line
    )
    assert "Retrying in" not in output  # one request, no retries with back-off
    assert "Initializing hf model" not in output and TASK_INDEX_BUILT not in output
    assert not out.exists()


def test_model_options_and_code_confirmation_table_checks(tmp_path: Path) -> None:
    from distmatch.errors import DistMatchConfigError
    from eval_tasks.lm_eval_tasks.preflight import check_code_confirmation, check_model_options

    offline = {"HF_HUB_OFFLINE": "1"}
    check_model_options(["distmatch_creative"], {"sbert_model": str(tmp_path)}, offline)  # an existing folder
    check_model_options(["distmatch_creative"], {"sbert_model": "paper"}, offline)  # an alias
    check_model_options(["distmatch_sst2"], {"sbert_model": "/no/such"}, offline)  # not read by the task
    # online: a Hub id is resolved now; the Hub here has no such model (or is off: the tests run offline)
    with pytest.raises(
        DistMatchConfigError,
        match=r"sbert_model='nobody/no-such-sbert' \(--metadata; read by distmatch_poem_diversity, "
        r"distmatch_story_diversity\) cannot be loaded: ",
    ):
        check_model_options(["distmatch_creative"], {"sbert_model": "nobody/no-such-sbert"}, {})
    for metadata, environ, expected in [
        ({"sbert_model": str(tmp_path / "none")}, {}, "no such folder"),
        ({"sbert_model": "nobody/no-such-sbert"}, offline, "not in the local Hugging Face cache"),
    ]:
        with pytest.raises(DistMatchConfigError, match=expected):
            check_model_options(["distmatch_creative"], metadata, environ)
    with pytest.raises(DistMatchConfigError, match="retriever_model='./x': no such folder"):
        check_model_options(["distmatch_sst2"], {}, {"DISTMATCH_RETRIEVER_MODEL": "./x"})
    check_code_confirmation(["distmatch_humaneval"], True)
    check_code_confirmation(["distmatch_humaneval"], None)  # an lm-eval without the setting decides itself
    check_code_confirmation(["distmatch_sst2"], False)
    with pytest.raises(DistMatchConfigError, match="--confirm_run_unsafe_code"):
        check_code_confirmation(["distmatch_humaneval"], False)
