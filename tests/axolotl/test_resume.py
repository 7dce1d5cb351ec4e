"""Resuming an Axolotl run (`axolotl_distmatch/plugin.py` `continue_recorded_loss`, the activation hook, the trainer's
run record: `trl_ext/resume.py`): every checkpoint records the loss, a resume without `loss:` continues with it, one
with another loss is refused in one line unless `allow_loss_change: true`.

Real `axolotl train ... --launcher python` runs on the tiny model, in a venv set up like the project's (the hooks
installed, no `plugins:` line in the configs): one EMO step saved as checkpoint-1, then the resumes. Runs in
`.venv-axolotl` (Axolotl 0.19) and `.venv-axolotl-latest` (Axolotl 0.21) (`axolotl_env`, set on tests/axolotl/).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # axolotl_env: tests/placement.py

axolotl = pytest.importorskip("axolotl")

import yaml  # noqa: E402
from axolotl.integrations.base import PluginManager  # noqa: E402

import distmatch  # noqa: E402
from tests.helpers.axolotl_cases import PLUGIN, printed_logs, tiny_config, validate  # noqa: E402
from tests.helpers.env import REPO_ROOT  # noqa: E402
from tests.helpers.model_card import read_card  # noqa: E402
from trl_ext.checks import DistMatchConfigError  # noqa: E402
from trl_ext.options import OPTION_DEFAULTS  # noqa: E402
from trl_ext.resume import used_options  # noqa: E402

ADOPTED = "without a loss: training continues with the recorded loss=emo"


def _config(assets: dict[str, Path], out: Path, **overrides: Any) -> dict[str, Any]:
    settings = {"loss": None, "max_steps": 2, "save_strategy": "steps", "save_steps": 1, **overrides}
    cfg = tiny_config(assets, out, **settings)  # without `loss:` unless given (the example's is gem_ls)
    cfg.pop("plugins")  # the activation hook adds the plugin
    return {k: v for k, v in cfg.items() if v is not None}


def _axolotl_train(venv: Any, cfg: dict[str, Any], cwd: Path) -> subprocess.CompletedProcess:
    config_path = cwd / f"cfg-{len(list(cwd.glob('cfg-*.yml')))}.yml"
    config_path.write_text(yaml.safe_dump(cfg))
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DISTMATCH_", "PYTHON"))}
    environment.update(PATH=f"{venv.bin}:{os.environ.get('PATH', '')}")
    return subprocess.run(
        [str(venv.bin / "axolotl"), "train", str(config_path), "--launcher", "python"],
        capture_output=True,
        text=True,
        env=environment,
        cwd=cwd,
        timeout=600,
    )


@pytest.fixture(scope="module")
def emo_run(assets, tmp_path_factory) -> dict[str, Any]:
    """`axolotl train` with `loss: emo`, one step, saved as checkpoint-1 (the project-like venv runs it)."""
    from tests.helpers.project_venv import make_project_like_venv

    base = tmp_path_factory.mktemp("axolotl_resume")
    venv = make_project_like_venv(base / "venv", REPO_ROOT)
    out = base / "first"
    result = _axolotl_train(venv, _config(assets, out, loss="emo", max_steps=1), base)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return {"venv": venv, "out": out, "checkpoint": out / "checkpoint-1", "output": output}


def test_loss_without_plugins_line_trains_the_distmatch_objective(emo_run) -> None:
    """`loss:` and no `plugins:` line: the activation hook (distmatch_hooks/axolotl.py) added the plugin, and the
    distmatch trainer trained EMO's objective (not Axolotl's cross-entropy)."""
    assert f"Plugin loaded successfully: {PLUGIN}" in emo_run["output"], emo_run["output"][-6000:]
    (entry,) = [entry for entry in printed_logs(emo_run["output"]) if "loss" in entry]
    # the distmatch trainer's metrics
    assert {"ce", "entropy", "mean_token_accuracy", "demd"} <= set(entry), entry
    # EMO's transport term, which only the EMO loss computes (emo1's objective equals CE in value by design)
    assert 0 < entry["demd"] < 2, entry  # a cosine cost lies in [0, 2]


def test_the_run_records_its_loss_in_the_checkpoint_and_the_output(emo_run) -> None:
    for folder in (emo_run["checkpoint"], emo_run["out"]):
        record = json.loads((folder / "distmatch.json").read_text())
        assert (record["loss"], record["framework"]) == ("emo", "axolotl"), record
        assert record["options"] == OPTION_DEFAULTS
    tags, section = read_card(emo_run["out"])  # the model card Axolotl writes at the end of training
    assert {"distmatch", "distmatch-loss-emo", "axolotl"} <= set(tags), tags
    assert (section["loss"], section["framework"], section["version"]) == (
        "emo",
        "Axolotl",
        distmatch.__version__,
    )
    assert section["options"] == used_options("emo", OPTION_DEFAULTS), section
    assert "https://arxiv.org/abs/2310.04691" in section["paper"], section


def test_resume_without_loss_continues_with_the_recorded_loss(assets, emo_run, tmp_path) -> None:
    """No `loss:` and no `plugins:`: Axolotl alone would train its cross-entropy from the checkpoint."""
    cfg = _config(assets, tmp_path / "out", resume_from_checkpoint=str(emo_run["checkpoint"]))
    result = _axolotl_train(emo_run["venv"], cfg, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    said = [line for line in output.splitlines() if ADOPTED in line]
    assert len(said) == 1 and str(emo_run["checkpoint"] / "distmatch.json") in said[0], output[-6000:]
    (step2,) = [entry for entry in printed_logs(output) if "loss" in entry]
    assert {"demd", "ce"} <= step2.keys(), step2  # EMO trained step 2
    assert json.loads((tmp_path / "out" / "distmatch.json").read_text())["loss"] == "emo"


def test_resume_with_another_loss_is_refused_in_one_line(assets, emo_run, tmp_path) -> None:
    cfg = _config(assets, tmp_path / "out", loss="gem_ls", resume_from_checkpoint=str(emo_run["checkpoint"]))
    result = _axolotl_train(emo_run["venv"], cfg, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output, output[-6000:]
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "trained with loss=emo" in line and "asks for loss=gem_ls" in line, line
    assert str(emo_run["checkpoint"] / "distmatch.json") in line and "allow_loss_change" in line, line
    assert not (tmp_path / "out").exists()  # refused with the config: nothing loaded, nothing trained


def test_validation_continues_refuses_or_allows(assets, emo_run, tmp_path) -> None:
    """Axolotl's own config loading (prepare_plugins, then validation), in process: the recorded loss is put in the
    config; another one is refused; `allow_loss_change: true` lets it through to the trainer class."""
    resume = {"resume_from_checkpoint": str(emo_run["checkpoint"]), "plugins": [PLUGIN]}
    adopted = validate(_config(assets, tmp_path / "a", **resume), gpu=False)
    assert (adopted.loss, adopted.emo_weighting) == ("emo", "emo1")
    with pytest.raises(DistMatchConfigError, match="asks for loss=gem_linear"):
        validate(_config(assets, tmp_path / "b", loss="gem_linear", **resume), gpu=False)
    PluginManager.get_instance().plugins.clear()
    allowed = validate(
        _config(assets, tmp_path / "c", loss="gem_linear", allow_loss_change=True, **resume), gpu=False
    )
    trainer_cls = PluginManager.get_instance().plugins[PLUGIN].get_trainer_cls(allowed)
    assert trainer_cls.distmatch_loss == "gem_linear" and trainer_cls.distmatch_allow_loss_change
    # auto_resume_from_checkpoints: the last checkpoint of output_dir is the one checked
    PluginManager.get_instance().plugins.clear()
    auto = {"auto_resume_from_checkpoints": True, "plugins": [PLUGIN]}
    with pytest.raises(DistMatchConfigError, match="asks for loss=gem_linear"):
        validate(_config(assets, emo_run["out"], loss="gem_linear", **auto), gpu=False)
