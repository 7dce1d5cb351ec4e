"""trl_ext.losses.fused_path against its docstrings, for what tests/losses/test_paths.py leaves open: `return_stats`
gives the same statistics as the logits path, the `settings` given are the ones used (not the environment's), the
input refusals name the argument and what is expected (hidden [N, d], weight [V, d] of the same dtype and device),
and `_matmul_dtype`'s rule (16-bit products with float32 outputs on CUDA only, torch >= 2.8)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trl_ext.losses import FusedSettings, fused_token_loss, token_loss
from trl_ext.losses import fused_path as fused_path_module


def _inputs(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 4, generator=g, dtype=dtype)
    weight = torch.randn(9, 4, generator=g, dtype=dtype)
    labels = torch.tensor([1, 2, -100, 8, 0, 3])
    return hidden, weight, labels


def test_return_stats_gives_the_logits_paths_statistics() -> None:
    hidden, weight, labels = _inputs()
    loss, stats = fused_token_loss("ce", hidden, weight, labels, chunk_size=4, return_stats=True)
    want_loss, want = token_loss("ce", hidden @ weight.T, labels, return_stats=True)
    torch.testing.assert_close(loss, want_loss)
    for field in ("ce", "entropy", "top1_correct"):
        torch.testing.assert_close(getattr(stats, field), getattr(want, field))


def test_the_settings_given_are_used_not_the_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTMATCH_GRAD_WEIGHT_ACCUM", raising=False)
    hidden, weight, labels = _inputs()
    # `tiles` needs the Triton kernel, which does not run on a CPU: the given settings are checked and refused
    with pytest.raises(ValueError, match=r"^grad_weight_accum='tiles' .* needs the Triton row kernel"):
        fused_token_loss("ce", hidden, weight, labels, settings=FusedSettings(grad_weight_accum="tiles"))


@pytest.mark.parametrize(("argument", "position"), [("hidden", 1), ("weight", 2)])
def test_a_non_tensor_input_is_named(argument: str, position: int) -> None:
    args = list(_inputs())
    args[position - 1] = [[1.0, 2.0]]
    with pytest.raises(ValueError, match=rf"^{argument} must be a torch\.Tensor, got list\.$"):
        fused_token_loss("ce", *args)


@pytest.mark.parametrize(("argument", "position"), [("hidden", 1), ("weight", 2)])
def test_an_input_of_the_wrong_rank_is_named(argument: str, position: int) -> None:
    args = list(_inputs())
    args[position - 1] = args[position - 1].unsqueeze(0)
    with pytest.raises(ValueError, match=rf"^{argument} must be 2-D, got shape "):
        fused_token_loss("ce", *args)


def test_a_transposed_head_is_refused_with_its_shape() -> None:
    hidden, weight, labels = _inputs()
    with pytest.raises(ValueError) as err:
        fused_token_loss("ce", hidden, weight.T.contiguous(), labels)
    assert str(err.value) == (
        "hidden has width 4 but weight is (4, 9); weight must be [vocab_size, 4] (the LM head's weight, not its "
        "transpose)."
    )


def test_a_dtype_mismatch_alone_is_refused() -> None:
    hidden, weight, labels = _inputs()
    with pytest.raises(ValueError) as err:
        fused_token_loss("ce", hidden, weight.float(), labels)
    assert str(err.value) == (
        "hidden (torch.float64, cpu) and weight (torch.float32, cpu) must share dtype and device."
    )


def _has_mixed_mm() -> bool:  # `mm(..., out_dtype=)` came with torch 2.8
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_products_on_cuda_keep_their_dtype(dtype: torch.dtype) -> None:
    cuda = SimpleNamespace(is_cuda=True, dtype=dtype)  # what the rule reads of a CUDA tensor
    assert fused_path_module._matmul_dtype(cuda) == (dtype if _has_mixed_mm() else None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("is_cuda", "dtype"),
    [(True, torch.float32), (True, torch.float64), (False, torch.bfloat16), (False, torch.float16)],
)
def test_other_products_are_converted(is_cuda: bool, dtype: torch.dtype) -> None:
    tensor = SimpleNamespace(is_cuda=is_cuda, dtype=dtype)
    assert fused_path_module._matmul_dtype(tensor) is None  # type: ignore[arg-type]
