"""trl_ext.losses.fused_token_loss's LM-head gradient against its documented contract ("same values and gradients as
`token_loss` on the full logits"; grad_weight.py: d W = sum_i g_i G_i^T h_i, from the forward's unit-upstream buffer
when the upstream gradient is uniform over the valid rows), for the upstream gradients the other tests leave open: a
uniform one that is not 1 / n (2: twice the sum), a single valid row, no valid row, and a bfloat16 head (d W in the
head's dtype), with each d-weight accumulator that runs on the CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trl_ext.losses import FusedSettings, fused_token_loss, token_loss
from trl_ext.losses.grad_weight import add_product, new_buffer
from trl_ext.losses.plan import make_plan

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


# --- the accumulator and its products in the CUDA configurations (grad_weight.py's module table), checked on meta
# tensors: the mixed-dtype products (16-bit operands, float32 result) have no CPU kernel, so their values are the
# GPU check's; here their dtypes, devices and in-place writes ------------------------------------------------------


def _fused_plan(accum: str, dtype: torch.dtype, device: str = "cpu"):
    hidden = torch.empty(N, D, dtype=dtype, device=device)
    return make_plan(
        "ce",
        {},
        V,
        hidden,
        chunk_size=4,
        want_stats=False,
        settings=FusedSettings(grad_weight_accum=accum),
        fused=True,
    )


@pytest.mark.parametrize(
    ("accum", "expected"),
    [("float32", torch.float32), ("weight", torch.bfloat16), ("tiles", torch.bfloat16)],
)
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_accumulator_is_in_the_compute_or_the_weight_dtype_on_the_weights_device(accum, expected, device):
    """`float32`: a [V, d] buffer in the compute dtype; `weight` and `tiles`: in the head's dtype (half the memory
    of a bf16 head's float32 buffer); on the head's device, zero."""
    weight = torch.empty(V, D, dtype=torch.bfloat16, device=device)
    # `tiles` needs the Triton kernel to plan (its runs: tests/losses/test_triton.py); its buffer rule is the same
    plan = _fused_plan("weight" if accum == "tiles" else accum, torch.bfloat16)
    buffer = new_buffer(dataclasses.replace(plan, grad_weight_mode=accum), weight)
    assert (buffer.dtype, buffer.device, buffer.shape) == (expected, torch.device(device), weight.shape)
    if device == "cpu":
        assert not buffer.any()


def _meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("accumulator", [torch.bfloat16, torch.float32], ids=["16-bit", "compute-dtype"])
def test_16_bit_operands_add_their_float32_product_into_the_accumulator_in_place(accumulator):
    """On CUDA the operands are in the head's 16-bit dtype (`matmul_dtype`) and the products float32: a 16-bit
    accumulator gets grad^T h added in place (cuBLAS, one rounding), a compute-dtype one too (a float32 result of
    16-bit operands). The write lands in the accumulator itself, in its dtype."""
    plan = dataclasses.replace(_fused_plan("weight", torch.float32), matmul_dtype=torch.bfloat16)
    grad_weight = _meta(V, D, dtype=accumulator)
    grad, h = _meta(N, V, dtype=torch.bfloat16), _meta(N, D, dtype=torch.bfloat16)
    version = grad_weight._version
    add_product(plan, grad_weight, grad, h)
    assert grad_weight._version > version  # written in place: nothing else holds the sum
    assert (grad_weight.dtype, grad_weight.shape) == (accumulator, (V, D))
