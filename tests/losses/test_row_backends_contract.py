"""The row math's backends (trl_ext/losses/row_backends.py), from its documented contract (its docstring,
docs/losses.md "GPU fast path" and the settings table): which row math `loss_kernels` selects where, the one-line
refusals naming what is accepted, `kernel_unavailable`'s reasons, and the first-use self-checks: the real Triton
kernel (Triton's interpreter on a CPU) passes them, a faulty one (a fault put behind the real kernel) is stopped with
the way out, and each runs once per process and (device type, dtype).

Triton is installed in .venv-axolotl only: the tests that need it skip elsewhere (tests/placement.py runs this file
there with TRITON_INTERPRET=1, as test_triton.py).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys

import pytest
import torch

from distmatch.optional import is_available
from trl_ext.losses import row_backends
from trl_ext.losses.registry import LOSSES, TRITON_LOSSES
from trl_ext.losses.row_backends import KERNELS_ENV, KernelSelfCheckError, kernel_unavailable, select_row_math
from trl_ext.losses.rows import chunk_math

# a CUDA device object needs no GPU until a tensor is made on it
CPU, CUDA = torch.device("cpu"), torch.device("cuda")
IMPLEMENTED = ", ".join(TRITON_LOSSES)
WITHOUT_KERNEL = [name for name in LOSSES if name not in TRITON_LOSSES]


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture(scope="module")
def triton_rows():
    """The kernel module, Triton running it in its interpreter (as test_triton.py's fixture: TRITON_INTERPRET must
    be set before Triton is first imported, which `make test` and the mutation run do in the environment)."""
    with pytest.MonkeyPatch.context() as mp:
        on_cpu = not torch.cuda.is_available()
        already_imported = "triton" in sys.modules
        if on_cpu:
            mp.setenv("TRITON_INTERPRET", "1")
        pytest.importorskip("triton", reason="Triton is not installed in this venv (it is in .venv-axolotl)")
        if on_cpu and already_imported:
            from triton.language import standard
            from triton.runtime.interpreter import InterpretedFunction

            if not isinstance(standard.max, InterpretedFunction):
                pytest.fail(
                    "Triton was imported before TRITON_INTERPRET=1 was set: run with it in the environment."
                )
        yield importlib.import_module("trl_ext.losses.triton_rows")


@pytest.fixture
def unchecked(monkeypatch):
    """A process in which neither self-check has run yet."""
    monkeypatch.setattr(row_backends, "_CHECKED", set())
    monkeypatch.setattr(row_backends, "_TILE_CHECKED", set())


# ---- which row math `loss_kernels` selects --------------------------------------------------------------------


@pytest.mark.parametrize("device", [CPU, CUDA])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_torch_is_always_the_closed_forms(device, dtype):
    for name in LOSSES:
        assert select_row_math(name, device, dtype, "torch") is chunk_math


def test_auto_keeps_the_closed_forms_where_the_kernel_does_not_run(interpreter):
    """auto: the kernel only for its losses on CUDA float32 chunks; a CPU (even with the interpreter on), another
    dtype, or a loss without a kernel take the PyTorch closed forms (and no self-check runs for them)."""
    for name in TRITON_LOSSES:
        assert select_row_math(name, CPU, torch.float32) is chunk_math
        for dtype in (torch.bfloat16, torch.float16, torch.float64):
            assert select_row_math(name, CUDA, dtype, "auto") is chunk_math
    for name in WITHOUT_KERNEL:
        assert select_row_math(name, CUDA, torch.float32, "auto") is chunk_math


def test_auto_and_triton_pick_the_kernel_on_cuda_float32(triton_rows, monkeypatch, no_interpreter):
    """auto or triton on a CUDA float32 chunk of a kernel loss, Triton installed: the kernel, without Triton's
    interpreter (only a CPU needs it). (The self-check for ("cuda", float32) already ran in this process, so nothing
    runs on a GPU here.)"""
    monkeypatch.setattr(row_backends, "_CHECKED", {("cuda", torch.float32)})
    for name in TRITON_LOSSES:
        assert select_row_math(name, CUDA, torch.float32) is triton_rows.triton_chunk_math
        assert select_row_math(name, CUDA, torch.float32, "auto") is triton_rows.triton_chunk_math
        assert select_row_math(name, CUDA, torch.float32, "triton") is triton_rows.triton_chunk_math


def test_triton_on_the_interpreter_runs_the_self_check_once(triton_rows, monkeypatch, unchecked, interpreter):
    """triton forces the kernel (on a CPU under TRITON_INTERPRET=1); its first selection per (device, dtype) runs
    the self-check through the kernel, a second one does not."""
    calls = []
    original = triton_rows.triton_chunk_math

    def spy(name, *args, **kwargs):
        calls.append(name)
        return original(name, *args, **kwargs)

    monkeypatch.setattr(triton_rows, "triton_chunk_math", spy)
    assert select_row_math("gem_ls", CPU, torch.float32, "triton") is spy
    assert set(calls) == set(TRITON_LOSSES) and row_backends._CHECKED == {("cpu", torch.float32)}
    calls.clear()
    assert select_row_math("emo", CPU, torch.float32, "triton") is spy
    assert calls == []


@pytest.mark.parametrize("value", ["tritn", "Torch", "AUTO", ""])
def test_an_unknown_value_is_refused_naming_the_choices(value):
    with pytest.raises(ValueError) as err:
        select_row_math("ce", CPU, torch.float32, value)
    assert str(err.value) == f"loss_kernels={value!r} is not one of auto, torch, triton."


@pytest.mark.parametrize("name", WITHOUT_KERNEL)
def test_triton_refuses_a_loss_without_a_kernel(name, interpreter):
    with pytest.raises(ValueError) as err:
        select_row_math(name, CPU, torch.float32, "triton")
    assert str(err.value) == (
        f"loss_kernels='triton': the Triton kernels implement {IMPLEMENTED}, not {name!r}; "
        f"use 'auto' to run {name!r} with the PyTorch path."
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_triton_refuses_chunks_that_are_not_float32(dtype, interpreter):
    with pytest.raises(ValueError) as err:
        select_row_math("ce", CPU, dtype, "triton")
    assert str(err.value) == f"loss_kernels='triton' computes in float32; {dtype} inputs need 'torch'."


def test_triton_on_a_cpu_needs_the_interpreter(no_interpreter, unchecked):
    with pytest.raises(ValueError) as err:
        select_row_math("ce", CPU, torch.float32, "triton")
    assert str(err.value) == (
        "loss_kernels='triton' needs a CUDA device, or TRITON_INTERPRET=1 (Triton's slow interpreter, for tests) "
        "on cpu."
    )
    assert row_backends._CHECKED == set()


def test_triton_without_triton_installed_says_how_to_install_it(monkeypatch, interpreter, unchecked):
    """Triton missing (as in .venv; hidden here as an uninstalled package): `triton` stops naming the extra, auto
    keeps the closed forms even on CUDA."""
    monkeypatch.setitem(sys.modules, "triton", None)
    with pytest.raises(ImportError) as err:
        select_row_math("ce", CPU, torch.float32, "triton")
    assert str(err.value) == (
        "The Triton loss kernels needs triton, which is not installed. Install it with: pip install 'distmatch[gpu]'"
    )
    assert select_row_math("ce", CUDA, torch.float32, "auto") is chunk_math


# ---- kernel_unavailable: why the kernel would not run, before any model loads ----------------------------------


@pytest.mark.parametrize(
    ("name", "kernels", "device_type", "interpret", "reason"),
    [
        ("ce", "torch", "cuda", True, "loss_kernels is 'torch'"),
        ("emo", "torch", "cpu", True, "loss_kernels is 'torch'"),
        ("tailr", "auto", "cuda", True, f"the Triton kernels implement {IMPLEMENTED}, not 'tailr'"),
        ("mixce", "triton", "cpu", True, f"the Triton kernels implement {IMPLEMENTED}, not 'mixce'"),
        ("ce", "auto", "cpu", True, "this run has no CUDA device (it runs on cpu)"),
        ("gem_ls", "auto", "mps", False, "this run has no CUDA device (it runs on mps)"),
        ("ce", "triton", "cpu", False, "this run has no CUDA device (it runs on cpu)"),
        ("ce", "triton", "cpu", True, None),
        ("emo", "auto", "cuda", False, None),
        ("gem_linear", "triton", "cuda", False, None),
    ],
)
def test_kernel_unavailable_reasons(monkeypatch, name, kernels, device_type, interpret, reason):
    if not is_available("triton"):  # not imported here: Triton reads TRITON_INTERPRET when first imported
        pytest.skip("Triton is not installed in this venv (it is in .venv-axolotl)")
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert kernel_unavailable(name, kernels, device_type) == reason


def test_kernel_unavailable_without_triton_installed(monkeypatch, interpreter):
    monkeypatch.setitem(sys.modules, "triton", None)
    missing = "Triton is not installed (pip install 'distmatch[gpu]')"
    for name, kernels, device_type in [("ce", "auto", "cuda"), ("emo", "triton", "cpu")]:
        assert kernel_unavailable(name, kernels, device_type) == missing
    assert kernel_unavailable("ce", "torch", "cuda") == "loss_kernels is 'torch'"


# ---- the first-use self-check of the kernel --------------------------------------------------------------------


def _spying(original, seen):
    def spy(name, params, z, y, similarity, **kwargs):
        scales = kwargs.get("similarity_scales")
        seen.append((name, z.dtype, None if similarity is None else similarity.dtype, scales is not None))
        return original(name, params, z, y, similarity, **kwargs)

    return spy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_real_kernel_passes_once_per_device_and_dtype(triton_rows, unchecked, dtype):
    """The kernel is checked on chunks of the dtype it will get (16-bit ones too), EMO with float32 similarity rows
    and their scales; a passing check is recorded for its (device type, dtype) and is not run again."""
    seen = []
    row_math = _spying(triton_rows.triton_chunk_math, seen)
    row_backends.check_kernel(row_math, CPU, dtype)
    assert row_backends._CHECKED == {("cpu", dtype)}
    assert {name for name, *_ in seen} == set(TRITON_LOSSES)
    for name, z_dtype, sim_dtype, scaled in seen:
        assert z_dtype == dtype
        assert (sim_dtype, scaled) == ((torch.float32, True) if name == "emo" else (None, False))
    seen.clear()
    row_backends.check_kernel(row_math, CPU, dtype)
    assert seen == []


def test_the_self_checks_leave_the_global_random_stream_alone(triton_rows, unchecked):
    """The checks run inside a seeded run's first step: drawing from torch's global generator there would change
    the run's dropout and sampling depending on whether a check ran in its process."""
    torch.manual_seed(7)
    state = torch.get_rng_state()
    row_backends.check_kernel(triton_rows.triton_chunk_math, CPU, torch.float32)
    row_backends.check_tile_kernel(CPU, torch.float32)
    assert torch.equal(torch.get_rng_state(), state)
    assert row_backends._CHECKED == row_backends._TILE_CHECKED == {("cpu", torch.float32)}


