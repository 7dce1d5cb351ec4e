"""`loss:` without `plugins:` (`distmatch_hooks/axolotl.py`): the activation hook adds the plugin, in a venv set up
like the project's, through the real `axolotl train` CLI: the refusals here; the run it trains is tests/axolotl/
test_resume.py's (`loss: emo` without `plugins:`, then the resumes), checked there.

Runs in `.venv-axolotl` (Axolotl 0.19) and `.venv-axolotl-latest` (Axolotl 0.21) (`make test`: `axolotl_env`, set on
tests/axolotl/ by tests/conftest.py); skipped where Axolotl is not installed. Shared parts: tests/helpers/axolotl_cases.py.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # axolotl_env: tests/placement.py

axolotl = pytest.importorskip("axolotl")

import yaml  # noqa: E402

from tests.helpers.axolotl_cases import (  # noqa: E402
    PLUGIN,
    tiny_config,
)
from tests.helpers.env import REPO_ROOT  # noqa: E402
from tests.helpers.warm_cli import PRELOAD, WarmCli  # noqa: E402

# ---------------------------------------------------------------------------------------------------------
# `loss:` without `plugins:`: the activation hook adds the plugin (a venv set up like the project's, real CLI)


def test_hook_adds_the_plugin_only_for_distmatch_keys() -> None:
    import distmatch_hooks.axolotl as hook
    from trl_ext.options import LOSS_OPTIONS

    # kept in sync (the hook imports no torch)
    assert set(hook.OPTION_NAMES) == {o.name for o in LOSS_OPTIONS}
    plain = {"base_model": "m", "plugins": ["x.Y"]}
    assert hook.add_plugin(plain) == [] and plain["plugins"] == ["x.Y"]
    assert hook.add_plugin({"loss": None}) == []
    cfg = {"base_model": "m", "loss": "gem_ls", "gem_beta": 0.5}
    assert hook.add_plugin(cfg) == ["loss", "gem_beta"] and cfg["plugins"] == [PLUGIN]
    listed = {"gem_beta": 0.5, "plugins": ["axolotl_distmatch:DistMatchPlugin"]}
    hook.add_plugin(listed)
    assert listed["plugins"] == ["axolotl_distmatch:DistMatchPlugin"]  # already there, other spelling


def test_hook_adds_the_plugin_for_a_resume_from_a_distmatch_checkpoint(tmp_path) -> None:
    """No distmatch key, but the checkpoint resumed from holds a run record: the plugin must come, to continue (or
    check) the recorded loss (tests/axolotl/test_resume.py runs it); a checkpoint without the record changes nothing."""
    import distmatch_hooks.axolotl as hook

    out = tmp_path / "out"
    for step in (2, 10):
        (out / f"checkpoint-{step}").mkdir(parents=True)
    (out / "checkpoint-10" / "distmatch.json").write_text("{}")
    recorded = str(out / "checkpoint-10")
    reason = f"resume_from_checkpoint ({recorded}/distmatch.json)"
    explicit = {"base_model": "m", "resume_from_checkpoint": recorded}
    assert hook.add_plugin(explicit) == [reason] and explicit["plugins"] == [PLUGIN]
    auto = {"base_model": "m", "output_dir": str(out), "auto_resume_from_checkpoints": True}
    assert hook.add_plugin(auto) == [reason]  # the last checkpoint, as Axolotl picks it
    plain = {"base_model": "m", "resume_from_checkpoint": str(out / "checkpoint-2")}
    assert hook.add_plugin(plain) == [] and "plugins" not in plain
    assert hook.add_plugin({"allow_loss_change": True}) == ["allow_loss_change"]
    # a new plain run into a distmatch run's folder: the plugin comes to refuse it (a record in any checkpoint)
    new_run = {"base_model": "m", "output_dir": str(out)}
    assert hook.add_plugin(new_run) == [f"output_dir (holds a distmatch run: {recorded}/distmatch.json)"]
    assert hook.add_plugin({"base_model": "m", "output_dir": str(tmp_path / "elsewhere")}) == []


def test_the_axolotl_hook_sees_a_distmatch_run_in_the_default_output_folder(tmp_path, monkeypatch):
    """Axolotl writes to ./model-out when `output_dir` is unset: a plain run there is caught like any other."""
    import distmatch_hooks.axolotl as hook

    monkeypatch.chdir(tmp_path)
    (tmp_path / "model-out" / "checkpoint-3").mkdir(parents=True)
    (tmp_path / "model-out" / "checkpoint-3" / "distmatch.json").write_text('{"loss": "emo"}')
    cfg = {"base_model": "m"}
    assert hook.add_plugin(cfg) == [
        "output_dir (holds a distmatch run: ./model-out/checkpoint-3/distmatch.json)"
    ]


def test_a_plain_axolotl_run_into_a_distmatch_runs_folder_is_refused(
    assets, project_venv, warm_axolotl, tmp_path
) -> None:
    """No distmatch key at all: Axolotl's own loss would overwrite the checkpoints while their records still name
    gem_ls; refused in one line before the model loads, the old run untouched."""
    out = tmp_path / "out"
    (out / "checkpoint-1").mkdir(parents=True)
    (out / "checkpoint-1" / "distmatch.json").write_text('{"loss": "gem_ls"}')
    cfg = tiny_config(assets, out)
    for key in ("plugins", "loss"):
        cfg.pop(key, None)
    line = _one_line_error(_axolotl_train(project_venv, cfg, tmp_path, warm_axolotl))
    assert line.startswith(f"error: output_dir={str(out)!r} holds another run (loss=gem_ls"), line
    assert "overwrite_run" in line, line
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-1"]


@pytest.fixture(scope="module")
def project_venv(tmp_path_factory):
    from tests.helpers.project_venv import make_project_like_venv

    return make_project_like_venv(tmp_path_factory.mktemp("project_venv"), REPO_ROOT)


@pytest.fixture(scope="module")
def warm_axolotl(project_venv, tmp_path_factory) -> Iterator[WarmCli]:
    """The refusals' `axolotl train`, forked from a warm interpreter of the venv (tests/helpers/warm_cli.py)."""
    cli = WarmCli(
        project_venv.bin / "python", tmp_path_factory.mktemp("warm_axolotl"), PRELOAD + ("trl",), ("axolotl",)
    )
    yield cli
    cli.close()


