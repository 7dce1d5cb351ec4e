"""The command line: `trl sft --loss ...` through the activation hook, and `distmatch-trl sft ...` without it.

Real processes, no mocks, offline. A wheel is built from the working tree and installed (not editable) into a fresh
venv that sees the running venv's packages through a path line in a `.pth` file. Python does not process `.pth`
files of a directory added that way, so the running venv's editable install (and its finder) stays inactive, while
the wheel's `distmatch_hooks.trl.pth` sits in the new venv's own site-packages and is processed at every start.
`trl sft` then runs as users run it: the `trl` console script parses, and `accelerate launch` starts TRL's
`trl/scripts/sft.py` in a child process, which trains.

Runs in `.venv` (TRL 1.16) and `.venv-axolotl` (TRL 1.9): the `trl_cli` marker (set on tests/trl/cli/) selects this
module in both (see the Makefile). The hook's decision in process: test_trl_hook.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from distmatch_hooks.pth import PTH_FILES
from tests.helpers.cli import WheelVenv, assert_every_rank_ended_cleanly, cli_env, free_port, run_cli, tail
from tests.helpers.tiny_model import build_tiny_llama, write_sft_jsonl

TIMEOUT = 600
N_EXAMPLES = 48  # toy conversations; 4 rows per device and step
HOOK_LINE = re.compile(
    r"distmatch_hooks\.trl\[(\d+)\]: (active in (.+?) \(options: (.*)\)|trl\.SFTConfig -> .*)$"
)


# ---------------------------------------------------------------------------------------------------------------
# A wheel installed into a fresh venv


def test_wheel_ships_the_hook_at_its_root(wheel_venv):
    with zipfile.ZipFile(wheel_venv.wheel) as wheel:
        names = wheel.namelist()
        assert wheel.read("distmatch_hooks.trl.pth").decode() == "import distmatch_hooks.trl\n"
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        assert "distmatch_hooks.trl.pth," in wheel.read(record).decode()  # `pip uninstall` removes it
        entry_points = wheel.read(
            next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        ).decode()
    assert {
        "distmatch_hooks/trl.py",
        "distmatch_hooks/_common.py",
        "trl_ext/cli.py",
        "trl_ext/scripts/distmatch_sft.py",
    } <= set(names)
    assert {name for name in names if name.endswith(".pth")} == set(PTH_FILES)  # at the root; no old names
    assert not [name for name in names if name.endswith("_hook.py")]  # no top-level hook modules any more
    assert "distmatch-trl = trl_ext.cli:main" in entry_points
    assert (
        wheel_venv.site_packages / "distmatch_hooks.trl.pth"
    ).read_text() == "import distmatch_hooks.trl\n"
    assert wheel_venv.distmatch_trl.is_file()


def test_interpreter_start_stays_inert(wheel_venv, tmp_path):
    """Every Python start imports the hook; outside `trl sft` with our options it installs nothing, imports nothing."""
    probe = (
        "import json, sys; print(json.dumps({'hook': 'distmatch_hooks.trl' in sys.modules, "
        "'finder': [f.target for f in sys.meta_path if getattr(f, 'target', None) == 'trl'], "
        "'heavy': [m for m in ('trl', 'trl_ext', 'yaml', 'torch') if m in sys.modules], "
        "'trl_ext': __import__('importlib.util').util.find_spec('trl_ext').origin}))"
    )
    # A stand-in for the `trl` console script (same name, same arguments) that reports instead of training.
    fake = tmp_path / "bin" / "trl"
    fake.parent.mkdir()
    fake.write_text(probe + "\n")
    config = tmp_path / "c.yaml"
    config.write_text("loss: emo\n")

    def start(*args: str, **env: str) -> dict:
        out = subprocess.run(
            [str(wheel_venv.python), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=cli_env(tmp_path, **env),
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    plain = start("-c", probe)
    assert plain["hook"] and not plain["finder"] and not plain["heavy"]
    assert plain["trl_ext"].startswith(str(wheel_venv.site_packages))  # the wheel, not the editable checkout
    assert start(str(fake), "sft", "--loss", "emo")["finder"] == ["trl"]
    with_config = start(str(fake), "sft", "--config", str(config))
    assert with_config["finder"] == ["trl"] and "trl" not in with_config["heavy"]
    assert not start(str(fake), "sft", "--model_name_or_path", "m")["finder"]
    assert not start(str(fake), "dpo", "--loss", "emo")["finder"]
    assert not start(str(fake), "sft", "--loss", "emo", DISTMATCH_TRL_HOOK="0")["finder"]
    assert not start(str(fake), "sft", "--config", str(tmp_path / "missing.yaml"))["finder"]

    timing = subprocess.run(
        [str(wheel_venv.python), "-X", "importtime", "-c", "pass"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        timeout=60,
    )
    # The package (with the mechanism the hooks share) is imported first, then the TRL hook: one line each.
    lines = {
        name: [line for line in timing.stderr.splitlines() if re.search(rf"\|\s+{re.escape(name)}$", line)]
        for name in ("distmatch_hooks", "distmatch_hooks.trl")
    }
    assert all(len(found) == 1 for found in lines.values()), lines
    cumulative = sum(int(found[0].split("|")[1]) for found in lines.values())
    assert cumulative < 50_000, lines  # cumulative microseconds (about 1 ms in practice)


# ---------------------------------------------------------------------------------------------------------------
# Real `trl sft` / `distmatch-trl sft` runs (each about 20-40 s on 2 CPUs, mostly imports)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tiny")
    data = base / "data"
    data.mkdir()
    # `--dataset_name <dir>`: datasets' json loader, split "train"
    write_sft_jsonl(data / "train.jsonl", n=N_EXAMPLES)
    return {"model": build_tiny_llama(base / "model"), "data": data}


def _train_args(tiny: dict[str, Path], output_dir: Path) -> list[str]:
    return [
        "--model_name_or_path",
        str(tiny["model"]),
        "--dataset_name",
        str(tiny["data"]),
        "--output_dir",
        str(output_dir),
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--max_length",
        "64",
        "--logging_steps",
        "1",
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
        "--save_only_model",
        "--report_to",
        "none",
        "--use_cpu",
        "--seed",
        "0",
        "--disable_tqdm",
        "true",
    ]


def _hook_events(stderr: str) -> list[tuple[int, str]]:
    """(pid, event) for each hook debug line: "active <argv0>" or "patched"."""
    events = []
    for line in stderr.splitlines():
        match = HOOK_LINE.search(line)
        if match:
            events.append((int(match[1]), f"active {match[3]}" if match[3] else "patched"))
    return events


def _trained(output_dir: Path) -> tuple[list[dict], object]:
    """The step logs (trainer_state.json of the checkpoint) and the training arguments the trainer was given."""
    import torch

    (state,) = output_dir.glob("checkpoint-*/trainer_state.json")
    logs = [entry for entry in json.loads(state.read_text())["log_history"] if "loss" in entry]
    assert len(logs) == 2
    args = torch.load(output_dir / "training_args.bin", weights_only=False)
    return logs, args


def _assert_hook_in_parent_and_child(stderr: str, wheel_venv: WheelVenv) -> None:
    """Activated and patched in the `trl` process and, separately, in TRL's sft.py under accelerate launch."""
    events = _hook_events(stderr)
    parents = {pid for pid, event in events if event == f"active {wheel_venv.trl}"}
    children = {
        pid for pid, event in events if event.startswith("active ") and event.endswith("/trl/scripts/sft.py")
    }
    patched = {pid for pid, event in events if event == "patched"}
    assert len(parents) == 1 and len(children) == 1 and parents != children, events
    assert parents | children == patched, events


