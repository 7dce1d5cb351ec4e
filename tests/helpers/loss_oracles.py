"""Hand-written float64 oracles for the per-token losses of trl_ext.losses, one block per loss.

Written from the API spec only (not from the implementation: this module imports nothing of `trl_ext`). Every
function works row-wise on float64 tensors with explicit formulas: no autograd is used for the closed-form gradients.

Each loss registers, in `ORACLES[name]`:

* its closed form (`@oracle_for(name, defaults)`): per-token value and gradient w.r.t. the logits (`oracle`);
* its readable form (`@readable_for(name)`): the formula with stop-gradients, for autograd (`readable`), which the
  oracle tests hold the closed form to;
* its surrogate (`@surrogate_for(name)`): a differentiable S(z) whose true derivative is the spec'd gradient
  (`make_surrogate`, for gradcheck of the paths).

A loss of `trl_ext.losses` without all three fails tests/losses/test_oracle_registry.py.

Notation (per valid row): z = logits, y = label, p = softmax(z), l = -log p_y, H = -sum p log p.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

IGNORE = -100
SIGMOID_SLOPE = 0.01  # GEM logsigmoid slope, hard-coded by the spec
EAFT_ENTROPY_SCALE = (
    3.0  # the EAFT authors' divisor (LLaMA-Factory `use_eaft_loss`); Axolotl's `use_eaft` has none
)


@dataclass
class Oracle:
    value: torch.Tensor  # [N] float64, 0 at ignored rows
    grad: torch.Tensor  # [N, V] float64, d value_n / d z_n (closed form), 0 rows at ignored rows
    ce: torch.Tensor  # [N]
    entropy: torch.Tensor  # [N]
    top1_correct: torch.Tensor  # [N] 0/1
    demd: torch.Tensor | None  # [N] (emo only)
    # extra pieces (emo): cosine similarities s [N, V], e [N]
    s: torch.Tensor | None = None
    e: torch.Tensor | None = None
    p: torch.Tensor | None = None
    valid: torch.Tensor | None = None


@dataclass(frozen=True)
class Point:
    """The shared pieces of every closed form at the logits z (float64, detached; ignored rows use label 0)."""

    z: torch.Tensor  # [N, V]
    ys: torch.Tensor  # [N]
    valid: torch.Tensor  # [N] bool
    onehot: torch.Tensor  # [N, V]
    lse: torch.Tensor  # [N]
    logp: torch.Tensor  # [N, V]
    p: torch.Tensor  # [N, V]
    zy: torch.Tensor  # [N]
    ell: torch.Tensor  # [N]
    py: torch.Tensor  # [N]
    ent: torch.Tensor  # [N]
    top1: torch.Tensor  # [N] 0/1


@dataclass(frozen=True)
class Formula:
    """What a closed form gives at a point (unmasked): value [N], gradient [N, V], extra pieces."""

    value: torch.Tensor
    grad: torch.Tensor
    demd: torch.Tensor | None = None
    s: torch.Tensor | None = None  # emo: cosine similarities [N, V]
    e: torch.Tensor | None = None  # emo: E; tailr / eaft: the detached weight (for the frozen surrogate)


@dataclass(frozen=True)
class Readable:
    """The differentiable pieces of the readable forms at z (autograd flows through all of them)."""

    z: torch.Tensor
    ys: torch.Tensor
    logp: torch.Tensor
    p: torch.Tensor
    ell: torch.Tensor
    zy: torch.Tensor
    py: torch.Tensor


@dataclass(frozen=True)
class SurrogateAt:
    """A surrogate's inputs: the point z, l(z), and the expansion point z0 (with the oracle there, if frozen)."""

    z: torch.Tensor
    ys: torch.Tensor
    ell: torch.Tensor
    z0: torch.Tensor
    labels: torch.Tensor
    frozen: Oracle | None


Config = dict[str, Any]


@dataclass(frozen=True)
class LossOracle:
    defaults: Config
    closed_form: Callable[[Point, Config], Formula]
    readable: Callable[[Readable, Config], torch.Tensor] | None = None
    surrogate: Callable[[SurrogateAt, Config], torch.Tensor] | None = None
    freeze: bool = False  # the surrogate needs the oracle at z0 (weights frozen there)