def _faulty(original, fault: str, case: str):
    """The real kernel with one fault on loss `case`'s result."""

    def row_math(name, params, z, y, similarity, **kwargs):
        result = original(name, params, z, y, similarity, **kwargs)
        if name != case:
            return result
        if fault == "loss_off":
            return dataclasses.replace(result, loss=result.loss + 0.5)
        if fault == "grad_column":
            result.grad[:, 3] += 1e-3
            return result
        if fault == "grad_shape":
            return dataclasses.replace(result, grad=result.grad[:, :-1])
        if fault == "no_grad":
            return dataclasses.replace(result, grad=None)
        field, how = fault.split("_", 1)
        value = getattr(result, field)
        return dataclasses.replace(result, **{field: None if how == "missing" else value * 1.001})

    return row_math


@pytest.mark.parametrize(
    ("fault", "case", "where"),
    [
        ("loss_off", "ce", "loss: max |diff| 0.5"),
        ("grad_column", "emo", "grad: max |diff| 0.001"),
        ("grad_shape", "gem_ls", "grad: missing"),
        ("no_grad", "ce", "grad: missing"),
        ("ce_off", "gem_linear", "ce: max |diff| "),
        ("entropy_off", "ce", "entropy: max |diff| "),
        ("entropy_missing", "gem_ls", "entropy: missing"),
        ("demd_off", "emo", "demd: max |diff| "),
    ],
)
def test_a_faulty_kernel_is_stopped_with_the_way_out(triton_rows, monkeypatch, unchecked, fault, case, where):
    """Values, gradients and statistics are compared: a fault in any stops with one error naming the device, the
    dtype, the case, where and how it differs, and the way out; nothing is recorded as checked, so every later use
    stops too, and the way out (`loss_kernels: torch`) runs."""
    faulty = _faulty(triton_rows.triton_chunk_math, fault, case)
    for _ in range(2):
        with pytest.raises(KernelSelfCheckError) as err:
            row_backends.check_kernel(faulty, CPU, torch.float32)
        assert row_backends._CHECKED == set()
    message = str(err.value)
    params = dict(next(p for n, p in row_backends.SELF_CHECK_CASES if n == case))
    head = f"The Triton loss kernel gives wrong results on this cpu device for torch.float32 ({case} {params}, {where}"
    assert message.startswith(head), message
    assert " vs the PyTorch closed form), so it is not used. " in message
    assert message.endswith(
        f"Set `loss_kernels: torch` ({KERNELS_ENV}=torch) to train with the PyTorch path (same losses, more memory "
        "traffic), and please report your GPU, driver and Triton version."
    )
    assert select_row_math(case, CPU, torch.float32, "torch") is chunk_math


