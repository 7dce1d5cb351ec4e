"""The float64 oracles of `prob` (Beyond Log Likelihood's objective_trans) and of the anchored losses `asft` /
`sft_kl` (ASFT's train_v2.py), registered into `loss_oracles.ORACLES` like the others (imported at its end).

Written from the authors' formulas, not from the implementation (nothing of `trl_ext` is imported).
"""

from __future__ import annotations

import torch

from tests.helpers.loss_oracles import (
    Config,
    Formula,
    Point,
    Readable,
    SurrogateAt,
    _softmax_stats,
    oracle_for,
    readable_for,
    surrogate_for,
)


def prob_keep(py: torch.Tensor, min_p: float, max_p: float) -> torch.Tensor:
    """1.0 on the tokens the thresholds keep: p_y >= min_p (OnlyTopP) and p_y <= max_p (OnlyBottomP)."""
    return ((py >= min_p) & (py <= max_p)).double()


@oracle_for("prob", {"q": 1.0, "min_p": 0.0, "max_p": 1.0})
def _prob(at: Point, cfg: Config) -> Formula:
    """Beyond Log Likelihood's objective_trans: -(exp(q log p_y) - 1) / q (q = 0: -log p_y), times the kept mask.

    d/dz of -(p_y ** q) / q = -p_y ** q d log p_y / dz = p_y ** q (p - 1_y)."""
    q = float(cfg["q"])
    keep = prob_keep(at.py, float(cfg["min_p"]), float(cfg["max_p"]))
    value = at.ell.clone() if q == 0.0 else -(torch.exp(-q * at.ell) - 1.0) / q
    w = at.py**q * keep
    return Formula(value * keep, w[:, None] * (at.p - at.onehot), e=keep)  # e: the mask (frozen surrogate)


@readable_for("prob")
def _prob_readable(r: Readable, cfg: Config) -> torch.Tensor:
    q = cfg["q"]
    log_py = r.logp.gather(1, r.ys[:, None]).squeeze(1)
    value = -log_py if q == 0 else -(torch.exp(q * log_py) - 1) / q
    return value * prob_keep(r.py.detach(), cfg["min_p"], cfg["max_p"]).to(value.dtype)


@surrogate_for("prob", freeze=True)
def _prob_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    """The loss itself with the threshold mask frozen at z0."""
    q = float(cfg["q"])
    value = s.ell if q == 0.0 else (1.0 - torch.exp(-q * s.ell)) / q
    return s.frozen.e.to(s.z.dtype) * value


def reference_logits(cfg: Config) -> torch.Tensor:
    """The reference model's logits a case gives: `reference_logits` (the logits paths), or `reference_hidden` @
    `reference_weight`.T (the fused path's inputs), multiplied here in float64 (detached)."""
    if "reference_logits" in cfg:
        return cfg["reference_logits"].detach().double().cpu()
    hidden, weight = cfg["reference_hidden"].detach().double(), cfg["reference_weight"].detach().double()
    return (hidden @ weight.T).cpu()


def _anchored(at: Point, cfg: Config, dft: bool) -> Formula:
    """ASFT's `train_v2.py`: w * CE + kl_weight * F.kl_div(log_softmax(z), softmax(z_ref)).sum(-1), w = sg(p_y)
    (mode asft) or 1 (sft+kl), the reference under no_grad. KL(p_ref || p) = sum p_ref (log p_ref - log p);
    d/dz = w (p - 1_y) + kl_weight (p - p_ref)."""
    lam = float(cfg["kl_weight"])
    _, logp_ref, p_ref = _softmax_stats(reference_logits(cfg))
    kl = (p_ref * (logp_ref - at.logp)).sum(dim=1)
    w = at.py if dft else torch.ones_like(at.py)
    grad = w[:, None] * (at.p - at.onehot) + lam * (at.p - p_ref)
    return Formula(w * at.ell + lam * kl, grad, e=kl)  # e: the KL (logged as `kl`)


@oracle_for("asft", {"kl_weight": 0.1})
def _asft(at: Point, cfg: Config) -> Formula:
    return _anchored(at, cfg, dft=True)


@oracle_for("sft_kl", {"kl_weight": 0.1})
def _sft_kl(at: Point, cfg: Config) -> Formula:
    return _anchored(at, cfg, dft=False)


def _anchored_readable(r: Readable, cfg: Config, dft: bool) -> torch.Tensor:
    p_ref = torch.softmax(reference_logits(cfg).to(r.z.dtype), dim=1)
    kl = torch.nn.functional.kl_div(r.logp, p_ref, reduction="none").sum(dim=1)
    return (r.py.detach() * r.ell if dft else r.ell) + cfg["kl_weight"] * kl


@readable_for("asft")
def _asft_readable(r: Readable, cfg: Config) -> torch.Tensor:
    return _anchored_readable(r, cfg, dft=True)


@readable_for("sft_kl")
def _sft_kl_readable(r: Readable, cfg: Config) -> torch.Tensor:
    return _anchored_readable(r, cfg, dft=False)


def _anchored_surrogate(s: SurrogateAt, cfg: Config, dft: bool) -> torch.Tensor:
    """F(l) (F' = p_y: -exp(-l); CE: l) plus kl_weight * KL(p_ref || p(z)), differentiable as it is."""
    p_ref = torch.softmax(reference_logits(cfg).to(s.z.dtype), dim=1)
    kl = (p_ref * (torch.log(p_ref) - torch.log_softmax(s.z, dim=1))).sum(dim=1)
    return (-torch.exp(-s.ell) if dft else s.ell) + float(cfg["kl_weight"]) * kl


@surrogate_for("asft")
def _asft_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    return _anchored_surrogate(s, cfg, dft=True)


@surrogate_for("sft_kl")
def _sft_kl_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    return _anchored_surrogate(s, cfg, dft=False)
