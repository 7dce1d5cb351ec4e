"""The Triton row kernel's contract (trl_ext/losses/kernel_contract.py): loss ids, modes, coefficient slots.

The first tests need neither Triton nor a GPU. The last ones run the kernel (Triton's interpreter on a CPU, as in
test_triton.py, which checks that a tile pass from the stored coefficients equals the full pass): each slot a loss's
gradient reads holds what the contract says, against float64 values computed here from the formulas (docs/losses.md),
and the gradient pass reads no other slot.
"""

from __future__ import annotations

import importlib
import re
import sys

import pytest
import torch

from tests.helpers.env import REPO_ROOT
from trl_ext.losses import spec
from trl_ext.losses.kernel_contract import GRAD_READS, LOSS_IDS, N_COEF, Coef, Mode
from trl_ext.losses.registry import LOSSES, TRITON_LOSSES

ON_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")


# ---- the contract alone -----------------------------------------------------------------------------------------


def test_every_triton_loss_has_one_distinct_id():
    assert set(LOSS_IDS) == {name for name, s in LOSSES.items() if s.triton} == set(TRITON_LOSSES)
    ids = list(LOSS_IDS.values())
    assert all(type(i) is int for i in ids) and len(set(ids)) == len(ids)


def test_modes_are_distinct_ints():
    assert {m.name for m in Mode} == {"FULL", "COEF_OUT", "GRAD_ONLY"}
    assert len({int(m) for m in Mode}) == len(Mode)


def test_coefficient_slots_are_the_buffer_columns():
    """N_COEF distinct column indices 0 .. N_COEF - 1, and the N_COEF the buffers are sized by (spec) is this one."""
    assert sorted(int(c) for c in Coef) == list(range(N_COEF))
    assert spec.N_COEF == N_COEF


def test_every_slot_is_read_by_some_loss_and_every_loss_reads_its_slots():
    assert set(GRAD_READS) == set(LOSS_IDS)
    assert set().union(*GRAD_READS.values()) == set(Coef)  # no slot stored for nothing
    for slots in GRAD_READS.values():
        assert slots and len(set(slots)) == len(slots) and all(isinstance(s, Coef) for s in slots)


def test_the_kernel_source_names_its_ids_modes_and_slots():
    """No number stands for a loss, a mode or a slot in the kernel: each comes from the contract by name."""
    source = (REPO_ROOT / "trl_ext" / "losses" / "triton_rows.py").read_text()
    assert not re.search(r"\bLOSS\s*==\s*\d", source)
    assert not re.search(r"\bMODE\s*==\s*\d", source)
    assert not re.search(r"coef_row\s*\+\s*\d", source)
    assert "COEF_OUT: tl.constexpr = MODE ==" in source and "GRAD_ONLY: tl.constexpr = MODE ==" in source


# ---- the kernel against the contract ----------------------------------------------------------------------------

CASES = [
    ("ce", {}),
    ("gem_linear", {"beta": 0.7}),
    ("gem_ls", {"beta": 0.3}),
    ("emo", {"weighting": "emo1"}),
    ("emo", {"weighting": "emo2"}),
    ("emo", {"weighting": "emo1", "ratio_clamp": 0.4}),
    ("emo", {"weighting": "emo2", "target_mass": "included"}),
]
CASE_IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in params.items())}" for name, params in CASES]


@pytest.fixture(scope="module")
def triton_rows():
    """triton_rows with Triton's interpreter on when there is no GPU (set before Triton is first imported)."""
    with pytest.MonkeyPatch.context() as mp:
        if not ON_CUDA:
            already_imported = "triton" in sys.modules
            mp.setenv("TRITON_INTERPRET", "1")
        pytest.importorskip("triton", reason="Triton is not installed in this venv (it is in .venv-axolotl)")
        if not ON_CUDA and already_imported:
            from triton.language import standard
            from triton.runtime.interpreter import InterpretedFunction

            if not isinstance(standard.max, InterpretedFunction):
                pytest.fail("Triton was imported before TRITON_INTERPRET=1; run with TRITON_INTERPRET=1 set.")
        yield importlib.import_module("trl_ext.losses.triton_rows")


def _problem(n: int = 5, vocab: int = 23, seed: int = 7):
    """float64 logits (float32-representable), targets and the cosine similarity of an unnormalised embedding."""
    gen = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, vocab, generator=gen, dtype=torch.float64) * 3.0).float().double()
    y = torch.randint(0, vocab, (n,), generator=gen)
    emb = torch.randn(vocab, 6, generator=gen, dtype=torch.float64) * torch.rand(vocab, 1, generator=gen).add(
        0.3
    )
    unit = emb / emb.norm(dim=1, keepdim=True)
    return z, y, (unit[y] @ unit.T).float().double()