@pytest.mark.slow
def test_trl_sft_loss_flags_through_the_hook(wheel_venv, warm_cli, tiny, tmp_path):
    out = warm_cli.run(
        [
            wheel_venv.trl,
            "sft",
            "--loss",
            "gem_ls",
            "--gem_beta",
            "0.8",
            "--loss_grad_weight_accum",
            "weight",
            "--loss_chunk_memory_mb",
            "0.5",
            *_train_args(tiny, tmp_path / "out"),
        ],
        tmp_path,
    )
    assert out.returncode == 0, tail(out)
    _assert_hook_in_parent_and_child(out.stderr, wheel_venv)  # the child is where training happens
    logs, args = _trained(tmp_path / "out")
    assert type(args).__name__ == "DistMatchSFTConfig"
    assert (args.loss, args.gem_beta) == ("gem_ls", 0.8)
    # the paths' settings: in the run record and the model card, beside the loss's options
    record = json.loads((tmp_path / "out" / "distmatch.json").read_text())
    assert (record["options"]["loss_grad_weight_accum"], record["options"]["loss_chunk_memory_mb"]) == (
        "weight",
        0.5,
    )
    assert record["options"]["loss_kernels"] == "auto"  # unset: the default, recorded too
    card = (tmp_path / "out" / "README.md").read_text()
    assert (
        '| `loss_grad_weight_accum` | `"weight"` |' in card and "| `loss_chunk_memory_mb` | `0.5` |" in card
    )
    for entry in logs:  # our trainer's metrics; the objective is GEM's, not CE
        assert {"ce", "entropy", "mean_token_accuracy", "num_tokens"} <= entry.keys() and "demd" not in entry
        assert abs(entry["loss"] - entry["ce"]) > 1.0, entry


