"""The Triton row kernel against the PyTorch closed forms and the autograd reference.

Runs wherever Triton is installed: on CPU through Triton's interpreter (``TRITON_INTERPRET=1``, small shapes; in
``make test`` that is ``.venv-axolotl``, whose Axolotl pins ship Triton), on a GPU compiled and at real shapes.
The kernel-selection rules (``DISTMATCH_KERNELS``) are checked in every venv.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import weakref

import pytest
import torch

from tests.helpers.env import REPO_ROOT
from trl_ext.losses import chunked as chunked_module
from trl_ext.losses import fused_token_loss, reference_token_loss, token_loss
from trl_ext.losses import plan as plan_module
from trl_ext.losses import row_backends as kernels_module
from trl_ext.losses.row_backends import KERNELS_ENV, TRITON_LOSSES, select_row_math
from trl_ext.losses.rows import chunk_math
from trl_ext.losses.settings import FusedSettings
from trl_ext.losses.spec import N_COEF

ON_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
CASES = [
    ("ce", {}),
    ("gem_linear", {"beta": 0.7}),
    ("gem_linear", {"beta": 1.0}),
    ("gem_ls", {"beta": 0.7}),
    ("gem_ls", {"beta": 0.3}),
    ("emo", {"weighting": "emo1"}),
    ("emo", {"weighting": "emo2"}),
    ("emo", {"weighting": "emo1", "ratio_clamp": 0.4}),  # the cap binds on most rows
    ("emo", {"weighting": "emo1", "target_mass": "included"}),  # e = DEMD (the EMO code's gpt2.py)
    ("emo", {"weighting": "emo2", "target_mass": "included"}),
]
CASE_IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in params.items())}" for name, params in CASES]


# ---- selection rules: no Triton needed -------------------------------------------------------------------------


def test_auto_uses_torch_off_cuda(monkeypatch):
    monkeypatch.delenv(KERNELS_ENV, raising=False)
    for name in TRITON_LOSSES:
        assert select_row_math(name, torch.device("cpu"), torch.float32) is chunk_math
    assert select_row_math("emo", torch.device("cpu"), torch.float32, "torch") is chunk_math


def test_auto_keeps_torch_for_losses_without_a_kernel_and_for_float64():
    for name in ("tailr", "mixce", "ce_entropy"):
        assert select_row_math(name, torch.device("cuda"), torch.float32) is chunk_math
    assert select_row_math("emo", torch.device("cuda"), torch.float64) is chunk_math


@pytest.mark.parametrize(
    ("env", "name", "dtype", "message"),
    [
        ("tritn", "emo", torch.float32, "is not one of auto, torch, triton"),
        ("triton", "tailr", torch.float32, "not 'tailr'"),
        ("triton", "emo", torch.float64, "computes in float32"),
    ],
)
def test_bad_kernel_requests_are_clear_errors(env, name, dtype, message):
    with pytest.raises(ValueError, match=message):
        select_row_math(name, torch.device("cpu"), dtype, env)


def test_forcing_triton_on_cpu_without_the_interpreter_is_an_error(monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs a CUDA device, or TRITON_INTERPRET=1"):
        fused_token_loss("gem_ls", torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 2]))


# ---- the kernel itself ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def triton_rows():
    """triton_rows with Triton's interpreter on when there is no GPU.

    Triton decides between compiling and interpreting when a kernel is defined, its own `tl.*` helpers included,
    so TRITON_INTERPRET must be set before Triton is first imported in the process.
    """
    with pytest.MonkeyPatch.context() as mp:
        if not ON_CUDA:
            already_imported = "triton" in sys.modules
            mp.setenv("TRITON_INTERPRET", "1")
        pytest.importorskip("triton", reason="Triton is not installed in this venv (it is in .venv-axolotl)")
        if not ON_CUDA and already_imported:
            from triton.language import standard
            from triton.runtime.interpreter import InterpretedFunction

            if not isinstance(standard.max, InterpretedFunction):
                pytest.fail(
                    "Triton was imported before TRITON_INTERPRET=1 was set; run these tests with "
                    "TRITON_INTERPRET=1 in the environment."
                )
        mp.setenv(KERNELS_ENV, "triton")
        yield importlib.import_module("trl_ext.losses.triton_rows")


def _chunk(n: int, vocab: int, scale: float, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, vocab, generator=gen) * scale).to(DEVICE)
    y = torch.randint(0, vocab, (n,), generator=gen).to(DEVICE)
    emb = torch.nn.functional.normalize(torch.randn(vocab, 8, generator=gen), dim=1).to(DEVICE)
    return z, y, emb[y] @ emb.T


def _raw_similarity(
    y: torch.Tensor, vocab: int, seed: int
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Dot products of an unnormalised embedding and the inverse norms (row, column) that make them cosines."""
    gen = torch.Generator().manual_seed(seed)
    emb = (torch.randn(vocab, 8, generator=gen) * torch.rand(vocab, 1, generator=gen).add_(0.2)).to(DEVICE)
    inv = emb.norm(dim=1).reciprocal()
    return emb[y] @ emb.T, (inv[y], inv)


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize(("vocab", "max_block"), [(50, 8192), (100, 32)], ids=["one-tile", "four-tiles"])
def test_kernel_equals_torch_closed_forms(triton_rows, monkeypatch, name, params, vocab, max_block):
    monkeypatch.setattr(triton_rows, "MAX_BLOCK", max_block)
    z, y, sim = _chunk(7, vocab, scale=3.0, seed=vocab)
    similarity, scales = (sim if name == "emo" else None), None
    # The four-tile EMO case takes the fused path's form: raw dot products, the kernel applies the norms.
    if name == "emo" and vocab == 100:
        similarity, scales = _raw_similarity(y, vocab, seed=vocab)
    expected = chunk_math(
        name,
        params,
        z.clone(),
        y,
        None if similarity is None else similarity.clone(),
        want_grad=True,
        want_stats=True,
        similarity_scales=scales,
    )
    got = triton_rows.triton_chunk_math(
        name, params, z.clone(), y, similarity, want_grad=True, want_stats=True, similarity_scales=scales
    )
    for key in ("loss", "grad", "ce", "entropy", "top1_correct", "demd"):
        want = getattr(expected, key)
        if want is None:
            assert getattr(got, key) is None, key
            continue
        torch.testing.assert_close(getattr(got, key), want, rtol=2e-5, atol=2e-6, msg=key)
    assert got.top1_correct.sum() >= 0 and torch.isfinite(got.grad).all()


