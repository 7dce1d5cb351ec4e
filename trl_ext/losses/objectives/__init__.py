"""One module per loss (or family): its spec, closed form and reference, nothing else.

`SPECS` is the order losses are listed in (choices, documentation). To add a loss, write its module (a
CE-weighted one only needs its detached weight, see `dft.py`) and add its spec here; `registry` checks it.
"""

from __future__ import annotations

from . import anchored, ce, ce_entropy, dft, eaft, emo, gem, mixce, prob, tailr

SPECS = (
    ce.SPEC,
    emo.SPEC,
    gem.LINEAR,
    gem.LS,
    ce_entropy.SPEC,
    tailr.SPEC,
    mixce.SPEC,
    dft.SPEC,
    eaft.SPEC,
    prob.SPEC,
    anchored.ASFT,
    anchored.SFT_KL,
)

__all__ = ["SPECS"]