@pytest.mark.slow
def test_trl_sft_two_processes_through_the_hook(wheel_venv, tiny, tmp_path):
    """`accelerate launch` with 2 processes (torchrun, gloo): the hook activates in each rank."""
    launch = ["--multi_gpu", "--num_processes", "2", "--main_process_port", str(free_port())]
    command = [wheel_venv.trl, "sft", *launch, "--loss", "gem_linear", *_train_args(tiny, tmp_path / "out")]
    out = run_cli(command, tmp_path, timeout=300)
    assert_every_rank_ended_cleanly(out, 2)
    events = _hook_events(out.stderr)
    parents = {pid for pid, event in events if event == f"active {wheel_venv.trl}"}
    ranks = {
        pid for pid, event in events if event.startswith("active ") and event.endswith("/trl/scripts/sft.py")
    }
    assert len(parents) == 1 and len(ranks) == 2 and not parents & ranks, events
    assert {pid for pid, event in events if event == "patched"} == parents | ranks, events
    logs, args = _trained(tmp_path / "out")
    assert args.loss == "gem_linear"
    assert logs[-1]["epoch"] == pytest.approx(2 * 2 * 4 / N_EXAMPLES)  # 2 steps of 2 ranks x 4 rows each
    assert all("ce" in entry and "demd" not in entry for entry in logs)


@pytest.mark.slow
def test_trl_sft_config_yaml_through_the_hook(wheel_venv, warm_cli, tiny, tmp_path):
    yaml = "loss: emo\nemo_cost_embedding: live\nlearning_rate: 1.0e-4\nloss_kernels: torch\n"
    (tmp_path / "emo.yaml").write_text(yaml)
    out = warm_cli.run(
        [wheel_venv.trl, "sft", "--config", "emo.yaml", *_train_args(tiny, tmp_path / "out")],
        tmp_path,
        DISTMATCH_CHUNK_MEMORY_MB="0.25",  # the fallback of a setting the YAML leaves unset
    )
    assert out.returncode == 0, tail(out)
    _assert_hook_in_parent_and_child(out.stderr, wheel_venv)
    logs, args = _trained(tmp_path / "out")
    assert (type(args).__name__, args.loss, args.emo_cost_embedding, args.learning_rate) == (
        "DistMatchSFTConfig",
        "emo",
        "live",
        1e-4,
    )
    assert (args.loss_kernels, args.loss_chunk_memory_mb) == ("torch", 0.25)
    options = json.loads((tmp_path / "out" / "distmatch.json").read_text())["options"]
    assert (options["loss_kernels"], options["loss_chunk_memory_mb"]) == ("torch", 0.25)
    for entry in logs:  # EMO's DEMD term is logged; with `emo1` the objective's value equals CE
        assert {"ce", "demd"} <= entry.keys()
        assert entry["loss"] == pytest.approx(entry["ce"], rel=1e-4)


