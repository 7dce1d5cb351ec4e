"""The logged metrics reach the tracker the examples use (`report_to: tensorboard`, examples/trl/): a real one-step
`DistMatchSFTTrainer` run on the tiny Llama writes TensorBoard event files, and the distmatch metrics (CE, entropy,
DEMD) read back from them equal the trainer's own logs. TensorBoard writes local files only: nothing to switch off
offline (W&B is disabled by the Makefile's WANDB_MODE=disabled).

Runs in `.venv` (TRL 1.16; tensorboard from the `dev` extra) and `.venv-axolotl` (TRL 1.9): the `trl_trainer` marker.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from tests.helpers.env import REPO_ROOT  # noqa: E402
from tests.helpers.sft import make_trainer, step_logs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def test_examples_report_to_tensorboard() -> None:
    import yaml

    for example in ("emo.yaml", "gem_ls.yaml"):
        config = yaml.safe_load((REPO_ROOT / "examples" / "trl" / example).read_text())
        assert config["report_to"] == "tensorboard", example


def test_emo_metrics_are_in_the_tensorboard_logs(models, data, tmp_path) -> None:
    trainer = make_trainer(models["plain"], data, tmp_path, loss="emo", max_steps=2, report_to="tensorboard")
    trainer.train()
    events = list((tmp_path / "out").rglob("events.out.tfevents.*"))
    assert events, sorted(p.name for p in (tmp_path / "out").rglob("*"))
    scalars: dict[str, list[float]] = {}
    for event_file in events:
        accumulator = EventAccumulator(str(event_file))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend(e.value for e in accumulator.Scalars(tag))
    logged = step_logs(trainer)
    assert len(logged) == 2
    for name in ("loss", "ce", "entropy", "demd"):
        assert f"train/{name}" in scalars, sorted(scalars)
        got, want = scalars[f"train/{name}"], [step[name] for step in logged]
        assert len(got) == len(want) and all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got, want)), (
            name,
            got,
            want,
        )
    assert all(0 < v < 1 for v in scalars["train/demd"]), scalars["train/demd"]  # DEMD is in (0, 1)