def test_an_emo_kernel_reading_another_rows_costs_is_stopped(triton_rows, unchecked):
    """EMO's cost depends on the target: a kernel that reads each row's similarity row (and its scale) one row off
    computes a consistent but wrong cost, and is stopped (the check's embedding is not degenerate)."""
    original = triton_rows.triton_chunk_math

    def faulty(name, params, z, y, similarity, similarity_scales=None, **kwargs):
        if similarity is not None:
            similarity = similarity.roll(1, dims=0)
            similarity_scales = (similarity_scales[0].roll(1), similarity_scales[1])
        return original(name, params, z, y, similarity, similarity_scales=similarity_scales, **kwargs)

    with pytest.raises(KernelSelfCheckError, match=r"\(emo \{'weighting': 'emo1'\}, "):
        row_backends.check_kernel(faulty, CPU, torch.float32)


@pytest.mark.parametrize(
    ("loss_factor", "grad_offset", "passes"),
    [
        (1 + 9e-5, 9.5e-6, True),  # within rtol 1e-4, atol a tenth of it
        (1 + 3e-4, 0.0, False),
        (1.0, 2e-5, False),
    ],
    ids=["within", "loss-beyond", "grad-beyond"],
)
def test_the_self_check_tolerance(triton_rows, unchecked, loss_factor, grad_offset, passes):
    """float32 results are compared within a relative 1e-4 and an absolute tenth of it (the kernel's float32
    rounding differs from the closed forms'): within passes, beyond stops."""
    original = triton_rows.triton_chunk_math

    def shifted(*args, **kwargs):
        result = original(*args, **kwargs)
        return dataclasses.replace(result, loss=result.loss * loss_factor, grad=result.grad + grad_offset)

    if passes:
        row_backends.check_kernel(shifted, CPU, torch.float32)
        assert row_backends._CHECKED == {("cpu", torch.float32)}
    else:
        with pytest.raises(KernelSelfCheckError):
            row_backends.check_kernel(shifted, CPU, torch.float32)


