"""Behaviour of the memory-efficient paths themselves (the math is checked in test_oracle.py)."""

from __future__ import annotations

import weakref

import pytest
import torch

from trl_ext.losses import LOSS_NAMES, auto_chunk_size, fused_token_loss, reference_token_loss, token_loss
from trl_ext.losses import chunked as chunked_module
from trl_ext.losses import plan as plan_module

V, D = 23, 6


def _inputs(n: int = 11, seed: int = 0, dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, D, generator=gen, dtype=dtype).requires_grad_()
    weight = torch.randn(V, D, generator=gen, dtype=dtype).requires_grad_()
    labels = torch.randint(0, V, (n,), generator=gen)
    labels[[1, 4]] = -100
    return hidden, weight, labels


def _params(name: str, weight: torch.Tensor) -> dict:
    return {"cost_embedding": weight.detach().clone()} if name == "emo" else {}


def _reference_model(name: str, n: int) -> tuple[dict, dict]:
    """The anchored losses' reference: (fused keywords, logits keywords), else two empty dicts."""
    if name not in ("asft", "sft_kl"):
        return {}, {}
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    weight = torch.randn(V, 3, generator=gen, dtype=torch.float64)
    return {"reference_hidden": hidden, "reference_weight": weight}, {"reference_logits": hidden @ weight.T}


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_fused_weight_grad_rescaled_and_recomputed_agree(name):
    """The uniform-upstream fast path (rescale) and the recompute path give the reference gradient."""
    hidden, weight, labels = _inputs()
    params = _params(name, weight)
    fused_ref, logits_ref = _reference_model(name, hidden.shape[0])
    ref = reference_token_loss(name, hidden @ weight.T, labels, **params, **logits_ref)
    upstreams = {
        "uniform": torch.full_like(ref, 0.125),
        "per-token": torch.linspace(0.1, 2.0, ref.numel(), dtype=ref.dtype),
    }
    for kind, upstream in upstreams.items():
        ref_grads = torch.autograd.grad(ref, (hidden, weight), upstream, retain_graph=True)
        loss = fused_token_loss(name, hidden, weight, labels, chunk_size=3, **params, **fused_ref)
        grads = torch.autograd.grad(loss, (hidden, weight), upstream)
        for got, want, what in zip(grads, ref_grads, ("hidden", "weight")):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=f"{kind} upstream, d {what}")


def test_fused_second_backward_recomputes_after_consuming_the_forward_gradient():
    """The forward's gradients are consumed by the first backward (freed early); a second one recomputes both."""
    hidden, weight, labels = _inputs()
    loss = fused_token_loss("gem_ls", hidden, weight, labels, chunk_size=4).sum()
    first = torch.autograd.grad(loss, (hidden, weight), retain_graph=True)
    second = torch.autograd.grad(loss, (hidden, weight))
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert a.abs().sum() > 0


@pytest.mark.parametrize("ignored", [True, False], ids=["some-ignored", "none-ignored"])
def test_fused_backward_releases_the_forwards_gradient_buffers(ignored):
    """The forward's hidden- and weight-gradient buffers are let go by the backward that uses them (memory at the
    backward's peak), whether or not a label is ignored (then the valid rows are all the rows)."""
    hidden, weight, labels = _inputs()
    if not ignored:
        labels = labels.clamp(min=0)
    loss = fused_token_loss("gem_ls", hidden, weight, labels, chunk_size=4)
    node = loss.grad_fn
    assert node.grad_hidden_unit is not None and node.weight_gradient.unit is not None
    grads = torch.autograd.grad(loss.sum() / 7, (hidden, weight), retain_graph=True)
    assert node.grad_hidden_unit is None and node.weight_gradient.unit is None
    assert all(g.dtype == torch.float64 and g.abs().sum() > 0 for g in grads)