@pytest.mark.parametrize("where", ["flag", "yaml"])
def test_trl_sft_unknown_loss_lists_the_choices(wheel_venv, warm_cli, tiny, tmp_path, where):
    from trl_ext.config import LOSS_CHOICES

    (tmp_path / "bad.yaml").write_text("loss: bogus\n")
    bad = ["--loss", "bogus"] if where == "flag" else ["--config", "bad.yaml"]
    out = warm_cli.run([wheel_venv.trl, "sft", *bad, *_train_args(tiny, tmp_path / "out")], tmp_path)
    assert out.returncode != 0
    message = (
        "argument --loss: invalid choice: 'bogus'" if where == "flag" else "loss='bogus' is not a known loss"
    )
    assert message in out.stderr, tail(out)
    error = out.stderr[out.stderr.index(message) :].splitlines()[0]
    assert all(name in error for name in LOSS_CHOICES), error
    assert not (tmp_path / "out").exists()  # refused before anything started


@pytest.mark.slow
def test_plain_trl_sft_is_unchanged(wheel_venv, warm_cli, tiny, tmp_path):
    out = warm_cli.run([wheel_venv.trl, "sft", *_train_args(tiny, tmp_path / "out")], tmp_path)
    assert out.returncode == 0, tail(out)
    assert _hook_events(out.stderr) == []  # inert in the parent and in the child
    logs, args = _trained(tmp_path / "out")
    assert type(args).__module__.startswith("trl.") and type(args).__name__ == "SFTConfig"
    assert all("ce" not in entry and "demd" not in entry for entry in logs)  # TRL's own trainer and metrics


def test_hook_switched_off_fails_like_upstream_trl(wheel_venv, warm_cli, tiny, tmp_path):
    out = warm_cli.run(
        [wheel_venv.trl, "sft", "--loss", "emo", *_train_args(tiny, tmp_path / "out")],
        tmp_path,
        DISTMATCH_TRL_HOOK="0",
    )
    assert out.returncode != 0
    assert "trl sft: error: ambiguous option: --loss could match --loss_type" in out.stderr, tail(out)
    assert _hook_events(out.stderr) == []


@pytest.mark.slow
def test_help_lists_the_options_unless_the_hook_is_off(wheel_venv, warm_cli, tmp_path):
    """docs/trl.md: `trl sft --help` activates the hook, so the help lists the distmatch options; switched off
    (`DISTMATCH_TRL_HOOK=0`) it is TRL's own help; `distmatch-trl sft --help` lists them without the hook."""

    def help_text(*command: Path | str, **env: str) -> str:
        out = warm_cli.run([*command, "--help"], tmp_path, **env)
        assert out.returncode == 0, tail(out)
        return out.stdout

    ours = ("--gem_beta", "--emo_cost_embedding", "--emo_weighting", "--tailr_gamma")
    active = help_text(wheel_venv.trl, "sft")
    assert all(flag in active for flag in ours)
    plain = help_text(wheel_venv.trl, "sft", DISTMATCH_TRL_HOOK="0")
    assert "--loss_type" in plain and not any(flag in plain for flag in ours)
    explicit = help_text(wheel_venv.distmatch_trl, "sft", DISTMATCH_TRL_HOOK="0")
    assert all(flag in explicit for flag in ours)