def _expected(
    name: str, params: dict, z: torch.Tensor, y: torch.Tensor, s: torch.Tensor
) -> dict[Coef, torch.Tensor]:
    """The slots with one right value, in float64 from the formulas: CE and EMO's gradient is a (p - 1_y) + b p
    (s_mean - s), GEM's q w - R 1_y (the shift MB and SUM_Q are checked together, as q)."""
    rows = torch.arange(len(y))
    z_y = z[rows, y]
    lse = torch.logsumexp(z, dim=1)
    if name == "ce":
        return {Coef.LSE: lse, Coef.CE_WEIGHT: torch.ones_like(lse)}
    if name in ("gem_linear", "gem_ls"):
        q = torch.softmax(z / params["beta"], dim=1)
        w = torch.sigmoid(0.01 * (z - z_y[:, None])) if name == "gem_ls" else torch.ones_like(z)
        return {Coef.TOTAL_R: (q * w).sum(1), **({Coef.Z_Y: z_y} if name == "gem_ls" else {})}
    p = torch.softmax(z, dim=1)
    s_mean = (p * s).sum(1)
    ce = lse - z_y
    # D in value: 1 - sum_{i != y} p_i s_i (target mass excluded, the default) or the true DEMD 1 - sum_i p_i s_i.
    d = 1 - s_mean + (p[rows, y] * s[rows, y] if params.get("target_mass", "excluded") == "excluded" else 0)
    if params["weighting"] == "emo1":  # 0.5 (l + min(sg(l / D), c) D)
        a, b = torch.full_like(ce, 0.5), 0.5 * (ce / d).clamp(max=params.get("ratio_clamp") or float("inf"))
    else:  # sg(D / l) l + D
        a, b = d / ce, torch.ones_like(ce)
    return {Coef.LSE: lse, Coef.CE_WEIGHT: a, Coef.DEMD_WEIGHT: b, Coef.S_MEAN: s_mean}


def _stored(triton_rows, name, params, z, y, s) -> torch.Tensor:
    """The coefficients a COEF_OUT launch stores, in a buffer that starts as NaN (a slot left unwritten shows)."""
    coef = torch.full((len(y), N_COEF), float("nan"), device=DEVICE)
    sim = s.float().to(DEVICE) if LOSSES[name].needs_cost_embedding else None
    triton_rows.triton_chunk_math(
        name,
        params,
        z.float().to(DEVICE),
        y.to(DEVICE),
        sim,
        want_grad=True,
        want_stats=False,
        grad_coefficients=coef,
    )
    return coef.cpu().double()


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_the_kernel_stores_what_each_slot_means(triton_rows, name, params):
    z, y, s = _problem()
    coef = _stored(triton_rows, name, params, z, y, s)
    expected = _expected(name, params, z, y, s)
    is_gem = name in ("gem_linear", "gem_ls")
    assert set(expected) | ({Coef.MB, Coef.SUM_Q} if is_gem else set()) == set(GRAD_READS[name])
    for slot, want in expected.items():
        torch.testing.assert_close(coef[:, slot], want, rtol=2e-5, atol=2e-6, msg=f"slot {slot.name}")
    if is_gem:  # q = exp(z / beta - mb) / sum_q is softmax(z / beta)
        q = torch.exp(z / params["beta"] - coef[:, Coef.MB, None]) / coef[:, Coef.SUM_Q, None]
        torch.testing.assert_close(q, torch.softmax(z / params["beta"], dim=1), rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize(("name", "params"), CASES, ids=CASE_IDS)
def test_the_gradient_pass_reads_only_the_slots_its_loss_lists(triton_rows, name, params):
    """A GRAD_ONLY launch gives the same gradient when every slot outside GRAD_READS[name] is NaN."""
    z, y, s = _problem()
    coef = _stored(triton_rows, name, params, z, y, s).float().to(DEVICE)
    poisoned = coef.clone()
    poisoned[:, [int(c) for c in Coef if c not in GRAD_READS[name]]] = float("nan")
    scale = torch.linspace(0.5, 1.5, len(y), device=DEVICE)
    sim = {"similarity": s.float().to(DEVICE)} if LOSSES[name].needs_cost_embedding else {}
    grads = [
        triton_rows.triton_tile_gradient(name, params, z.float().to(DEVICE), y.to(DEVICE), c, scale, 0, **sim)
        for c in (coef, poisoned)
    ]
    assert torch.isfinite(grads[0]).all()
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
