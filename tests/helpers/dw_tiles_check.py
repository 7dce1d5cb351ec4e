"""The check of benchmarks/_dw_tiles.py (the `dw_tiles` prototype row of bench_fused_memory.py) against the reference:
shared by its Triton-kernel test (tests/losses/test_triton.py, interpreter) and its PyTorch-fallback test
(tests/benchmarks/test_benchmarks.py)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from tests.helpers.env import REPO_ROOT
from tests.helpers.modules import load_module
from trl_ext.losses import reference_token_loss

BUDGET_MB = 0.02  # 40 valid rows of V 384, d 16: four forward chunks of 12 rows, three 128-column tiles


def dw_tiles_module() -> ModuleType:
    return load_module("dw_tiles_prototype", REPO_ROOT / "benchmarks" / "_dw_tiles.py")


def check_against_reference(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch, device: torch.device
) -> None:
    """Loss, d hidden and d weight equal the reference's over several forward chunks, vocabulary tiles and row
    blocks, with ignored rows, a per-token upstream gradient and targets on tile edges."""
    monkeypatch.setattr(module, "ROW_BLOCK", 24)  # 40 valid rows: two blocks
    gen = torch.Generator().manual_seed(3)
    n, d, vocab = 48, 16, 384
    hidden = torch.randn(n, d, generator=gen).to(device).requires_grad_()
    weight = torch.randn(vocab, d, generator=gen).mul_(0.5).to(device).requires_grad_()
    labels = torch.randint(0, vocab, (n,), generator=gen)
    labels[torch.arange(0, n, 6)] = -100
    labels[[1, 2, 3, 4, 5]] = torch.tensor([0, 127, 128, 256, vocab - 1])  # the tiles' first and last columns
    labels = labels.to(device)
    upstream = torch.rand(n, generator=gen).to(device)
    chunk, tile = module._sizes(40, vocab, d, 4, int(BUDGET_MB * 2**20))
    assert (chunk, tile) == (12, 128)
    loss = module.dw_tiles_ce(hidden, weight, labels, budget_mb=BUDGET_MB)
    (loss * upstream).sum().backward()
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    want = reference_token_loss("ce", h @ w.T, labels)
    (want * upstream).sum().backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weight.grad, w.grad, rtol=1e-4, atol=1e-5)