@pytest.mark.filterwarnings(
    "ignore:overflow encountered in exp:RuntimeWarning"
)  # interpreter's sigmoid(-1e3)
@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_kernel_is_stable_for_peaked_rows(triton_rows, monkeypatch, name, params):
    """Logits of magnitude ~1e3 and a target holding almost all mass (p_y -> 1) vs the float64 closed forms."""
    monkeypatch.setattr(triton_rows, "MAX_BLOCK", 16)
    z, y, sim = _chunk(5, 40, scale=1.0, seed=3)
    z[torch.arange(5), y] += 40.0  # p_y = 1 - ~1e-16
    z[0] *= 300.0
    similarity = sim if name == "emo" else None
    got = triton_rows.triton_chunk_math(
        name, params, z.clone(), y, similarity, want_grad=True, want_stats=False
    )
    assert torch.isfinite(got.loss).all() and torch.isfinite(got.grad).all()
    torch_result = chunk_math(
        name,
        params,
        z.double(),
        y,
        None if similarity is None else similarity.double(),
        want_grad=True,
        want_stats=False,
    )
    # float32 vs float64: l = lse - z_y ~ 1e-16 is not representable in float32, which only emo2's detached
    # ratio e / l feels (its gradient stays small and finite).
    torch.testing.assert_close(got.loss.double(), torch_result.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.grad.double(), torch_result.grad, rtol=1e-5, atol=1e-5)


