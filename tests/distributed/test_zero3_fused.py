"""DeepSpeed ZeRO-3 with 2 CPU processes over gloo: the fused path (no `[tokens, vocab]` logits) runs with the LM
head partitioned, and the loss and every parameter's gradient equal the unsharded model's (fp32), for every loss,
untied and tied embeddings; so does the logits path. EMO's frozen cost embedding is the whole pre-trained head on
every rank; a live one is refused.

One `torchrun` launch (`tests/helpers/zero3_worker.py`, `deepspeed.initialize` directly; ~40 s on 2 cores, plus ~30 s the
first time DeepSpeed compiles its shared-memory op on a machine). The DeepSpeed command lines (`trl sft`,
`axolotl train`) are tested elsewhere; this checks the gradients themselves.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers.dist_common import LOSS_CASES, WORLD, torchrun

pytestmark = pytest.mark.slow  # multiprocess: tests/placement.py
TOL = 1e-5  # float32 under DeepSpeed against the float64 reference (measured: < 1e-6)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    assert importlib.util.find_spec("deepspeed"), (
        "DeepSpeed is part of the dev extra: pip install -e '.[dev]'"
    )
    return torchrun("zero3_worker.py", tmp_path_factory.mktemp("zero3"))


@pytest.mark.parametrize("model", ["untied", "tied"])
def test_head_stays_partitioned_and_cost_embedding_is_whole(ranks, model):
    for r in ranks:
        info = r["models"][model]
        assert info["head_ds_status"] == "ZeroParamStatus.NOT_AVAILABLE" and info["head_local_numel"] == 0
        assert info["head_partition_numel"] * WORLD == info["head_full_numel"]
        assert info["frozen_cost_shape"] == [96, 16] and info["frozen_cost_max_diff"] == 0.0
        assert "emo_cost_embedding='live'" in info["live_cost_refused"]
        assert info["head_unchanged_after_lr0_steps"] == 0.0


@pytest.mark.parametrize("model", ["untied", "tied"])
def test_fused_path_loss_and_every_gradient_equal_the_unsharded_model(ranks, model):
    expected = {(case, path) for case, _, live in LOSS_CASES if not live for path in ("fused", "logits")}
    for r in ranks:
        cases = r["models"][model]["cases"]
        assert {(c["case"], c["path"]) for c in cases} == expected
        for c in cases:
            where = f"rank {r['rank']} {model} {c['case']} {c['path']}"
            assert c["reported_path"] == c["path"], where
            assert c["head_logits_calls"] == (0 if c["path"] == "fused" else 1), where
            assert c["head_numel_after_step"] == 0, where  # released again after the step
            assert c["loss_abs_diff"] < TOL, where
            assert not c["missing_grads"] and not c["unexpected_grads"], where
            assert c["n_params"] == (20 if model == "tied" else 21), where
            assert c["grad_max_rel"] < TOL, (where, c["worst_param"], c["grad_max_rel"])