def test_hook_stops_when_distmatch_fails_to_import(wheel_venv, tiny, tmp_path):
    """docs/trl.md: if distmatch cannot be imported when it is needed, the run stops with one line saying so (never TRL
    training its own loss instead). Here a `trl_ext` earlier on the path fails to import."""
    shadow = tmp_path / "shadow" / "trl_ext"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('trl_ext broken for this test')\n")
    out = run_cli(
        [wheel_venv.trl, "sft", "--loss", "emo", *_train_args(tiny, tmp_path / "out")],
        tmp_path,
        PYTHONPATH=str(tmp_path / "shadow"),
    )
    assert out.returncode != 0
    assert (
        "error: --loss asks for a distmatch loss, but the distmatch TRL integration failed to import "
        "(ImportError: trl_ext broken for this test)" in out.stderr
    ), tail(out)
    assert "Traceback" not in out.stderr, tail(out)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_distmatch_trl_without_the_hook(wheel_venv, warm_cli, tiny, tmp_path):
    """The explicit console script: YAML defaults, flags override them, unknown keys go to `accelerate launch`."""
    (tmp_path / "cfg.yaml").write_text("loss: gem_linear\nemo_weighting: emo2\nnum_processes: 1\n")
    command = [
        wheel_venv.distmatch_trl,
        "sft",
        "--config",
        "cfg.yaml",
        "--loss",
        "emo",
        "--emo_cost_embedding",
        "live",
    ]
    out = warm_cli.run([*command, *_train_args(tiny, tmp_path / "out")], tmp_path, DISTMATCH_TRL_HOOK="0")
    assert out.returncode == 0, tail(out)
    assert _hook_events(out.stderr) == []
    assert "`--num_processes` was set to a value of" not in out.stderr  # the YAML key reached accelerate
    logs, args = _trained(tmp_path / "out")
    assert (type(args).__name__, args.loss, args.emo_cost_embedding, args.emo_weighting) == (
        "DistMatchSFTConfig",
        "emo",
        "live",
        "emo2",
    )
    assert all({"ce", "demd"} <= entry.keys() for entry in logs)


# ---------------------------------------------------------------------------------------------------------------
# Settings that would train something else than asked: refused before the model loads, in one line


def _one_line_error(out: subprocess.CompletedProcess) -> str:
    """The single `error: ...` line of a refused run (no traceback around it)."""
    assert out.returncode != 0, tail(out)
    assert "Traceback" not in out.stderr, tail(out)
    errors = [line for line in out.stderr.splitlines() if "error: " in line]
    assert len(errors) == 1, tail(out)
    return errors[0]