#: loss name -> its oracle (closed form, readable form, surrogate), in registration order.
ORACLES: dict[str, LossOracle] = {}
#: loss name -> the default parameters the oracle assumes (written from the docs, not read from the specs).
DEFAULTS: dict[str, Config] = {}


def oracle_for(name: str, defaults: Config) -> Callable:
    """Register the closed form of loss `name` (first of its three pieces); a second registration is refused."""

    def register(fn: Callable[[Point, Config], Formula]) -> Callable[[Point, Config], Formula]:
        if name in ORACLES:
            raise ValueError(f"an oracle for {name!r} is registered already")
        ORACLES[name] = LossOracle(dict(defaults), fn)
        DEFAULTS[name] = dict(defaults)
        return fn

    return register


def _add(name: str, piece: str, fn: Callable, **extra: Any) -> None:
    if name not in ORACLES:
        raise ValueError(f"register the closed form of {name!r} (@oracle_for) before its {piece}")
    if getattr(ORACLES[name], piece) is not None:
        raise ValueError(f"the {piece} of {name!r} is registered already")
    ORACLES[name] = dataclasses.replace(ORACLES[name], **{piece: fn}, **extra)


def readable_for(name: str) -> Callable:
    def register(fn):
        _add(name, "readable", fn)
        return fn

    return register


def surrogate_for(name: str, *, freeze: bool = False) -> Callable:
    def register(fn):
        _add(name, "surrogate", fn, freeze=freeze)
        return fn

    return register


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------


def topk_entropy(z: torch.Tensor, k: int, log_eps: float = 0.0) -> torch.Tensor:
    """Entropy of the softmax over the min(k, V) largest logits of each row (float64, by sorting).

    `log_eps` > 0 gives Axolotl's variant, -sum q log(q + eps)."""
    z = z.detach().double()
    top = torch.sort(z, dim=1, descending=True).values[:, : min(k, z.shape[1])]
    shifted = top - top[:, :1]
    q = torch.exp(shifted) / torch.exp(shifted).sum(dim=1, keepdim=True)
    return -(q * torch.log(q + log_eps)).sum(dim=1)


def eaft_weight(z: torch.Tensor, alpha: float, k: int) -> torch.Tensor:
    """The EAFT authors' weight (H_k / 3) ** alpha."""
    return (topk_entropy(z, k) / EAFT_ENTROPY_SCALE) ** alpha


def eaft_axolotl_weight(z: torch.Tensor, alpha: float, k: int) -> torch.Tensor:
    """Axolotl 0.21 `use_eaft`'s weight: H_k ** alpha with log(q + 1e-10), no division by 3."""
    return topk_entropy(z, k, log_eps=1e-10) ** alpha


def tailr_weight(py: torch.Tensor, gamma: float, min_weight: float, variant: str) -> torch.Tensor:
    """The detached TaiLr weight (float64), written from the two released implementations.

    'tailr' (thu-coai/TaiLr fairseq/criterions/tailr.py): exp(log p - log(gamma + (1 - gamma) p)) clamped to
    [min_weight, 1]. 'emo_code' (DRSY/EMO language_modeling/gpt2.py, mode `tvd`, gamma = its mixing_ratio):
    gamma + (1 - gamma) clamp(p / ((1 - gamma) + gamma p), min_weight, 1), i.e. its
    gamma * l + (1 - gamma) clamp(...) * l.
    """
    py = py.double()
    if variant == "tailr":
        if gamma == 0.0:  # p / p
            ratio = torch.ones_like(py)
        else:
            ratio = torch.exp(torch.log(py) - torch.log(gamma + (1.0 - gamma) * py))
        return torch.clamp(ratio, min=min_weight, max=1.0)
    if variant == "emo_code":
        if gamma == 1.0:
            ratio = torch.ones_like(py)
        else:
            ratio = py / ((1.0 - gamma) + gamma * py)
        return gamma + (1.0 - gamma) * torch.clamp(ratio, min=min_weight, max=1.0)
    raise KeyError(variant)


