"""EMO's cost embedding (`trl_ext/losses/objectives/emo.py`): edge cases of the embedding given to the loss.

Independent oracle tests for trl_ext.losses (written from the API spec, not from the implementation), against
hand-written float64 formulas in tests/helpers/loss_oracles.py; shared cases and builders: tests/helpers/loss_cases.py.
"""

from __future__ import annotations

import pytest
import torch

import tests.helpers.loss_oracles as O  # noqa: E402
from tests.helpers.loss_cases import (  # noqa: E402
    EMO_TIGHT,
    F32,
    F64,
    _gen,
    call_logits_path,
    make_cost_embedding,
    make_fused,
    make_logits,
    upstream,
)
from trl_ext.losses import (  # noqa: E402
    IGNORE_INDEX,
    fused_token_loss,
    token_loss,
)

# ---------------------------------------------------------------------------------------------
# EMO cost embedding
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32, torch.float16], ids=str)
@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_zero_rows_in_cost_embedding(weighting, path, dtype):
    N, V, d = 8, 11, 5
    hidden, weight, labels = make_fused(N, V, d, seed=151, dtype=F64, n_ignored=1)
    valid_rows = [i for i in range(N) if labels[i] != IGNORE_INDEX]
    target_zero = int(labels[valid_rows[0]])  # zero row at a target
    other = [v for v in range(V) if v not in labels.tolist()][:2]  # zero rows at non-targets
    emb = make_cost_embedding(V, 6, seed=151, big=False, zero_rows=[target_zero, *other])
    params = {"weighting": weighting, "cost_embedding": emb.to(dtype)}
    params64 = {"weighting": weighting, "cost_embedding": emb}
    g = upstream("random", N, 151, F64 if dtype == F64 else F32)
    if path == "fused":
        h = hidden.to(dtype).requires_grad_(True)
        w = weight.to(dtype).requires_grad_(True)
        loss = fused_token_loss("emo", h, w, labels, **params)
        (loss * g).sum().backward()
        grads = [h.grad, w.grad]
    else:
        z = (hidden @ weight.T).to(dtype).requires_grad_(True)
        loss = call_logits_path(path, "emo", z, labels, params)
        (loss * g).sum().backward()
        grads = [z.grad]
    assert torch.isfinite(loss).all()
    assert all(torch.isfinite(gr).all() for gr in grads)
    orc = O.oracle("emo", hidden @ weight.T, labels, **params64)
    # rows whose target has a zero cost row: s == 0 everywhere => DEMD = 1, e = 1
    zero_t = torch.tensor([int(labels[i]) == target_zero for i in range(N)])
    assert zero_t.any()
    torch.testing.assert_close(orc.demd[zero_t], torch.ones(int(zero_t.sum()), dtype=F64))
    tol = {"atol": 1e-6, "rtol": 1e-6} if dtype != torch.float16 else {"atol": 5e-2, "rtol": 2e-2}
    torch.testing.assert_close(loss.detach().double(), orc.value, **tol)
    if path != "fused":
        exp_z = g.double()[:, None] * orc.grad
        torch.testing.assert_close(grads[0].double(), exp_z, **tol)


@pytest.mark.parametrize("path", ["token", "reference", "fused"])
@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_no_gradient_into_cost_embedding(weighting, path):
    N, V, d = 8, 11, 5
    hidden, weight, labels = make_fused(N, V, d, seed=161, dtype=F32)
    emb = make_cost_embedding(V, 5, seed=161, big=False, dtype=F32).requires_grad_(True)
    g = upstream("random", N, 161, F32)
    if path == "fused":
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = fused_token_loss("emo", h, w, labels, cost_embedding=emb, weighting=weighting)
    else:
        z = (hidden @ weight.T).requires_grad_(True)
        loss = call_logits_path(path, "emo", z, labels, {"cost_embedding": emb, "weighting": weighting})
    (loss * g).sum().backward()
    assert emb.grad is None or torch.count_nonzero(emb.grad) == 0


@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_fused_with_live_head_as_cost_embedding(weighting):
    """'Adaptive' EMO: the head weight itself (requires_grad) as cost embedding; only G.T @ H reaches it."""
    N, V, d = 8, 11, 5
    hidden, weight, labels = make_fused(N, V, d, seed=171)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    g = upstream("random", N, 171, F64)
    loss = fused_token_loss("emo", h, w, labels, cost_embedding=w, weighting=weighting)
    (loss * g).sum().backward()
    orc = O.oracle("emo", hidden @ weight.T, labels, cost_embedding=weight, weighting=weighting)
    G = g[:, None] * orc.grad
    torch.testing.assert_close(loss.detach(), orc.value, atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(h.grad, G @ weight, atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(w.grad, G.T @ hidden, atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("dc", [3, 9])
@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_fused_cost_embedding_other_width(weighting, dc):
    N, V, d = 8, 11, 5
    assert dc != d
    hidden, weight, labels = make_fused(N, V, d, seed=181)
    emb = make_cost_embedding(V, dc, seed=181)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    g = upstream("random", N, 181, F64)
    loss = fused_token_loss("emo", h, w, labels, cost_embedding=emb, weighting=weighting, chunk_size=3)
    (loss * g).sum().backward()
    orc = O.oracle("emo", hidden @ weight.T, labels, cost_embedding=emb, weighting=weighting)
    G = g[:, None] * orc.grad
    torch.testing.assert_close(loss.detach(), orc.value, **EMO_TIGHT)
    torch.testing.assert_close(h.grad, G @ weight, **EMO_TIGHT)
    torch.testing.assert_close(w.grad, G.T @ hidden, **EMO_TIGHT)


@pytest.mark.parametrize("weighting", ["emo1", "emo2"])
def test_emo_invariant_to_cost_row_scaling(weighting):
    logits, labels = make_logits(seed=191)
    emb = make_cost_embedding(13, 5, seed=191, big=False)
    scales = 0.1 + 10 * torch.rand(13, 1, generator=_gen(191), dtype=F64)
    a = token_loss("emo", logits, labels, cost_embedding=emb, weighting=weighting, return_stats=True)
    b = token_loss("emo", logits, labels, cost_embedding=emb * scales, weighting=weighting, return_stats=True)
    torch.testing.assert_close(a[0], b[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(a[1].demd, b[1].demd, atol=1e-6, rtol=1e-6)


def test_emo_cost_embedding_dtype_differs_from_logits():
    logits, labels = make_logits(seed=195, dtype=F32)
    emb = make_cost_embedding(13, 5, seed=195, big=False)
    for emb_dtype in (torch.float16, torch.bfloat16, F64):
        out = token_loss("emo", logits, labels, cost_embedding=emb.to(emb_dtype), weighting="emo2")
        orc = O.oracle("emo", logits, labels, cost_embedding=emb.to(emb_dtype).double(), weighting="emo2")
        assert out.dtype == F32
        torch.testing.assert_close(out.double(), orc.value, atol=1e-3, rtol=1e-3)