REFUSED = {
    "option_without_loss": (["--gem_beta", "0.5"], ["gem_beta=0.5", "`loss` is unset", "`loss: gem_ls`"]),
    "option_of_another_loss": (["--loss", "emo", "--tailr_gamma", "0.3"], ["tailr_gamma=0.3", "loss='emo'"]),
    "loss_and_loss_type": (
        ["--loss", "gem_ls", "--loss_type", "dft"],
        ["loss='gem_ls'", "loss_type='dft'", "`loss: dft` selects distmatch's own 'dft'"],
    ),
    "liger": (["--use_liger_kernel", "true", "--loss", "emo"], ["use_liger_kernel=True", "remove"]),
    "cost_embedding_path": (
        ["--loss", "emo", "--emo_cost_embedding", "/nonexistent/model"],
        ["emo_cost_embedding='/nonexistent/model'", "no such folder"],
    ),
    "bad_beta": (["--loss", "gem_ls", "--gem_beta", "0"], ["gem_beta=0.0 is invalid"]),
    "reference_without_anchored_loss": (
        ["--loss", "dft", "--anchor_reference", "/nonexistent/model"],
        ["anchor_reference='/nonexistent/model' has no effect with loss='dft'", "`loss: asft`"],
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_trl_sft_refuses_settings_that_would_train_something_else(wheel_venv, warm_cli, tiny, tmp_path, case):
    flags, expected = REFUSED[case]
    out = warm_cli.run([wheel_venv.trl, "sft", *flags, *_train_args(tiny, tmp_path / "out")], tmp_path)
    line = _one_line_error(out)
    assert all(part in line for part in expected), line
    assert "Loading" not in out.stderr and not (tmp_path / "out").exists()  # before the model or any output


#: The memory-efficient paths' settings a run cannot use (issue: they were checked only at the first step, after the
#: model and data loaded, and refused with two tracebacks): (environment, flags, YAML, the error line's start).
PATH_REFUSED = {
    "env_memory_not_a_number": (
        {"DISTMATCH_CHUNK_MEMORY_MB": "abc"},
        [],
        "",
        "error: DISTMATCH_CHUNK_MEMORY_MB='abc' is invalid; expected a number of MiB above 0",
    ),
    "env_memory_nan": (
        {"DISTMATCH_CHUNK_MEMORY_MB": "nan"},
        [],
        "",
        "error: DISTMATCH_CHUNK_MEMORY_MB='nan' is invalid",
    ),
    "env_accum_padded": (
        {"DISTMATCH_GRAD_WEIGHT_ACCUM": " Weight "},
        [],
        "",
        "error: DISTMATCH_GRAD_WEIGHT_ACCUM=' Weight ' is invalid; expected one of 'float32', 'weight', 'tiles'",
    ),
    "env_tiles_on_cpu": (
        {"DISTMATCH_GRAD_WEIGHT_ACCUM": "tiles"},
        [],
        "",
        "error: loss='gem_ls': loss_grad_weight_accum='tiles' needs the Triton row kernel, which would not run here",
    ),
    "env_triton_on_cpu": (
        {"DISTMATCH_KERNELS": "triton"},
        [],
        "",
        "error: loss='gem_ls': loss_kernels='triton' cannot run here (this run has no CUDA device",
    ),
    "flag_input_logits_on_cpu": (
        {},
        ["--loss_chunk_logits", "input"],
        "",
        "error: loss='gem_ls': loss_chunk_logits='input' needs the Triton row kernel",
    ),
    "flag_memory_zero": (
        {},
        ["--loss_chunk_memory_mb", "0"],
        "",
        "error: loss_chunk_memory_mb=0.0 is invalid",
    ),
    "yaml_tiles_on_cpu": (
        {},
        [],
        "loss_grad_weight_accum: tiles\n",
        "error: loss='gem_ls': loss_grad_weight_accum=",
    ),
}


@pytest.mark.parametrize("case", list(PATH_REFUSED))
def test_trl_sft_refuses_a_path_setting_before_the_model_loads(wheel_venv, warm_cli, tiny, tmp_path, case):
    env, flags, yaml, expected = PATH_REFUSED[case]
    if yaml:
        (tmp_path / "c.yaml").write_text(yaml)
        flags = [*flags, "--config", "c.yaml"]
    command = [wheel_venv.trl, "sft", "--loss", "gem_ls", *flags, *_train_args(tiny, tmp_path / "out")]
    out = warm_cli.run(command, tmp_path, **env)
    assert out.returncode == 2, tail(out)
    assert _one_line_error(out).startswith(expected), tail(out)
    assert "Loading" not in out.stderr and not (tmp_path / "out").exists()  # before the model or any output


def test_trl_sft_yaml_loss_with_another_loss_type_is_refused(wheel_venv, warm_cli, tiny, tmp_path):
    (tmp_path / "c.yaml").write_text("loss: gem_ls\nloss_type: dft\n")
    out = warm_cli.run(
        [wheel_venv.trl, "sft", "--config", "c.yaml", *_train_args(tiny, tmp_path / "out")], tmp_path
    )
    assert "loss_type='dft'" in _one_line_error(out)


def _broken_cost_model(folder: Path, fault: str) -> Path:
    """A copy of a saved model whose files are damaged the way downloads and disks damage them."""
    build_tiny_llama(folder)
    weights = folder / "model.safetensors"
    if fault == "truncated":  # an interrupted download: the header promises more bytes than the file has
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif fault == "corrupt_header":
        data = bytearray(weights.read_bytes())
        data[8:24] = b"\x00" * 16  # the JSON header starts with zero bytes
        weights.write_bytes(bytes(data))
    elif fault == "missing_shard":  # a sharded checkpoint of which one shard was not downloaded
        weights.rename(folder / "model-00001-of-00002.safetensors")
        from safetensors import safe_open

        with safe_open(folder / "model-00001-of-00002.safetensors", framework="pt") as reader:
            names = list(reader.keys())
        weight_map = {name: "model-00001-of-00002.safetensors" for name in names}
        weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    elif fault == "config_not_json":
        (folder / "config.json").write_text('{"vocab_size": 256,')
    return folder


COST_FAULTS = {
    "truncated": "model.safetensors is truncated",
    "corrupt_header": "model.safetensors has no readable safetensors header",
    "missing_shard": "model-00002-of-00002.safetensors is missing",
    "config_not_json": "config.json is not a readable JSON model config",
}


@pytest.mark.parametrize("fault", list(COST_FAULTS))
def test_damaged_cost_embedding_files_are_refused_before_loading(wheel_venv, warm_cli, tiny, tmp_path, fault):
    """EMO's cost model is checked down to the header of the tensor it reads: one line naming the setting and the
    damaged file, exit 2, before the training model is loaded or anything is written."""
    other = _broken_cost_model(tmp_path / "cost", fault)
    flags = ["sft", "--loss", "emo", "--emo_cost_embedding", str(other)]
    out = warm_cli.run([wheel_venv.trl, *flags, *_train_args(tiny, tmp_path / "out")], tmp_path)
    line = _one_line_error(out)
    assert out.returncode == 2, tail(out)
    assert line.startswith(f"error: emo_cost_embedding={str(other)!r}") and COST_FAULTS[fault] in line, line
    assert "Loading" not in out.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["trl", "distmatch-trl"])
def test_cost_embedding_with_another_vocabulary_is_refused_while_parsing(
    wheel_venv, warm_cli, tiny, tmp_path, command
):
    """Found from the two config.json files right after parsing, before anything is launched or loaded."""
    other = build_tiny_llama(tmp_path / "other", vocab_size=280)
    program = wheel_venv.trl if command == "trl" else wheel_venv.distmatch_trl
    flags = ["sft", "--loss", "emo", "--emo_cost_embedding", str(other)]
    out = warm_cli.run([program, *flags, *_train_args(tiny, tmp_path / "out")], tmp_path)
    line = _one_line_error(out)
    prefix = "error: " if command == "trl" else "distmatch-trl: error: "
    assert line.startswith(prefix + f"emo_cost_embedding={str(other)!r}") and "vocabulary of 280" in line, (
        line
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_trl_sft_asft_with_another_checkpoint_as_the_reference(wheel_venv, warm_cli, tiny, tmp_path):
    """`--anchor_reference <folder>`: that checkpoint anchors the KL, so it is far from 0 from the first step (the
    starting model as the reference gives 0 there: tests/trl/test_anchored.py)."""
    other = build_tiny_llama(tmp_path / "other", seed=1)
    flags = ["sft", "--loss", "asft", "--anchor_reference", str(other), "--anchor_kl_weight", "0.5"]
    out = warm_cli.run([wheel_venv.trl, *flags, *_train_args(tiny, tmp_path / "out")], tmp_path)
    assert out.returncode == 0, tail(out)
    logs, args = _trained(tmp_path / "out")
    assert (args.loss, args.anchor_reference, args.anchor_kl_weight) == ("asft", str(other), 0.5)
    assert all(entry["kl"] > 1e-4 for entry in logs), logs


def test_reference_with_another_vocabulary_is_refused_while_parsing(wheel_venv, warm_cli, tiny, tmp_path):
    other = build_tiny_llama(tmp_path / "other", vocab_size=280)
    flags = ["sft", "--loss", "sft_kl", "--anchor_reference", str(other)]
    out = warm_cli.run([wheel_venv.trl, *flags, *_train_args(tiny, tmp_path / "out")], tmp_path)
    line = _one_line_error(out)
    assert line.startswith(f"error: anchor_reference={str(other)!r}") and "vocabulary of 280" in line, line
    assert "Loading" not in out.stderr and not (tmp_path / "out").exists()