def normalise_rows(emb: torch.Tensor) -> torch.Tensor:
    """Row-wise L2 normalisation, an all-zero row maps to the zero vector (float64)."""
    emb = emb.detach().double()
    norm = torch.sqrt((emb * emb).sum(dim=1, keepdim=True))
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))
    return torch.where(norm > 0, emb / safe, torch.zeros_like(emb))


def _softmax_stats(z: torch.Tensor):
    m = z.max(dim=1, keepdim=True).values
    lse = m.squeeze(1) + torch.log(torch.exp(z - m).sum(dim=1))
    logp = z - lse[:, None]
    p = torch.exp(logp)
    return lse, logp, p


def _ce_diff(z: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    lse = torch.logsumexp(z, dim=1)
    return lse - z.gather(1, ys[:, None]).squeeze(1)


def gem_ls_frozen_r(z0: torch.Tensor, labels: torch.Tensor, beta: float) -> torch.Tensor:
    """r_i = q_i * sigmoid(0.01 (z_i - z_y)) at z0 (float64, detached)."""
    z0 = z0.detach().double()
    y = labels.long()
    ys = torch.where(y != IGNORE, y, torch.zeros_like(y))
    _, _, q = _softmax_stats(z0 / beta)
    zy = z0.gather(1, ys[:, None])
    w = 1.0 / (1.0 + torch.exp(-SIGMOID_SLOPE * (z0 - zy)))
    return q * w


# ---------------------------------------------------------------------------------------------
# The three entry points
# ---------------------------------------------------------------------------------------------


def _point(logits: torch.Tensor, labels: torch.Tensor) -> Point:
    z = logits.detach().double().cpu()
    n_rows, vocab = z.shape
    y = labels.detach().long().cpu()
    valid = y != IGNORE
    ys = torch.where(valid, y, torch.zeros_like(y))
    onehot = torch.zeros(n_rows, vocab, dtype=torch.float64)
    onehot[torch.arange(n_rows), ys] = 1.0
    lse, logp, p = _softmax_stats(z)
    zy = z[torch.arange(n_rows), ys]
    return Point(
        z=z,
        ys=ys,
        valid=valid,
        onehot=onehot,
        lse=lse,
        logp=logp,
        p=p,
        zy=zy,
        ell=lse - zy,
        py=p[torch.arange(n_rows), ys],
        ent=-(p * logp).sum(dim=1),
        top1=(z.argmax(dim=1) == ys).double(),
    )


def oracle(name: str, logits: torch.Tensor, labels: torch.Tensor, **params) -> Oracle:
    """Per-token value, closed-form gradient w.r.t. logits and stats, in float64."""
    entry = ORACLES[name]
    cfg = {**entry.defaults, **params}
    at = _point(logits, labels)
    f = entry.closed_form(at, cfg)
    vm = at.valid.double()
    return Oracle(
        value=f.value * vm,
        grad=f.grad * vm[:, None],
        ce=at.ell * vm,
        entropy=at.ent * vm,
        top1_correct=at.top1 * vm,
        demd=None if f.demd is None else f.demd * vm,
        s=f.s,
        e=None if f.e is None else f.e * vm,
        p=at.p,
        valid=at.valid,
    )


def readable(name: str, z: torch.Tensor, labels: torch.Tensor, params: Config) -> torch.Tensor:
    """Readable float64 formulas with stop-gradients, differentiated by autograd (test-side), 0 at ignored rows."""
    entry = ORACLES[name]
    cfg = {**entry.defaults, **params}
    y = labels.long()
    valid = y != IGNORE
    ys = torch.where(valid, y, torch.zeros_like(y))
    logp = torch.log_softmax(z, dim=1)
    p = logp.exp()
    pieces = Readable(
        z=z,
        ys=ys,
        logp=logp,
        p=p,
        ell=-logp.gather(1, ys[:, None]).squeeze(1),
        zy=z.gather(1, ys[:, None]).squeeze(1),
        py=p.gather(1, ys[:, None]).squeeze(1),
    )
    return entry.readable(pieces, cfg) * valid.double()


def make_surrogate(name: str, z0: torch.Tensor, labels: torch.Tensor, **params):
    """S(z) [N] with dS_n/dz_n == the spec'd gradient of loss `name`, frozen coefficients (where needed) taken at z0.

    ce / ce_entropy: the loss itself. gem_linear: beta*lse(z/beta) - z_y. tailr / mixce / dft: a potential
    F(l) with F'(l) = w(exp(-l)). gem_ls / emo / eaft: the spec'd weights are frozen at z0 (where the oracle is
    computed), and the remaining pieces (z_i - z_y, l, DEMD) are differentiated numerically by gradcheck, which
    independently checks the DEMD gradient formula.
    """
    entry = ORACLES[name]
    cfg = {**entry.defaults, **params}
    frozen = oracle(name, z0, labels, **params) if entry.freeze else None
    y = labels.long()
    valid = y != IGNORE
    ys = torch.where(valid, y, torch.zeros_like(y))

    def fn(z: torch.Tensor) -> torch.Tensor:
        at = SurrogateAt(z=z, ys=ys, ell=_ce_diff(z, ys), z0=z0, labels=labels, frozen=frozen)
        return entry.surrogate(at, cfg) * valid.to(z.dtype)

    return fn


# ---------------------------------------------------------------------------------------------
# The losses
# ---------------------------------------------------------------------------------------------


@oracle_for("ce", {})
def _ce(at: Point, cfg: Config) -> Formula:
    return Formula(at.ell.clone(), at.p - at.onehot)


@readable_for("ce")
def _ce_readable(r: Readable, cfg: Config) -> torch.Tensor:
    return r.ell


@surrogate_for("ce")
def _ce_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    return s.ell


@oracle_for("gem_linear", {"beta": 0.7})
def _gem_linear(at: Point, cfg: Config) -> Formula:
    beta = float(cfg["beta"])
    _, _, q = _softmax_stats(at.z / beta)
    return Formula((q * at.z).sum(dim=1) - at.zy, q - at.onehot)


@readable_for("gem_linear")
def _gem_linear_readable(r: Readable, cfg: Config) -> torch.Tensor:
    q = torch.softmax(r.z / cfg["beta"], dim=1).detach()
    return -(q * (r.logp.gather(1, r.ys[:, None]) - r.logp)).sum(dim=1)


@surrogate_for("gem_linear")
def _gem_linear_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    beta = float(cfg["beta"])
    return beta * torch.logsumexp(s.z / beta, dim=1) - s.z.gather(1, s.ys[:, None]).squeeze(1)


@oracle_for("gem_ls", {"beta": 0.7})
def _gem_ls(at: Point, cfg: Config) -> Formula:
    beta = float(cfg["beta"])
    _, _, q = _softmax_stats(at.z / beta)
    w = 1.0 / (1.0 + torch.exp(-SIGMOID_SLOPE * (at.z - at.zy[:, None])))
    r = q * w
    big_r = r.sum(dim=1)
    return Formula((r * (at.z - at.zy[:, None])).sum(dim=1), r - big_r[:, None] * at.onehot)


@readable_for("gem_ls")
def _gem_ls_readable(r: Readable, cfg: Config) -> torch.Tensor:
    q = torch.softmax(r.z / cfg["beta"], dim=1).detach()
    w = torch.sigmoid(0.01 * (r.z - r.zy[:, None])).detach()
    return -(q * w * (r.logp.gather(1, r.ys[:, None]) - r.logp)).sum(dim=1)


@surrogate_for("gem_ls")
def _gem_ls_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    """The weights r = q * sigmoid(0.01 (z_i - z_y)) frozen at z0."""
    r0 = gem_ls_frozen_r(s.z0, s.labels, float(cfg["beta"]))
    zy = s.z.gather(1, s.ys[:, None])
    return (r0.to(s.z.dtype) * (s.z - zy)).sum(dim=1)


def emo_target_term(cfg: Config) -> float:
    """1.0 when the value of e leaves the target's own mass out (`target_mass` 'excluded', the official
    instruction-tuning code's `gt_q`: e = DEMD + p_y s_y), 0.0 when e = DEMD ('included', the official
    language-modeling code gpt2.py, mode `emo`)."""
    return {"excluded": 1.0, "included": 0.0}[cfg["target_mass"]]


@oracle_for("emo", {"weighting": "emo1", "ratio_clamp": None, "target_mass": "excluded"})
def _emo(at: Point, cfg: Config) -> Formula:
    emb_hat = normalise_rows(cfg["cost_embedding"]).cpu()
    s = emb_hat[at.ys] @ emb_hat.T  # s[n, i] = e_hat_i . e_hat_{y_n}
    c = 1.0 - s
    demd = 1.0 - (at.p * s).sum(dim=1)
    s_y = s[torch.arange(at.z.shape[0]), at.ys]
    e = demd + emo_target_term(cfg) * at.py * s_y  # the gradient is DEMD's either way
    d_demd = at.p * (c - demd[:, None])
    if cfg["weighting"] == "emo1":
        ratio = at.ell / (e + 1e-10)
        if cfg["ratio_clamp"] is not None:  # the EMO repository's continual fine-tuning mode `emo`
            ratio = torch.minimum(ratio, torch.full_like(ratio, float(cfg["ratio_clamp"])))
        value = 0.5 * (at.ell + ratio * e)
        grad = 0.5 * (at.p - at.onehot) + 0.5 * ratio[:, None] * d_demd
    elif cfg["weighting"] == "emo2":
        a = e / (at.ell + 1e-10)
        value = a * at.ell + e
        grad = a[:, None] * (at.p - at.onehot) + d_demd
    else:
        raise KeyError(cfg["weighting"])
    return Formula(value, grad, demd=demd, s=s, e=e)


@readable_for("emo")
def _emo_readable(r: Readable, cfg: Config) -> torch.Tensor:
    eh = normalise_rows(cfg["cost_embedding"])
    s = eh[r.ys] @ eh.T
    demd = 1 - (r.p * s).sum(dim=1)
    e = demd + emo_target_term(cfg) * (r.py * s.gather(1, r.ys[:, None]).squeeze(1)).detach()
    if cfg["weighting"] == "emo1":
        ratio = (r.ell / (e + 1e-10)).detach()
        if cfg["ratio_clamp"] is not None:
            ratio = torch.clamp(ratio, max=cfg["ratio_clamp"])
        return 0.5 * (r.ell + ratio * e)
    return (e / (r.ell + 1e-10)).detach() * r.ell + e


@surrogate_for("emo", freeze=True)
def _emo_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    """The weights of l and DEMD frozen at z0; DEMD itself stays differentiable (gradcheck checks its gradient)."""
    frozen = s.frozen
    p = torch.softmax(s.z, dim=1)
    sim = frozen.s.to(s.z.dtype)
    demd = 1.0 - (p * sim).sum(dim=1)
    ell0 = frozen.ce
    e0 = frozen.e
    if cfg["weighting"] == "emo1":
        a0 = 0.5 * torch.ones_like(ell0)
        ratio0 = ell0 / (e0 + 1e-10)
        if cfg["ratio_clamp"] is not None:
            ratio0 = torch.minimum(ratio0, torch.full_like(ratio0, float(cfg["ratio_clamp"])))
        b0 = 0.5 * ratio0
    else:
        a0 = e0 / (ell0 + 1e-10)
        b0 = torch.ones_like(ell0)
    return a0 * s.ell + b0 * demd


@oracle_for("ce_entropy", {"entropy_coef": 0.1})
def _ce_entropy(at: Point, cfg: Config) -> Formula:
    coef = float(cfg["entropy_coef"])
    value = at.ell - coef * at.ent
    return Formula(value, (at.p - at.onehot) + coef * at.p * (at.logp + at.ent[:, None]))


@readable_for("ce_entropy")
def _ce_entropy_readable(r: Readable, cfg: Config) -> torch.Tensor:
    return r.ell - cfg["entropy_coef"] * (-(r.p * r.logp).sum(dim=1))


@surrogate_for("ce_entropy")
def _ce_entropy_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    logp = torch.log_softmax(s.z, dim=1)
    ent = -(logp.exp() * logp).sum(dim=1)
    return s.ell - float(cfg["entropy_coef"]) * ent


@oracle_for("tailr", {"gamma": 0.5, "min_weight": 0.2, "variant": "tailr"})
def _tailr(at: Point, cfg: Config) -> Formula:
    w = tailr_weight(at.py, float(cfg["gamma"]), float(cfg["min_weight"]), cfg["variant"])
    return Formula(w * at.ell, w[:, None] * (at.p - at.onehot), e=w)  # e: the detached weight


@readable_for("tailr")
def _tailr_readable(r: Readable, cfg: Config) -> torch.Tensor:
    g, lo, pd = cfg["gamma"], cfg["min_weight"], r.py.detach()
    if cfg["variant"] == "tailr":
        w = torch.clamp(pd / (g + (1 - g) * pd), lo, 1.0)
        return w * r.ell
    # the EMO code's tvd: gamma * l + (1 - gamma) * clamp(...) * l
    return g * r.ell + (1 - g) * torch.clamp(pd / ((1 - g) + g * pd), lo, 1.0) * r.ell


@surrogate_for("tailr", freeze=True)
def _tailr_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    if cfg["variant"] == "tailr" and float(cfg["min_weight"]) == 0.0:
        # unclamped TaiLr: a potential F(l) with F'(l) = p_y / (gamma + (1 - gamma) p_y)
        gamma = float(cfg["gamma"])
        if gamma == 1.0:
            return -torch.exp(-s.ell)
        return -torch.log(gamma + (1.0 - gamma) * torch.exp(-s.ell)) / (1.0 - gamma)
    # clamped / EMO-code variant: the weight frozen at z0
    return s.frozen.e.to(s.z.dtype) * s.ell


@oracle_for("mixce", {"gamma": 0.5})
def _mixce(at: Point, cfg: Config) -> Formula:
    gamma = float(cfg["gamma"])
    w = gamma + (1.0 - gamma) * at.py
    return Formula(w * at.ell, w[:, None] * (at.p - at.onehot))


@readable_for("mixce")
def _mixce_readable(r: Readable, cfg: Config) -> torch.Tensor:
    return (cfg["gamma"] + (1 - cfg["gamma"]) * r.py.detach()) * r.ell


@surrogate_for("mixce")
def _mixce_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    gamma = float(cfg["gamma"])
    return gamma * s.ell + (1.0 - gamma) * (1.0 - torch.exp(-s.ell))


@oracle_for("dft", {})
def _dft(at: Point, cfg: Config) -> Formula:
    return Formula(at.py * at.ell, at.py[:, None] * (at.p - at.onehot))


@readable_for("dft")
def _dft_readable(r: Readable, cfg: Config) -> torch.Tensor:
    return r.py.detach() * r.ell


@surrogate_for("dft")
def _dft_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    return -torch.exp(-s.ell)  # F(l) = -exp(-l): F'(l) = p_y


@oracle_for("eaft", {"alpha": 1.0, "k": 20})
def _eaft(at: Point, cfg: Config) -> Formula:
    w = eaft_weight(at.z, float(cfg["alpha"]), int(cfg["k"]))
    return Formula(w * at.ell, w[:, None] * (at.p - at.onehot), e=w)  # e: the frozen weight


@readable_for("eaft")
def _eaft_readable(r: Readable, cfg: Config) -> torch.Tensor:
    top = torch.topk(r.z.detach(), min(cfg["k"], r.z.shape[1]), dim=1).values
    q = torch.softmax(top, dim=1)
    entropy = -(q * torch.log(q)).sum(dim=1)
    return (entropy / 3.0) ** cfg["alpha"] * r.ell


@surrogate_for("eaft", freeze=True)
def _eaft_surrogate(s: SurrogateAt, cfg: Config) -> torch.Tensor:
    return s.frozen.e.to(s.z.dtype) * s.ell  # the weight frozen at z0


# The oracles of the probability family and of the anchored losses (registered on import; they use the pieces above).
from tests.helpers import loss_oracles_more as _more  # noqa: E402, F401