def _reference_problem(name: str, params: dict, seed: int, targets: list[int] | None = None):
    """10 rows (2 ignored), d 12, V 70 in float64; the reference's loss and gradients for a per-token upstream
    gradient (non-uniform: the fused path's d-weight recompute). `targets`: labels of rows 0, 2, 3."""
    gen = torch.Generator().manual_seed(seed)
    n, d, vocab = 10, 12, 70
    hidden = torch.randn(n, d, generator=gen, dtype=torch.float64).to(DEVICE)
    weight = torch.randn(vocab, d, generator=gen, dtype=torch.float64).to(DEVICE)
    labels = torch.randint(0, vocab, (n,), generator=gen).to(DEVICE)
    labels[[1, 6]] = -100
    if targets is not None:
        labels[[0, 2, 3]] = torch.tensor(targets, device=DEVICE)
    extra = {"cost_embedding": weight.detach().clone()} if name == "emo" else {}
    h64, w64 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    want = reference_token_loss(name, h64 @ w64.T, labels, **params, **extra)
    upstream = torch.linspace(0.5, 1.5, n, dtype=torch.float64, device=DEVICE)
    (want * upstream).sum().backward()
    return hidden, weight, labels, extra, want, (h64, w64), upstream


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_fused_and_chunked_paths_with_triton_equal_the_reference(triton_rows, monkeypatch, name, params):
    """Through the public API: values, gradients and statistics with DISTMATCH_KERNELS=triton vs the reference."""
    monkeypatch.setattr(triton_rows, "MAX_BLOCK", 32)
    hidden, weight, labels, extra, want, (h64, w64), upstream = _reference_problem(name, params, seed=11)
    n = hidden.shape[0]

    h32, w32 = hidden.float().requires_grad_(), weight.float().requires_grad_()
    extra32 = {k: v.float() for k, v in extra.items()}
    got, stats = fused_token_loss(
        name, h32, w32, labels, chunk_size=4, return_stats=True, **params, **extra32
    )
    (got * upstream.float()).sum().backward()
    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(h32.grad.double(), h64.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w32.grad.double(), w64.grad, rtol=1e-4, atol=1e-5)
    assert stats.ce[[1, 6]].abs().sum() == 0 and (stats.ce > 0).sum() == n - 2

    logits = (hidden.float() @ weight.float().T).requires_grad_()
    from_logits = token_loss(name, logits, labels, chunk_size=3, **params, **extra32)
    (from_logits * upstream.float()).sum().backward()
    torch.testing.assert_close(from_logits.double(), want.detach(), rtol=1e-4, atol=1e-5)
    assert logits.grad is not None and logits.grad[[1, 6]].abs().sum() == 0


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_tiles_weight_gradient_equals_the_reference(triton_rows, monkeypatch, name, params):
    """DISTMATCH_GRAD_WEIGHT_ACCUM=tiles: the forward stores each row's gradient coefficients instead of adding to d
    weight, the backward recomputes the logits by [row block, vocabulary tile] (here 2-4 blocks, 6 tiles) and runs
    the kernel's gradient pass alone on each tile: the loss and both gradients equal the reference's, for a
    per-token upstream gradient, with ignored rows, and again in a second backward."""
    monkeypatch.setattr(triton_rows, "MAX_BLOCK", 8)
    monkeypatch.setenv(chunked_module.GRAD_WEIGHT_ACCUM_ENV, "tiles")
    monkeypatch.setenv(chunked_module.CHUNK_MEMORY_ENV, str(400 / 2**20))
    # targets on the first tile's first column, a tile edge and the last column
    hidden, weight, labels, extra, want, (h64, w64), upstream = _reference_problem(
        name, params, 5, [0, 13, 69]
    )
    d, vocab = weight.shape[1], weight.shape[0]
    h32, w32 = hidden.float().requires_grad_(), weight.float().requires_grad_()
    extra32 = {k: v.float() for k, v in extra.items()}
    got = fused_token_loss(name, h32, w32, labels, chunk_size=4, **params, **extra32)
    settings = FusedSettings.from_env()  # the test's tiles and budget
    plan = plan_module.make_plan(name, {**params, **extra32}, vocab, h32, 4, False, settings=settings)
    rows_per_block, tile = plan.tile_shape(8, d, vocab, DEVICE)
    # 8 valid rows in blocks of 4 (EMO: 2, its blocks also hold their rows of the cost embedding), 6 tiles
    assert (rows_per_block, tile) == (2 if name == "emo" else 4, 13)
    grads = torch.autograd.grad(got, (h32, w32), upstream.float(), retain_graph=True)
    again = torch.autograd.grad(got, (h32, w32), upstream.float())
    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-4, atol=1e-5)
    for g, g2, exact in zip(grads, again, (h64.grad, w64.grad)):
        torch.testing.assert_close(g.double(), exact, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(g2, g)


@pytest.mark.parametrize("name", ["ce", "emo"])
def test_tiles_keep_no_weight_gradient_in_the_forward_and_one_tile_at_a_time(triton_rows, monkeypatch, name):
    """The memory `tiles` saves, counted on a CPU: the forward holds no d-weight buffer, only [valid rows, N_COEF]
    float32 coefficients, and the backward's tiles (logits, EMO's similarities) are released before the next
    tile's gradient pass (two alive at once would double the block's memory)."""
    monkeypatch.setenv(chunked_module.GRAD_WEIGHT_ACCUM_ENV, "tiles")
    monkeypatch.setenv(chunked_module.CHUNK_MEMORY_ENV, str(400 / 2**20))
    # the once-per-process self-check of the tiles pass first: its own calls are not the backward's tiles (this
    # test alone, or first in its process, would count them)
    kernels_module.check_tile_kernel(torch.device(DEVICE), torch.float32)
    alive_at_next_tile, previous = [], []
    original = triton_rows.triton_tile_gradient

    def spy(name_, params, z, y, coef, scale, col0, **kwargs):
        alive_at_next_tile.extend(ref() is not None for ref in previous)
        out = original(name_, params, z, y, coef, scale, col0, **kwargs)
        previous[:] = [weakref.ref(t) for t in (z, kwargs.get("similarity")) if t is not None]
        return out

    monkeypatch.setattr(triton_rows, "triton_tile_gradient", spy)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 12, generator=gen).to(DEVICE).requires_grad_()
    weight = torch.randn(70, 12, generator=gen).to(DEVICE).requires_grad_()
    labels = torch.tensor([3, -100, 5, 69, 0, 13, -100, 40, 41, 2], device=DEVICE)
    extra = {"cost_embedding": weight.detach().clone()} if name == "emo" else {}
    loss = fused_token_loss(name, hidden, weight, labels, chunk_size=4, **extra)
    node = loss.grad_fn
    assert node.weight_gradient.unit is None and node.weight_gradient.coefficients.shape == (8, N_COEF)
    assert node.weight_gradient.coefficients.dtype == torch.float32
    loss.sum().backward()
    assert len(alive_at_next_tile) >= 6 and not any(alive_at_next_tile)  # 6 tiles x 2 or 4 row blocks
    assert weight.grad is not None and weight.grad.abs().sum() > 0


