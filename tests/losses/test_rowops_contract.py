"""trl_ext.losses.rowops against its docstrings, for what the oracle tests leave open: `softmax(z, scale)` is
softmax(scale * z) and logsumexp(scale * z) of each row on its own, stable for logits of any size (each row shifted
by its own maximum, before or after the scale alike), in a new buffer; `subtract_at_target` takes `amount_i` from
grad[i, y_i] only; `rowdot` is the row-wise dot product."""

from __future__ import annotations

import pytest
import torch

from trl_ext.losses.rowops import rowdot, softmax, subtract_at_target

F32, F64 = torch.float32, torch.float64


def _expected(z: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    scaled = (z * scale).double()  # scale * z as the inputs' dtype rounds it; the rest in float64
    return torch.softmax(scaled, dim=1), torch.logsumexp(scaled, dim=1)


@pytest.mark.parametrize("scale", [1.0, 0.5, 2.0, 1 / 0.7])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_softmax_of_rows_far_apart_is_each_rows_own(scale: float, dtype: torch.dtype) -> None:
    """Rows of very different magnitudes in one chunk (a confident row next to a flat one): each row's result is
    what it is alone, finite, summing to 1."""
    z = torch.tensor(
        [[1000.0, 999.0, 998.0], [0.0, -1.0, -2.0], [-1000.0, -1001.0, -1002.0], [60.0, 61.0, -5.0]],
        dtype=dtype,
    )
    p, lse = softmax(z, scale)
    want_p, want_lse = _expected(z, scale)
    assert p.dtype == lse.dtype == dtype and p.shape == z.shape and lse.shape == (4,)
    tol = {"rtol": 1e-6, "atol": 1e-7} if dtype == F32 else {"rtol": 1e-12, "atol": 1e-14}
    torch.testing.assert_close(p.double(), want_p, **tol)
    torch.testing.assert_close(lse.double(), want_lse, **tol)
    if scale in (1.0, 0.5, 2.0):  # scale * z exact: shifting a row changes nothing
        torch.testing.assert_close(p[0], p[1])
    torch.testing.assert_close(p.sum(dim=1), torch.ones(4, dtype=dtype))


@pytest.mark.parametrize("scale", [0.5, 2.0, 10.0, 0.01])
def test_softmax_with_a_scale_is_stable_for_large_logits(scale: float) -> None:
    """GEM's softmax(z / beta): large logits times the scale, in float32, without overflow or underflow."""
    z = torch.tensor([[100.0, 99.0, 80.0], [-300.0, -301.0, -350.0]], dtype=F32)
    p, lse = softmax(z, scale)
    want_p, want_lse = _expected(z, scale)
    assert torch.isfinite(p).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(p.double(), want_p, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-6, atol=1e-5)


def test_softmax_writes_a_new_buffer_and_leaves_the_logits_alone() -> None:
    z = torch.randn(5, 7, generator=torch.Generator().manual_seed(3), dtype=F64)
    before = z.clone()
    for scale in (1.0, 0.7):
        p, _ = softmax(z, scale)
        assert p.data_ptr() != z.data_ptr()
        torch.testing.assert_close(z, before, rtol=0, atol=0)
        p.zero_()
        torch.testing.assert_close(z, before, rtol=0, atol=0)


@pytest.mark.parametrize("amount", ["float", "tensor"])
def test_subtract_at_target_changes_only_each_rows_target(amount: str) -> None:
    gen = torch.Generator().manual_seed(8)
    grad = torch.randn(4, 6, generator=gen, dtype=F64)
    y = torch.tensor([5, 0, 0, 3])
    take = 0.25 if amount == "float" else torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64)
    expected = grad.clone()
    for i, target in enumerate(y.tolist()):
        expected[i, target] -= take if amount == "float" else take[i]
    subtract_at_target(grad, y, take)
    torch.testing.assert_close(grad, expected, rtol=0, atol=0)


def test_rowdot_is_the_row_wise_dot_product() -> None:
    gen = torch.Generator().manual_seed(9)
    a, b = torch.randn(3, 11, generator=gen, dtype=F64), torch.randn(3, 11, generator=gen, dtype=F64)
    torch.testing.assert_close(rowdot(a, b), (a * b).sum(dim=1))
