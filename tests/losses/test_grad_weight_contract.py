"""trl_ext.losses.fused_token_loss's LM-head gradient against its documented contract ("same values and gradients as
`token_loss` on the full logits"; grad_weight.py: d W = sum_i g_i G_i^T h_i, from the forward's unit-upstream buffer
when the upstream gradient is uniform over the valid rows), for the upstream gradients the other tests leave open: a
uniform one that is not 1 / n (2: twice the sum), a single valid row, no valid row, and a bfloat16 head (d W in the
head's dtype), with each d-weight accumulator that runs on the CPU."""

from __future__ import annotations

import pytest
import torch

from trl_ext.losses import FusedSettings, fused_token_loss, token_loss

N, D, V = 6, 8, 20


def _tensors(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, D, generator=g).to(dtype)
    weight = torch.randn(V, D, generator=g).to(dtype)
    labels = torch.randint(0, V, (N,), generator=g)
    return hidden, weight, labels


def _grad_weight(
    fused: bool, labels: torch.Tensor, scale: float, accum: str, dtype=torch.float32
) -> torch.Tensor:
    hidden, weight, _ = _tensors(dtype)
    if not fused:  # the float64 oracle: autograd through the full logits
        hidden, weight = hidden.double(), weight.double()
    weight.requires_grad_()
    if fused:
        loss = fused_token_loss(
            "ce", hidden, weight, labels, chunk_size=4, settings=FusedSettings(grad_weight_accum=accum)
        )
    else:
        loss = token_loss("ce", hidden @ weight.T, labels)
    (loss.sum() * scale).backward()
    assert weight.grad is not None
    return weight.grad


@pytest.mark.parametrize("accum", ["float32", "weight"])
@pytest.mark.parametrize("scale", [2.0, 1.0, 0.5])
def test_a_uniform_upstream_gradient_scales_d_weight(accum: str, scale: float) -> None:
    labels = _tensors()[2]
    got = _grad_weight(True, labels, scale, accum)
    assert torch.allclose(got.double(), _grad_weight(False, labels, scale, accum), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("accum", ["float32", "weight"])
def test_one_valid_row_and_none(accum: str) -> None:
    labels = torch.full((N,), -100)
    labels[3] = 5
    got = _grad_weight(True, labels, 0.5, accum)
    assert torch.allclose(got.double(), _grad_weight(False, labels, 0.5, accum), rtol=1e-5, atol=1e-6)
    assert not torch.equal(got, torch.zeros_like(got))
    none = _grad_weight(True, torch.full((N,), -100), 1.0, accum)
    assert torch.equal(none, torch.zeros_like(none))


@pytest.mark.parametrize("accum", ["float32", "weight"])
def test_a_bfloat16_head_gets_a_bfloat16_gradient(accum: str) -> None:
    labels = _tensors()[2]
    got = _grad_weight(True, labels, 1.0, accum, torch.bfloat16)
    assert got.dtype == torch.bfloat16
    hidden, weight, _ = _tensors(torch.bfloat16)
    w = weight.double().requires_grad_()
    token_loss("ce", hidden.double() @ w.T, labels).sum().backward()
    assert torch.allclose(got.double(), w.grad, rtol=2e-2, atol=2e-2)