@pytest.mark.parametrize("fault", [None, "column_offset", "scale_ignored", "emo_similarity"])
def test_tiles_self_check_runs_before_the_first_tiles_backward(triton_rows, monkeypatch, fault):
    """The first `tiles` backward per (device, dtype) checks the gradient pass over tiles against the full pass,
    for every case of the kernel's self-check; a fault there (the target's -1 in the tile's own columns; the
    per-row scale dropped; EMO's tile similarities 1 % off, which no other loss reads) stops it in one error naming
    the way out, and nothing is marked checked."""
    original = triton_rows.triton_tile_gradient

    def faulty(name, params, z, y, coef, scale, col0, **kwargs):
        if fault == "scale_ignored":
            scale = torch.ones_like(scale)
        if fault == "emo_similarity" and kwargs.get("similarity") is not None:
            kwargs["similarity"] = kwargs["similarity"] * 1.01
        return original(name, params, z, y, coef, scale, 0 if fault == "column_offset" else col0, **kwargs)

    monkeypatch.setattr(triton_rows, "triton_tile_gradient", faulty)
    monkeypatch.setattr(kernels_module, "_TILE_CHECKED", set())
    monkeypatch.setenv(chunked_module.GRAD_WEIGHT_ACCUM_ENV, "tiles")
    hidden = torch.randn(4, 6, device=DEVICE)
    weight = torch.randn(40, 6, device=DEVICE, requires_grad=True)
    loss = fused_token_loss("ce", hidden, weight, torch.tensor([0, 1, 2, 39], device=DEVICE))
    if fault is None:
        loss.sum().backward()
        assert kernels_module._TILE_CHECKED == {(DEVICE.type, torch.float32)}
        return
    with pytest.raises(
        kernels_module.KernelSelfCheckError,
        match=r"`loss_grad_weight_accum: tiles` \(DISTMATCH_GRAD_WEIGHT_ACCUM=tiles\) cannot be used",
    ) as err:
        loss.sum().backward()
    assert fault != "emo_similarity" or "(emo " in str(err.value)
    assert kernels_module._TILE_CHECKED == set()


