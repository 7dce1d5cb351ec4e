"""FSDP2 (`torch.distributed.fsdp.fully_shard`) with 2 CPU processes over gloo: the loss and every parameter's
gradient through the patched forward equal the unsharded model's, on the fused path (no `[tokens, vocab]` logits)
and the logits path, for every loss and every head layout (accelerate's, a separately wrapped head, tied
embeddings), and the lazily taken EMO cost embedding of a sharded head equals the unsharded head.

One `torchrun` launch runs every case (`tests/helpers/fsdp2_worker.py`, ~1 min on 2 cores); the tests here read its
per-rank JSON. Not through `accelerate launch --use_fsdp`: on CPU accelerate silently runs DDP instead.
"""

from __future__ import annotations

import pytest

from tests.helpers.dist_common import LOSS_CASES, WORLD, torchrun

LAYOUTS = ("accelerate", "accelerate_tied", "separate_head", "head_embed_tied", "root_only")
TIED = {"accelerate_tied", "head_embed_tied"}
TOL = 1e-12  # float64 throughout: sharded and unsharded differ only in summation order

pytestmark = pytest.mark.slow  # multiprocess: tests/placement.py


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return torchrun("fsdp2_worker.py", tmp_path_factory.mktemp("fsdp2"))


def test_both_ranks_ran_every_layout(ranks):
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == WORLD for r in ranks)
    for r in ranks:
        assert tuple(r["layouts"]) == LAYOUTS


@pytest.mark.parametrize("layout", LAYOUTS)
def test_head_is_really_sharded(ranks, layout):
    for r in ranks:
        info = r["layouts"][layout]
        assert info["tied"] == (layout in TIED)
        # Outside the forward the head's weight is a DTensor holding half of the vocabulary rows on each rank.
        assert info["head_weight_is_dtensor"] and info["head_local_rows"] * WORLD == info["vocab"]
        assert info["head_class"] == ("Linear" if layout == "root_only" else "FSDPLinear")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_lazily_taken_cost_embedding_is_the_whole_unsharded_head(ranks, layout):
    for r in ranks:
        info = r["layouts"][layout]
        assert info["frozen_cost_is_plain_tensor"]
        assert info["frozen_cost_max_diff"] == 0.0 and info["resolved_cost_max_diff"] == 0.0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_loss_and_every_gradient_equal_the_unsharded_model(ranks, layout):
    expected = {(case, path) for case, _, _ in LOSS_CASES for path in ("fused", "logits")}
    for r in ranks:
        cases = r["layouts"][layout]["cases"]
        assert {(c["case"], c["path"]) for c in cases} == expected
        for c in cases:
            where = f"rank {r['rank']} {layout} {c['case']} {c['path']}"
            assert c["reported_path"] == c["path"], where
            # The fused path never calls the head on the hidden states (no [tokens, vocab] logits); logits once.
            assert c["head_logits_calls"] == (0 if c["path"] == "fused" else 1), where
            assert c["loss_abs_diff"] < TOL, where
            assert not c["missing_grads"] and not c["unexpected_grads"], where
            assert c["n_params"] == (20 if layout in TIED else 21), where
            assert c["grad_max_rel"] < TOL, (where, c["worst_param"], c["grad_max_rel"])


def test_the_comparison_catches_a_head_gathered_without_partial_gradients(ranks):
    """Control: `lm_head.weight.full_tensor()` read outside the head's FSDP2 hooks (no `Partial` gradient
    placement) skips the gradient reduction; the same comparison shows it on the head's gradient."""
    for r in ranks:
        control = r["layouts"]["separate_head"]["control_full_tensor_without_partial"]
        assert control["loss_abs_diff"] < TOL  # the loss value itself is right ...
        assert (
            control["worst_param"] == "lm_head.weight" and control["head_grad_max_rel"] > 0.1
        )  # ... its grad not


def test_anchored_loss_with_a_reference_sharded_like_the_policy(ranks):
    """`asft` with its reference model sharded too (each decoder layer, the head a unit resharding after forward;
    the policy in accelerate's layout): the reference runs as its root's forward (its units gather their shards),
    its head is gathered for the loss and stays sharded; loss and every gradient equal the
    unsharded pair's, on both paths, and the KL is not 0 (a reference from another seed)."""
    for r in ranks:
        cases = r["anchored"]
        assert [c["path"] for c in cases] == ["fused", "logits"]
        for c in cases:
            where = f"rank {r['rank']} asft {c['path']}"
            assert c["reported_path"] == c["path"] and c["kl"] > 1e-3, where
            assert c["reference_local_rows"] * WORLD == r["layouts"]["accelerate"]["vocab"], where
            assert c["loss_abs_diff"] < TOL and not c["missing_grads"] and not c["unexpected_grads"], where
            assert c["grad_max_rel"] < TOL, (where, c["worst_param"], c["grad_max_rel"])