def _axolotl_train(
    venv, cfg: dict[str, Any], tmp_path: Path, warm: WarmCli | None = None, **env: str
) -> subprocess.CompletedProcess:
    config_path = tmp_path / "cfg.yml"
    config_path.write_text(yaml.safe_dump(cfg))
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DISTMATCH_", "PYTHON"))}
    environment.update(env, PATH=f"{venv.bin}:{os.environ.get('PATH', '')}")
    command = [str(venv.bin / "axolotl"), "train", str(config_path), "--launcher", "python"]
    if warm is not None:
        return warm.run_in(command, tmp_path, environment, timeout=600)
    return subprocess.run(command, capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=600)


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    return line


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"loss": "gem_ls", "gem_beta": 0}, "error: Loss 'gem_ls': gem_beta=0 is invalid"),
        ({"loss": None, "gem_beta": 0.5}, "error: gem_beta=0.5 is set but `loss` is unset"),
        ({"loss": "gem_lsx"}, "error: loss='gem_lsx' is not a distmatch loss"),
        ({"loss": "gem_ls", "gem_betta": 0.5}, "error: gem_betta: 0.5 is not a config key"),
        ({"loss": None, "loss_type": "gem_ls"}, "error: loss_type: gem_ls does not select a distmatch loss"),
    ],
)
def test_axolotl_train_refuses_in_one_line(
    assets, project_venv, warm_axolotl, tmp_path, overrides, expected
) -> None:
    cfg = tiny_config(assets, tmp_path / "out", **overrides)
    cfg.pop("plugins")
    line = _one_line_error(_axolotl_train(project_venv, cfg, tmp_path, warm_axolotl))
    assert line.startswith(expected), line
    if overrides.get("loss") == "gem_ls":
        assert "gem_linear" not in line  # the user's loss is named, not another loss using the option
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("env", "overrides", "expected"),
    [
        (
            {"DISTMATCH_CHUNK_MEMORY_MB": "abc"},
            {},
            "error: DISTMATCH_CHUNK_MEMORY_MB='abc' is invalid; expected a",
        ),
        (
            {"DISTMATCH_GRAD_WEIGHT_ACCUM": "tiles"},
            {},
            "error: loss='gem_ls': loss_grad_weight_accum='tiles' needs",
        ),
        ({}, {"loss_kernels": "triton"}, "error: loss='gem_ls': loss_kernels='triton' cannot run here"),
    ],
    ids=["env_not_a_number", "env_tiles_on_cpu", "yaml_triton_on_cpu"],
)
def test_axolotl_train_refuses_a_path_setting_before_the_model_loads(
    assets, project_venv, warm_axolotl, tmp_path, env, overrides, expected
) -> None:
    """The memory-efficient paths' settings, from the environment or the YAML, are checked with the other options
    (they were checked at the first training step, after about 310 lines of loading and two tracebacks)."""
    cfg = tiny_config(assets, tmp_path / "out", loss="gem_ls", **overrides)
    cfg.pop("plugins")
    line = _one_line_error(_axolotl_train(project_venv, cfg, tmp_path, warm_axolotl, **env))
    assert line.startswith(expected), line
    assert not (tmp_path / "out").exists()


def test_axolotl_train_stops_when_the_plugin_fails_to_import(assets, project_venv, tmp_path) -> None:
    """A plugin that cannot be imported is an error, never a skipped plugin (the fault: a broken plugin module
    earlier on the path)."""
    broken = tmp_path / "broken" / "axolotl_distmatch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "plugin.py").write_text("raise ImportError('simulated broken install')\n")
    cfg = tiny_config(assets, tmp_path / "out")
    cfg.pop("plugins")
    line = _one_line_error(_axolotl_train(project_venv, cfg, tmp_path, PYTHONPATH=str(broken.parent)))
    assert "failed to import" in line and "simulated broken install" in line and "loss" in line, line
    assert not (tmp_path / "out").exists()
