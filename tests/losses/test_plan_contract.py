"""trl_ext.losses.plan against its documented contract (the module's docstrings, docs/losses.md "Memory-efficient
paths", rows.py's memory model): the chunk budget (the settings given, 128 MiB on a CPU and 512 on CUDA), the rows
per chunk that let the closed forms' [rows, V] temporaries fit it (three, EMO four, two more for the reference
model's logits and softmax), the validation make_plan runs (chunk size, reference model, kernels, chunk logits) and
the fields of its plan, the statistics buffers, the products in each dtype configuration of the plan (the CUDA
ones on meta tensors: mixed-dtype `mm` has no CPU kernel) and the `tiles` backward's block shape within the
budget."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trl_ext.losses import FusedSettings, fused_token_loss, reference_token_loss, token_loss
from trl_ext.losses.plan import auto_chunk_size, make_plan
from trl_ext.losses.registry import LOSSES
from trl_ext.losses.settings import ENV
from trl_ext.losses.spec import BASE_STATS

MIB = 2**20
V = 64
CUDA, CPU, META = torch.device("cuda"), torch.device("cpu"), torch.device("meta")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for variable in (*ENV.values(), "TRITON_INTERPRET"):
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


def _rows(n: int = 7, dtype: torch.dtype = torch.float64, width: int = 5, seed: int = 0):
    """hidden [n, width], head [V, width], labels [n] with two ignored rows."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, width, generator=g, dtype=torch.float64).to(dtype)
    weight = torch.randn(V, width, generator=g, dtype=torch.float64).to(dtype)
    labels = torch.randint(0, V, (n,), generator=g)
    labels[[1, n - 2]] = -100
    return hidden, weight, labels


def _params(name: str, weight: torch.Tensor) -> dict:
    return {"cost_embedding": weight.detach().double()} if LOSSES[name].needs_cost_embedding else {}


def _plan(name: str = "ce", inputs: torch.Tensor | None = None, **kwargs):
    inputs = _rows()[0] if inputs is None else inputs
    weight = torch.randn(V, inputs.shape[1], dtype=inputs.dtype)
    reference = None
    if LOSSES[name].needs_reference:
        reference = {"reference_logits": torch.randn(inputs.shape[0], V, dtype=inputs.dtype)}
    kwargs.setdefault("chunk_size", 4)
    kwargs.setdefault("want_stats", False)
    return make_plan(name, _params(name, weight), V, inputs, reference=reference, **kwargs)


# --- auto_chunk_size: "`buffers` [rows, V] temporaries fit the chunk budget (settings.chunk_memory_mb; without
# settings the environment's, else 128 MiB, 512 MiB on CUDA)" ---------------------------------------------------


