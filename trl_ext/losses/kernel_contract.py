"""The Triton row kernel's contract with the Python side: its loss ids, its modes, and the slots of the gradient
coefficients one launch stores for a later one.

Named here once, as plain ints. `triton_rows.py` wraps each in a `tl.constexpr` global (a @triton.jit function can
read no other kind of global) and its launcher passes them; the coefficient buffers (`N_COEF` per row) are sized
from here, and the tests read the slots by name. No torch or Triton here, so every venv imports it.
"""

from __future__ import annotations

from enum import IntEnum

#: The kernel's `LOSS` constexpr for each loss it implements: exactly the specs with `triton=True`
#: (`triton_rows.py` refuses to import otherwise).
LOSS_IDS: dict[str, int] = {"ce": 0, "gem_linear": 1, "gem_ls": 2, "emo": 3}


class Mode(IntEnum):
    """The kernel's `MODE` constexpr: which passes one launch runs and which buffers it reads and writes."""

    #: pass 1 (loss, optional statistics), then pass 2 (the gradient over the logits) when WANT_GRAD
    FULL = 0
    #: FULL, and pass 1 also stores each row's `Coef` slots (the forward of ``grad_weight_accum="tiles"``)
    COEF_OUT = 1
    #: pass 2 alone over a tile of vocabulary columns, from stored coefficients, times a per-row scale (the backward
    #: of ``grad_weight_accum="tiles"``); no loss, no statistics
    GRAD_ONLY = 2


class Coef(IntEnum):
    """Column of a row's gradient coefficients in the [n, N_COEF] float32 buffer (COEF_OUT writes, GRAD_ONLY reads).

    With p = softmax(z), q = softmax(z / beta), s_j = cos(e_y, e_j): the gradient is a (p - 1_y) + b p (s_mean - s)
    for CE and EMO, r - R 1_y with r = q w(z - z_y) for GEM (w = 1 for gem_linear, sigmoid(0.01 (z - z_y)) for gem_ls).
    """

    LSE = 0  # logsumexp(z): p = exp(z - lse)
    CE_WEIGHT = 1  # a: 1 for CE, EMO's weight of its CE term
    DEMD_WEIGHT = 2  # b: EMO's weight of its DEMD term
    S_MEAN = 3  # sum_j p_j s_j (EMO)
    MB = 4  # a shift of z / beta: q = exp(z / beta - mb) / sum_q (GEM)
    SUM_Q = 5  # sum_j exp(z_j / beta - mb) (GEM)
    TOTAL_R = 6  # R = sum_j r_j, subtracted at the target (GEM; 1 for gem_linear)
    Z_Y = 7  # the target's logit, for w(z - z_y) (gem_ls)


#: Coefficients stored per row.
N_COEF = len(Coef)

#: The slots each loss's gradient pass reads (GRAD_ONLY): what a COEF_OUT launch must have stored for it.
GRAD_READS: dict[str, tuple[Coef, ...]] = {
    "ce": (Coef.LSE, Coef.CE_WEIGHT),
    "gem_linear": (Coef.MB, Coef.SUM_Q, Coef.TOTAL_R),
    "gem_ls": (Coef.MB, Coef.SUM_Q, Coef.TOTAL_R, Coef.Z_Y),
    "emo": (Coef.LSE, Coef.CE_WEIGHT, Coef.DEMD_WEIGHT, Coef.S_MEAN),
}

__all__ = ["GRAD_READS", "LOSS_IDS", "N_COEF", "Coef", "Mode"]