@pytest.mark.parametrize("accum", ["float32", "tiles"])
@pytest.mark.parametrize("name", TRITON_LOSSES)
def test_input_dtype_chunk_logits_stay_within_bf16_roundings(triton_rows, monkeypatch, name, accum):
    """DISTMATCH_CHUNK_LOGITS=input: the kernel gets bf16 chunks (and writes bf16 gradients over them); the loss
    and both gradients stay within a few bf16 roundings of float64, for a uniform and a per-token upstream
    gradient, and a second backward (the forward's buffers consumed) recomputes the same gradients. With
    DISTMATCH_GRAD_WEIGHT_ACCUM=tiles too (bf16 tiles of logits, bf16 d weight)."""
    monkeypatch.setattr(triton_rows, "MAX_BLOCK", 32)
    monkeypatch.setenv(chunked_module.GRAD_WEIGHT_ACCUM_ENV, accum)
    seen = []

    def spy(name_, params, z, *args, **kwargs):
        seen.append(z.dtype)
        return triton_rows.triton_chunk_math(name_, params, z, *args, **kwargs)

    monkeypatch.setattr(kernels_module, "_triton_row_math", lambda: spy)
    monkeypatch.setattr(
        kernels_module, "_CHECKED", {(DEVICE.type, torch.float32), (DEVICE.type, torch.bfloat16)}
    )
    monkeypatch.setenv("DISTMATCH_CHUNK_LOGITS", "input")
    gen = torch.Generator().manual_seed(3)
    n, d, vocab = 16, 16, 100
    hidden = torch.randn(n, d, generator=gen).to(DEVICE, torch.bfloat16)
    weight = (torch.randn(vocab, d, generator=gen) * 0.3).to(DEVICE, torch.bfloat16)
    labels = torch.randint(0, vocab, (n,), generator=gen).to(DEVICE)
    labels[[2, 9]] = -100
    extra = {"cost_embedding": weight.clone()} if name == "emo" else {}
    for upstream in (torch.full((n,), 0.05), torch.linspace(0.1, 1.0, n)):
        upstream = upstream.to(DEVICE)
        h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
        want = reference_token_loss(name, h64 @ w64.T, labels, **{k: v.double() for k, v in extra.items()})
        (want * upstream).sum().backward()
        h16, w16 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        seen.clear()
        got = fused_token_loss(name, h16, w16, labels, chunk_size=5, **extra)
        grads = torch.autograd.grad(got, (h16, w16), upstream, retain_graph=True)
        assert seen and set(seen) == {torch.bfloat16}
        again = torch.autograd.grad(got, (h16, w16), upstream)
        for g, g2, exact in zip(grads, again, (h64.grad, w64.grad)):
            assert g.dtype == torch.bfloat16
            floor = float((exact.bfloat16().double() - exact).norm() / exact.norm())
            for value in (g, g2):
                assert float((value.double() - exact).norm() / exact.norm()) <= 4 * floor
        torch.testing.assert_close(got.double(), want.detach(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("chunk_logits", ["float32", "input"])
def test_the_16_bit_weight_gradient_is_rescaled_by_the_exact_upstream_gradient(
    triton_rows, monkeypatch, chunk_logits
):
    """A bf16 d-weight accumulator times the uniform upstream gradient 1/n: rounded once, without a bias. On CUDA a
    0-dim CUDA tensor as the factor was itself rounded to bf16 first (bf16(1/7393) x 7393 = 1.00117: every entry
    0.12 % too large, d weight's error 2.44e-3 against Liger's 2.09e-3 on the H200). On a CPU torch keeps a 0-dim
    CPU factor in float32, so this catches the bias only where it exists, on a GPU."""
    monkeypatch.setattr(triton_rows, "MAX_BLOCK", 32)
    monkeypatch.setenv("DISTMATCH_GRAD_WEIGHT_ACCUM", "weight")
    monkeypatch.setenv("DISTMATCH_CHUNK_LOGITS", chunk_logits)
    gen = torch.Generator().manual_seed(5)
    n, d, vocab, items = 24, 32, 64, 7393
    hidden = torch.randn(n, d, generator=gen).to(DEVICE, torch.bfloat16)
    weight = (torch.randn(vocab, d, generator=gen) * 0.3).to(DEVICE, torch.bfloat16)
    labels = torch.randint(0, vocab, (n,), generator=gen).to(DEVICE)
    grads = []
    for scale in (1.0, 1.0 / items):
        w = weight.clone().requires_grad_()
        (fused_token_loss("ce", hidden, w, labels, chunk_size=7).sum() * scale).backward()
        grads.append(w.grad.double())
    unit, scaled = grads
    assert unit.dtype == torch.float64 and bool((unit != 0).any())
    nonzero = unit.abs() > 1e-6
    ratio = scaled[nonzero] * items / unit[nonzero]
    # bf16 rounding: unbiased on average, each ratio within 2^-8
    assert abs(float(ratio.mean()) - 1.0) < 3e-4, float(ratio.mean())
    assert float((ratio - 1).abs().max()) <= 2**-8


def test_input_dtype_chunks_hold_twice_the_rows_and_the_kernel_is_checked_on_them(triton_rows, monkeypatch):
    """DISTMATCH_CHUNK_LOGITS=input: the automatic chunk counts 2-byte logits (the same budget holds twice the
    rows), and the first use checks the kernel on a 16-bit chunk (its own self-check, not only float32's)."""
    rows, checked = [], []
    original = kernels_module.check_kernel

    def spy(name_, params, z, *args, **kwargs):
        rows.append((z.dtype, *z.shape))
        return triton_rows.triton_chunk_math(name_, params, z, *args, **kwargs)

    def check_spy(row_math, device, dtype):
        checked.append(dtype)
        return original(row_math, device, dtype)

    monkeypatch.setattr(kernels_module, "_triton_row_math", lambda: spy)
    monkeypatch.setattr(kernels_module, "check_kernel", check_spy)
    monkeypatch.setattr(plan_module, "check_kernel", check_spy)
    monkeypatch.setattr(kernels_module, "_CHECKED", {(DEVICE.type, torch.float32)})
    vocab = 64
    monkeypatch.setenv("DISTMATCH_CHUNK_MEMORY_MB", str(4 * vocab * 4 / 2**20))  # 4 float32 rows of logits
    hidden = torch.randn(16, 8).to(DEVICE, torch.bfloat16)
    weight = torch.randn(vocab, 8).to(DEVICE, torch.bfloat16)
    labels = torch.arange(16, device=DEVICE)
    sizes = {}
    for mode in ("float32", "input"):
        monkeypatch.setenv("DISTMATCH_CHUNK_LOGITS", mode)
        rows.clear()
        fused_token_loss("ce", hidden, weight, labels)
        want = torch.float32 if mode == "float32" else torch.bfloat16
        sizes[mode] = {n for dtype, n, v in rows if dtype == want and v == vocab}  # not the self-check's rows
    assert sizes == {"float32": {4}, "input": {8}}
    assert torch.bfloat16 in checked and (DEVICE.type, torch.bfloat16) in kernels_module._CHECKED


def test_forced_triton_really_runs_the_kernel(triton_rows, monkeypatch):
    calls = []
    original = triton_rows.triton_chunk_math

    def spy(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(triton_rows, "triton_chunk_math", spy)
    monkeypatch.setattr(kernels_module, "_triton_row_math", lambda: spy)
    monkeypatch.setattr(kernels_module, "_CHECKED", {(DEVICE.type, torch.float32)})  # self-check already done
    fused_token_loss(
        "gem_ls",
        torch.randn(4, 6, device=DEVICE),
        torch.randn(9, 6, device=DEVICE),
        torch.tensor([0, 1, -100, 8], device=DEVICE),
        beta=0.7,
    )
    assert calls == ["gem_ls"]


def test_first_use_self_check_runs_once_and_passes(triton_rows, monkeypatch):
    calls = []
    original = triton_rows.triton_chunk_math

    def spy(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels_module, "_triton_row_math", lambda: spy)
    monkeypatch.setattr(kernels_module, "_CHECKED", set())
    args = (
        torch.randn(4, 6, device=DEVICE),
        torch.randn(9, 6, device=DEVICE),
        torch.tensor([0, 1, -100, 8], device=DEVICE),
    )
    fused_token_loss("gem_ls", *args, beta=0.7)
    checked = [name for name, _ in kernels_module.SELF_CHECK_CASES]
    assert calls == [*checked, "gem_ls"]  # the check first, then the real chunk
    fused_token_loss("gem_ls", *args, beta=0.7)
    assert calls == [*checked, "gem_ls", "gem_ls"]  # once per process
    assert kernels_module._CHECKED == {(DEVICE.type, torch.float32)}


@pytest.mark.parametrize("name", ["gem_ls", "emo"])
def test_first_use_self_check_passes_inside_the_trainers_bf16_autocast(triton_rows, monkeypatch, name):
    """`trl sft --bf16` selects the kernel inside autocast; the check's closed forms must not run in bf16 there
    (found on an H200: every --loss run stopped with 'entropy: max |diff| 0.0129')."""
    monkeypatch.setattr(kernels_module, "_CHECKED", set())
    hidden, weight = torch.randn(4, 6, device=DEVICE), torch.randn(9, 6, device=DEVICE)
    extra = {"cost_embedding": weight.detach().clone()} if name == "emo" else {}
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        loss = fused_token_loss(name, hidden, weight, torch.tensor([0, 1, -100, 8], device=DEVICE), **extra)
    assert torch.isfinite(loss).all()
    assert kernels_module._CHECKED == {(DEVICE.type, torch.float32)}


@pytest.mark.parametrize("fault", ["grad_column", "scales_ignored"])
def test_first_use_self_check_stops_a_faulty_kernel(triton_rows, monkeypatch, fault):
    """An injected fault behind the real kernel (EMO's gradient off by 1e-3 in one column; or the similarity's
    inverse norms not applied, which a check on unit-norm embeddings could not see): stopped, with the fix."""
    original = triton_rows.triton_chunk_math

    def faulty(name, params, z, y, similarity, **kwargs):
        if fault == "scales_ignored":
            kwargs.pop("similarity_scales", None)
        result = original(name, params, z, y, similarity, **kwargs)
        if fault == "grad_column" and name == "emo" and result.grad is not None:
            result.grad[:, 3] += 1e-3
        return result

    monkeypatch.setattr(kernels_module, "_triton_row_math", lambda: faulty)
    monkeypatch.setattr(kernels_module, "_CHECKED", set())
    hidden, weight = torch.randn(4, 6, device=DEVICE), torch.randn(9, 6, device=DEVICE)
    with pytest.raises(kernels_module.KernelSelfCheckError) as err:
        fused_token_loss("gem_ls", hidden, weight, torch.tensor([0, 1, 2, 8], device=DEVICE), beta=0.7)
    assert f"{KERNELS_ENV}=torch" in str(err.value) and "emo" in str(err.value)
    assert "grad" in str(err.value) or fault == "scales_ignored"
    assert kernels_module._CHECKED == set()  # not marked as checked: every later use stops too
    monkeypatch.setenv(KERNELS_ENV, "torch")  # the way out the message gives
    assert torch.isfinite(
        fused_token_loss("gem_ls", hidden, weight, torch.tensor([0, 1, 2, 8], device=DEVICE), beta=0.7)
    ).all()


@pytest.mark.parametrize("chunk", ["fp32", "bf16"])  # two halves, one per worker
def test_kernel_compiles_for_an_h100_without_a_gpu(tmp_path, chunk):
    """Triton's real compiler (not the interpreter) down to PTX/cubin for sm_90, every launchable variant."""
    pytest.importorskip("triton", reason="Triton is not installed in this venv (it is in .venv-axolotl)")
    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this Triton build has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton_cache")  # compile for real, not from an earlier cache
    script = REPO_ROOT / "tests" / "helpers" / "triton_compile_check.py"
    out = subprocess.run(
        [sys.executable, str(script), "90", chunk], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # 5 loss variants (emo: emo1 and emo2) x 7 modes: 4 of a chunk, 2 storing the coefficients, 1 tile gradient
    assert "35 variants compiled for sm_90" in out.stdout and f"compiled {chunk} " in out.stdout


@pytest.mark.skipif(not ON_CUDA, reason="real shapes in bf16 need a GPU")
@pytest.mark.parametrize("name", TRITON_LOSSES)
def test_bf16_fused_on_gpu_matches_float32_reference(triton_rows, name):
    """Llama-3-like vocabulary in bf16 (16-bit matmuls, fp32 statistics) vs the fp32 torch path."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, d, vocab = 512, 1024, 128256
    hidden = torch.randn(n, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    weight = (torch.randn(vocab, d, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (n,), device="cuda", generator=gen)
    extra = {"cost_embedding": weight.clone()} if name == "emo" else {}
    h16, w16 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    got = fused_token_loss(name, h16, w16, labels, **extra)
    got.mean().backward()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KERNELS_ENV, "torch")
        h32, w32 = hidden.float().requires_grad_(), weight.float().requires_grad_()
        want = fused_token_loss(name, h32, w32, labels, **{k: v.float() for k, v in extra.items()})
        want.mean().backward()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(h16.grad.float(), h32.grad, rtol=5e-2, atol=1e-4)
    torch.testing.assert_close(w16.grad.float(), w32.grad, rtol=5e-2, atol=1e-4)