def test_auto_chunk_size_takes_the_settings_given_not_the_environments(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv(ENV["chunk_memory_mb"], "2")
    row = 1024 * 4 * 2
    assert auto_chunk_size(1024, torch.float32, 2, CPU, FusedSettings(chunk_memory_mb=1)) == MIB // row
    assert auto_chunk_size(1024, torch.float32, 2, CPU) == 2 * MIB // row


@pytest.mark.parametrize(("device", "mib"), [(CPU, 128), (None, 128), (CUDA, 512)])
def test_auto_chunk_size_default_budget_per_device(device: torch.device | None, mib: int) -> None:
    # a torch.device names the device type without needing one: the budget is chosen by that type alone
    got = auto_chunk_size(1000, torch.float32, 3, device, FusedSettings())
    assert got == mib * MIB // (1000 * 4 * 3)


# --- make_plan: the rows per chunk when chunk_size is None ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "buffers"),
    # rows.py: "a chunk costs about three (EMO: four) rows x V temporaries"; the anchored losses add the reference
    # model's logits and its softmax
    [("ce", 3), ("gem_ls", 3), ("tailr", 3), ("emo", 4), ("asft", 5), ("sft_kl", 5)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fused", [False, True])
def test_automatic_chunks_fit_the_closed_forms_temporaries_in_the_budget(
    clean_env: pytest.MonkeyPatch, name: str, buffers: int, dtype: torch.dtype, fused: bool
) -> None:
    clean_env.setenv(ENV["chunk_memory_mb"], "3")  # never read: the settings are given
    inputs = _rows(dtype=dtype)[0]
    plan = _plan(name, inputs, chunk_size=None, settings=FusedSettings(chunk_memory_mb=1), fused=fused)
    # the compute dtype's elements: the closed forms' buffers are float32 (float64 for float64 inputs)
    element = 8 if dtype == torch.float64 else 4
    assert plan.chunk_size == MIB // (V * element * buffers)


def test_automatic_chunks_on_a_cpu_take_its_default_budget() -> None:
    plan = _plan("emo", _rows(dtype=torch.float32)[0], chunk_size=None, settings=FusedSettings())
    assert plan.chunk_size == 128 * MIB // (V * 4 * 4)


def test_a_given_chunk_size_is_kept() -> None:
    assert _plan("emo", chunk_size=3, settings=FusedSettings(chunk_memory_mb=1)).chunk_size == 3


@pytest.mark.parametrize("chunk_size", [0, -2, 2.5, True, "4"])
def test_a_bad_chunk_size_is_refused(chunk_size: object) -> None:
    hidden, weight, labels = _rows()
    with pytest.raises(ValueError, match=r"^chunk_size must be a positive int or None \(automatic\), got "):
        token_loss("ce", hidden @ weight.T, labels, chunk_size=chunk_size)
    with pytest.raises(ValueError, match=r"^chunk_size must be a positive int or None"):
        fused_token_loss("ce", hidden, weight, labels, chunk_size=chunk_size)


# --- make_plan: the reference model, the kernels, the chunk logits and the d-weight mode --------------------------


def test_a_reference_given_to_a_loss_without_one_names_the_loss() -> None:
    hidden, weight, labels = _rows()
    logits = hidden @ weight.T
    with pytest.raises(ValueError, match=r"loss 'gem_ls' takes no reference model\.$"):
        token_loss("gem_ls", logits, labels, reference_logits=logits)
    with pytest.raises(
        ValueError, match=r"^Loss 'sft_kl' needs the frozen reference model's reference_hidden"
    ):
        fused_token_loss("sft_kl", hidden, weight, labels)


def test_triton_kernels_on_a_cpu_without_the_interpreter_are_refused() -> None:
    hidden, weight, labels = _rows(dtype=torch.float32)
    triton = FusedSettings(kernels="triton")
    with pytest.raises(
        ValueError, match=r"^loss_kernels='triton' needs a CUDA device, or TRITON_INTERPRET=1"
    ):
        token_loss("ce", hidden @ weight.T, labels, settings=triton)
    with pytest.raises(ValueError, match=r"^loss_kernels='triton' needs a CUDA device"):
        fused_token_loss("gem_ls", hidden, weight, labels, settings=triton)


def test_triton_kernels_refuse_a_loss_they_do_not_implement_by_name() -> None:
    hidden, weight, labels = _rows(dtype=torch.float32)
    with pytest.raises(
        ValueError, match=r"^loss_kernels='triton': the Triton kernels implement .*, not 'tailr'; "
    ):
        token_loss("tailr", hidden @ weight.T, labels, settings=FusedSettings(kernels="triton"))


def test_triton_kernels_refuse_float64_inputs() -> None:
    hidden, weight, labels = _rows(dtype=torch.float64)
    with pytest.raises(ValueError, match=r"computes in float32; torch\.float64 inputs need 'torch'\.$"):
        token_loss("ce", hidden @ weight.T, labels, settings=FusedSettings(kernels="triton"))


def test_input_dtype_chunk_logits_with_the_closed_forms_are_refused_with_the_way_out() -> None:
    hidden, weight, labels = _rows(dtype=torch.bfloat16)
    with pytest.raises(
        ValueError, match=r"^chunk_logits='input' .* needs the Triton row kernel .*; set it to 'float32'\.$"
    ):
        fused_token_loss("ce", hidden, weight, labels, settings=FusedSettings(chunk_logits="input"))


@pytest.mark.parametrize("accum", ["float32", "weight", "tiles"])
def test_the_logits_path_ignores_the_d_weight_mode(accum: str) -> None:
    # docs/losses.md: "the logits path, which has no d weight, ignores it"; the plan's field: "float32" there
    plan = _plan("ce", settings=FusedSettings(grad_weight_accum=accum))
    assert plan.grad_weight_mode == "float32"


def test_the_fused_plan_keeps_the_settings_d_weight_mode() -> None:
    assert (
        _plan("ce", settings=FusedSettings(grad_weight_accum="weight"), fused=True).grad_weight_mode
        == "weight"
    )


@pytest.mark.parametrize(
    ("dtype", "compute"),
    [(torch.bfloat16, torch.float32), (torch.float32, torch.float32), (torch.float64, torch.float64)],
)
@pytest.mark.parametrize("fused", [False, True])
def test_the_plan_computes_in_the_compute_dtype_with_the_settings_given(
    dtype: torch.dtype, compute: torch.dtype, fused: bool
) -> None:
    settings = FusedSettings(chunk_memory_mb=7)
    plan = _plan("emo", _rows(dtype=dtype)[0], want_stats=True, settings=settings, fused=fused)
    assert plan.cdtype == compute and plan.logits_dtype == compute and plan.matmul_dtype == compute
    assert plan.settings is settings and plan.want_stats is True
    assert plan.stat_keys == (*BASE_STATS, "demd")


# --- statistics: return_stats gives the reference's per-token statistics, in the compute dtype --------------------


@pytest.mark.parametrize("name", ["ce", "emo", "asft"])
@pytest.mark.parametrize("fused", [False, True])
def test_return_stats_match_the_reference_implementation(name: str, fused: bool) -> None:
    hidden, weight, labels = _rows(n=9)
    params = _params(name, weight)
    ref_hidden = torch.randn(9, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ref_weight = torch.randn(V, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    anchored = LOSSES[name].needs_reference
    logits_ref = {"reference_logits": ref_hidden @ ref_weight.T} if anchored else {}
    if fused:
        fused_ref = {"reference_hidden": ref_hidden, "reference_weight": ref_weight} if anchored else {}
        loss, stats = fused_token_loss(
            name, hidden, weight, labels, chunk_size=3, return_stats=True, **fused_ref, **params
        )
    else:
        loss, stats = token_loss(
            name, hidden @ weight.T, labels, chunk_size=3, return_stats=True, **logits_ref, **params
        )
    want_loss, want = reference_token_loss(
        name, hidden @ weight.T, labels, return_stats=True, **logits_ref, **params
    )
    torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=1e-12)
    keys = (*BASE_STATS, *LOSSES[name].stats)
    for key in ("ce", "entropy", "top1_correct", "demd", "kl"):
        got, expected = getattr(stats, key), getattr(want, key)
        if key not in keys:
            assert got is None
            continue
        assert got.dtype == torch.float64 and got.shape == (9,)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
        assert bool((got[labels == -100] == 0).all())


@pytest.mark.parametrize("name", ["asft", "sft_kl"])
def test_16_bit_reference_logits_are_read_in_the_compute_dtype(name: str) -> None:
    # the reference model's chunk is "a fresh compute-dtype chunk": bf16 logits of both models give the float32
    # reference implementation's loss (which reads both in float32) to float32 rounding, not to bf16's
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(9, V, generator=g) * 3).to(torch.bfloat16)
    reference = (torch.randn(9, V, generator=g) * 3).to(torch.bfloat16)
    labels = torch.randint(0, V, (9,), generator=g)
    labels[2] = -100
    got = token_loss(name, logits, labels, reference_logits=reference, chunk_size=4)
    want = reference_token_loss(name, logits, labels, reference_logits=reference)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_new_stats_are_zeroed_buffers_on_the_device_asked_for() -> None:
    plan = _plan("asft", want_stats=True)
    stats = plan.new_stats(5, META)
    assert tuple(stats) == (*BASE_STATS, "kl")
    for buf in stats.values():
        assert buf.device == META and buf.dtype == torch.float64 and buf.shape == (5,)
    on_cpu = plan.new_stats(4, CPU)
    assert all(bool((buf == 0).all()) and buf.shape == (4,) for buf in on_cpu.values())
    assert _plan("asft", want_stats=False).new_stats(5, CPU) == {}


# --- the products: "a @ b (operands in matmul_dtype) with a float32 (compute-dtype) result"; "h @ w^T in
# logits_dtype: a float32 product, rounded once when the logits are kept in a 16-bit dtype" -----------------------


def _dtypes(matmul: torch.dtype, logits: torch.dtype):
    """A real float32 plan in another dtype configuration (the CUDA ones: 16-bit operands and/or chunk logits)."""
    return dataclasses.replace(
        _plan("ce", _rows(dtype=torch.float32)[0]), matmul_dtype=matmul, logits_dtype=logits
    )


def _bf16_product(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (h.double() @ w.double().T).to(torch.bfloat16)


def test_float32_products_rounded_once_to_16_bit_chunk_logits() -> None:
    hidden, weight, _ = _rows(n=6, dtype=torch.float32, width=40)
    plan = _dtypes(torch.float32, torch.bfloat16)
    got = plan.logits(hidden, weight)
    assert got.dtype == torch.bfloat16 and got.shape == (6, V)
    torch.testing.assert_close(got, _bf16_product(hidden, weight), rtol=2**-8, atol=1e-6)


def test_16_bit_operands_give_16_bit_chunk_logits() -> None:
    hidden, weight, _ = _rows(n=6, dtype=torch.bfloat16, width=40)
    got = _dtypes(torch.bfloat16, torch.bfloat16).logits(hidden, weight)
    assert got.dtype == torch.bfloat16 and got.shape == (6, V)
    torch.testing.assert_close(got, _bf16_product(hidden, weight), rtol=2**-8, atol=1e-6)


def test_float32_chunk_logits_keep_the_float32_product() -> None:
    hidden, weight, _ = _rows(n=6, dtype=torch.float32, width=40)
    got = _plan("ce", hidden).logits(hidden, weight)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, (hidden.double() @ weight.double().T).float(), rtol=1e-5, atol=1e-5)


def test_16_bit_operands_give_float32_products() -> None:
    # mixed-dtype `mm` (16-bit operands, float32 result) exists on CUDA only: its dtypes and shapes checked on meta
    plan = _dtypes(torch.bfloat16, torch.float32)
    a = torch.empty(5, 8, dtype=torch.bfloat16, device=META)
    b = torch.empty(8, 3, dtype=torch.bfloat16, device=META)
    product = plan.mm(a, b)
    assert product.dtype == torch.float32 and product.shape == (5, 3) and product.device == META
    out = torch.empty(5, 3, dtype=torch.float32, device=META)
    assert plan.mm(a, b, out=out) is out
    logits = plan.logits(a, torch.empty(V, 8, dtype=torch.bfloat16, device=META))
    assert logits.dtype == torch.float32 and logits.shape == (5, V)


def test_a_product_written_into_out() -> None:
    hidden, weight, _ = _rows(n=6, dtype=torch.float64, width=4)
    out = torch.zeros(6, V, dtype=torch.float64)
    assert _plan("ce", hidden).mm(hidden, weight.T, out=out) is out
    torch.testing.assert_close(out, hidden @ weight.T)


# --- tile_shape: a row block's rows of h (EMO: and of the cost embedding) in half the budget at most, its
# [rows, tile] logits block (EMO: and the float32 similarity; logits not in the matmul dtype: their copy in it) in the
# rest; the tile a multiple of 128 that no wider one would fit (docs/losses.md, `tiles`) ----------------------------


def _check_tiles(plan, n: int, width: int, vocab: int, device: torch.device, budget: int) -> tuple[int, int]:
    rows, tile = plan.tile_shape(n, width, vocab, device)
    assert type(rows) is int and type(tile) is int  # counts: a range's step and a slice's width
    emo = plan.cost_embedding is not None
    per_row = width * plan.matmul_dtype.itemsize * (2 if emo else 1)
    per_cell = plan.logits_dtype.itemsize + (4 if emo else 0)
    per_cell += plan.matmul_dtype.itemsize if plan.logits_dtype != plan.matmul_dtype else 0
    assert 1 <= rows <= n and 1 <= tile <= vocab
    assert rows == 1 or rows * per_row <= budget // 2
    assert rows == n or (rows + 1) * per_row > budget // 2  # no more rows would fit

    def fits(columns: int) -> bool:
        return rows * per_row + rows * columns * per_cell <= budget

    assert tile == 1 or fits(tile)
    if tile < vocab:
        assert not fits(tile + 128) if tile >= 128 else not fits(tile + 1)
    if 128 <= tile < vocab:
        assert tile % 128 == 0
    return rows, tile


@pytest.mark.parametrize("name", ["ce", "emo"])
@pytest.mark.parametrize(
    ("n", "width", "vocab", "mib"),
    [
        (100_000, 3, 50_000, 1),
        (7, 3, 50_000, 1),
        (1, 64, 1000, 1),
        (100_000, 1, 1000, 1),
        (100_000, 2, 10**6, 1),
    ],
)
def test_tiles_blocks_fit_the_budget(name: str, n: int, width: int, vocab: int, mib: float) -> None:
    settings = FusedSettings(chunk_memory_mb=mib)
    plan = _plan(name, _rows(dtype=torch.float32)[0], settings=settings, fused=True)
    _check_tiles(plan, n, width, vocab, CPU, mib * MIB)


@pytest.mark.parametrize(
    ("matmul", "logits"), [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]
)
def test_tiles_blocks_in_16_bit_fit_the_budget(matmul: torch.dtype, logits: torch.dtype) -> None:
    plan = dataclasses.replace(_dtypes(matmul, logits), settings=FusedSettings(chunk_memory_mb=1))
    _check_tiles(plan, 100_000, 3, 50_000, CUDA, MIB)


def test_one_column_tiles_when_the_budget_holds_no_more() -> None:
    # width 1, float32: half the budget is B/8 rows of h, whose [rows, 1] float32 logits take the other half
    plan = _plan("ce", _rows(dtype=torch.float32)[0], settings=FusedSettings(chunk_memory_mb=1), fused=True)
    assert _check_tiles(plan, 10**6, 1, 1000, CPU, MIB) == (MIB // 8, 1)


@pytest.mark.parametrize(("device", "mib"), [(CPU, 128), (CUDA, 512)])
def test_tiles_blocks_take_the_devices_default_budget(device: torch.device, mib: int) -> None:
    plan = _plan("ce", _rows(dtype=torch.float32)[0], settings=FusedSettings(), fused=True)
    rows, _ = _check_tiles(plan, 10**7, 4096, 128_256, device, mib * MIB)
    assert rows == mib * MIB // 2 // (4096 * 4)