# ---- the self-check of the gradient pass over vocabulary tiles -------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_real_tile_pass_passes_once_per_device_and_dtype(triton_rows, monkeypatch, unchecked, dtype):
    calls = []
    original = triton_rows.triton_tile_gradient

    def spy(name, *args, **kwargs):
        calls.append(name)
        return original(name, *args, **kwargs)

    monkeypatch.setattr(triton_rows, "triton_tile_gradient", spy)
    row_backends.check_tile_kernel(CPU, dtype)
    assert set(calls) == set(TRITON_LOSSES) and row_backends._TILE_CHECKED == {("cpu", dtype)}
    calls.clear()
    row_backends.check_tile_kernel(CPU, dtype)
    assert calls == []


def test_every_vocabulary_column_of_the_tile_pass_is_checked(triton_rows, monkeypatch, unchecked):
    """A tile pass wrong in one vocabulary column only (its first, an inner one, its last...) is stopped, whichever
    column it is, with the way out; nothing is recorded as checked."""
    original = triton_rows.triton_tile_gradient
    vocab = row_backends._self_check_problem(device=CPU, dtype=torch.float32).z.shape[1]
    for column in range(vocab):

        def faulty(name, params, z, y, coef, scale, col0, column=column, **kwargs):
            out = original(name, params, z, y, coef, scale, col0, **kwargs)
            if col0 <= column < col0 + out.shape[1]:
                out[:, column - col0] += 0.01
            return out

        monkeypatch.setattr(triton_rows, "triton_tile_gradient", faulty)
        with pytest.raises(KernelSelfCheckError) as err:
            row_backends.check_tile_kernel(CPU, torch.float32)
        assert row_backends._TILE_CHECKED == set()
    message = str(err.value)
    assert message.startswith(
        "The Triton loss kernel's gradient over a vocabulary tile is wrong on this cpu device for torch.float32 (ce {}, "
        "columns "
    ), message
    assert ": max |diff| 0.01 vs its full pass), so `loss_grad_weight_accum: tiles` " in message
    assert "(DISTMATCH_GRAD_WEIGHT_ACCUM=tiles) cannot be used here. " in message
    assert message.endswith(
        " cannot be used here. Set it to 'float32' or 'weight', and please report your GPU, driver and Triton version."
    )


def test_a_tile_pass_that_ignores_the_row_scale_is_stopped(triton_rows, monkeypatch, unchecked):
    """The tile pass multiplies each row by its upstream gradient: one that ignores it (or applies one scale to
    every row) is stopped."""
    original = triton_rows.triton_tile_gradient

    def faulty(name, params, z, y, coef, scale, col0, **kwargs):
        return original(name, params, z, y, coef, torch.full_like(scale, float(scale.mean())), col0, **kwargs)

    monkeypatch.setattr(triton_rows, "triton_tile_gradient", faulty)
    with pytest.raises(KernelSelfCheckError, match=r"\(ce \{\}, columns "):
        row_backends.check_tile_kernel(CPU, torch.float32)