def test_no_gradient_work_under_no_grad(monkeypatch):
    calls = []
    original = plan_module.select_row_math

    def select_spy(*args, **kwargs):
        row_math = original(*args, **kwargs)

        def spy(*a, **kw):
            calls.append(kw["want_grad"])
            return row_math(*a, **kw)

        return spy

    monkeypatch.setattr(plan_module, "select_row_math", select_spy)
    hidden, weight, labels = _inputs()
    with torch.no_grad():
        loss = fused_token_loss("gem_linear", hidden, weight, labels, chunk_size=4)
    assert not loss.requires_grad
    assert calls and not any(calls)
    calls.clear()
    fused_token_loss("gem_linear", hidden, weight, labels, chunk_size=4)
    assert calls and all(calls)


@pytest.mark.parametrize("name", ["ce", "emo"])
def test_fused_chunk_buffers_are_freed_before_the_next_chunks_logits(monkeypatch, name):
    """At most one chunk of [rows, V] logits (and their gradient) is alive at a time: each chunk's logits are
    released before the next chunk's are computed (two alive at once cost 512 MiB more on an H200)."""
    alive_at_next_chunk = []
    previous: list[weakref.ref] = []
    original = plan_module.select_row_math

    def select_spy(*args, **kwargs):
        row_math = original(*args, **kwargs)

        def spy(name_, params, z, *a, **kw):
            alive_at_next_chunk.extend(ref() is not None for ref in previous)
            result = row_math(name_, params, z, *a, **kw)
            previous[:] = [weakref.ref(t) for t in (z, result.grad) if t is not None]
            return result

        return spy

    monkeypatch.setattr(plan_module, "select_row_math", select_spy)
    hidden, weight, labels = _inputs(n=11)
    fused_token_loss(name, hidden, weight, labels, chunk_size=3, **_params(name, weight)).sum().backward()
    assert len(alive_at_next_chunk) >= 2 and not any(alive_at_next_chunk)  # 9 valid rows: 3 chunks


def test_frozen_weight_gets_no_gradient_and_hidden_still_does():
    hidden, weight, labels = _inputs()
    weight = weight.detach()
    loss = fused_token_loss("emo", hidden, weight, labels, cost_embedding=weight)
    loss.sum().backward()
    assert weight.grad is None
    assert hidden.grad is not None and hidden.grad[labels != -100].abs().sum() > 0


def test_chunk_size_follows_the_memory_budget(monkeypatch):
    monkeypatch.setenv(chunked_module.CHUNK_MEMORY_ENV, "1")
    assert auto_chunk_size(1024, torch.float32, buffers=2) == 2**20 // (1024 * 4 * 2)
    assert auto_chunk_size(10**9, torch.float32, buffers=4) == 1  # never zero rows
    monkeypatch.setenv(chunked_module.CHUNK_MEMORY_ENV, "0")
    with pytest.raises(ValueError, match="DISTMATCH_CHUNK_MEMORY_MB"):
        auto_chunk_size(1024, torch.float32, buffers=2)


@pytest.mark.parametrize("name", ["gem_ls", "emo"])
def test_automatic_and_tiny_budget_chunks_agree(monkeypatch, name):
    hidden, weight, labels = _inputs(n=40)
    params = _params(name, weight)
    auto = fused_token_loss(name, hidden, weight, labels, **params)
    monkeypatch.setenv(chunked_module.CHUNK_MEMORY_ENV, str(V * 8 * 4 * 3 / 2**20))  # about 3 rows per chunk
    small = fused_token_loss(name, hidden, weight, labels, **params)
    torch.testing.assert_close(auto, small, rtol=1e-12, atol=1e-12)


def test_logits_gradient_keeps_the_input_dtype_and_loss_is_float32():
    logits = (torch.randn(9, V) * 20).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, V, (9,))
    loss = token_loss("gem_linear", logits, labels)
    assert loss.dtype == torch.float32
    loss.sum().backward()
    assert logits.grad.dtype == torch.bfloat16 and torch.isfinite(logits.grad.float()).all()
