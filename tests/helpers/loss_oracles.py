"""Hand-written float64 oracles for the per-token losses of trl_ext.losses.

Written from the API spec only (not from the implementation). Every function works row-wise on
float64 tensors with explicit formulas: no autograd is used for the closed-form gradients.

Notation (per valid row): z = logits, y = label, p = softmax(z), l = -log p_y, H = -sum p log p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100
SIGMOID_SLOPE = 0.01  # GEM logsigmoid slope, hard-coded by the spec

DEFAULTS: dict[str, dict] = {
    "ce": {},
    "gem_linear": {"beta": 0.7},
    "gem_ls": {"beta": 0.7},
    "emo": {"weighting": "emo1", "ratio_clamp": None},
    "ce_entropy": {"entropy_coef": 0.1},
    "tailr": {"gamma": 0.5, "min_weight": 0.2, "variant": "tailr"},
    "mixce": {"gamma": 0.5},
    "dft": {},
    "eaft": {"alpha": 1.0, "k": 20},
}
EAFT_ENTROPY_SCALE = (
    3.0  # the EAFT authors' divisor (LLaMA-Factory `use_eaft_loss`); Axolotl's `use_eaft` has none
)


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


def oracle(name: str, logits: torch.Tensor, labels: torch.Tensor, **params) -> Oracle:
    """Per-token value, closed-form gradient w.r.t. logits and stats, in float64."""
    cfg = dict(DEFAULTS[name])
    cfg.update(params)
    z = logits.detach().double().cpu()
    n_rows, vocab = z.shape
    y = labels.detach().long().cpu()
    valid = y != IGNORE
    ys = torch.where(valid, y, torch.zeros_like(y))
    onehot = torch.zeros(n_rows, vocab, dtype=torch.float64)
    onehot[torch.arange(n_rows), ys] = 1.0

    lse, logp, p = _softmax_stats(z)
    zy = z[torch.arange(n_rows), ys]
    ell = lse - zy
    py = p[torch.arange(n_rows), ys]
    ent = -(p * logp).sum(dim=1)
    top1 = (z.argmax(dim=1) == ys).double()

    demd = None
    s_out = e_out = None
    if name == "ce":
        value = ell.clone()
        grad = p - onehot
    elif name == "gem_linear":
        beta = float(cfg["beta"])
        _, _, q = _softmax_stats(z / beta)
        value = (q * z).sum(dim=1) - zy
        grad = q - onehot
    elif name == "gem_ls":
        beta = float(cfg["beta"])
        _, _, q = _softmax_stats(z / beta)
        w = 1.0 / (1.0 + torch.exp(-SIGMOID_SLOPE * (z - zy[:, None])))
        r = q * w
        big_r = r.sum(dim=1)
        value = (r * (z - zy[:, None])).sum(dim=1)
        grad = r - big_r[:, None] * onehot
    elif name == "emo":
        emb_hat = normalise_rows(cfg["cost_embedding"]).cpu()
        s = emb_hat[ys] @ emb_hat.T  # s[n, i] = e_hat_i . e_hat_{y_n}
        c = 1.0 - s
        demd = 1.0 - (p * s).sum(dim=1)
        s_y = s[torch.arange(n_rows), ys]
        e = demd + py * s_y
        d_demd = p * (c - demd[:, None])
        if cfg["weighting"] == "emo1":
            ratio = ell / (e + 1e-10)
            if cfg["ratio_clamp"] is not None:  # the EMO repository's continual fine-tuning mode `emo`
                ratio = torch.minimum(ratio, torch.full_like(ratio, float(cfg["ratio_clamp"])))
            value = 0.5 * (ell + ratio * e)
            grad = 0.5 * (p - onehot) + 0.5 * ratio[:, None] * d_demd
        elif cfg["weighting"] == "emo2":
            a = e / (ell + 1e-10)
            value = a * ell + e
            grad = a[:, None] * (p - onehot) + d_demd
        else:
            raise KeyError(cfg["weighting"])
        s_out, e_out = s, e
    elif name == "ce_entropy":
        coef = float(cfg["entropy_coef"])
        value = ell - coef * ent
        grad = (p - onehot) + coef * p * (logp + ent[:, None])
    elif name == "tailr":
        w = tailr_weight(py, float(cfg["gamma"]), float(cfg["min_weight"]), cfg["variant"])
        value = w * ell
        grad = w[:, None] * (p - onehot)
        e_out = w  # the detached weight, for the gradcheck surrogate
    elif name == "mixce":
        gamma = float(cfg["gamma"])
        w = gamma + (1.0 - gamma) * py
        value = w * ell
        grad = w[:, None] * (p - onehot)
    elif name == "dft":
        value = py * ell
        grad = py[:, None] * (p - onehot)
    elif name == "eaft":
        w = eaft_weight(z, float(cfg["alpha"]), int(cfg["k"]))
        value = w * ell
        grad = w[:, None] * (p - onehot)
        e_out = w  # the frozen weight, for the gradcheck surrogate
    else:
        raise KeyError(name)

    vm = valid.double()
    return Oracle(
        value=value * vm,
        grad=grad * vm[:, None],
        ce=ell * vm,
        entropy=ent * vm,
        top1_correct=top1 * vm,
        demd=None if demd is None else demd * vm,
        s=s_out,
        e=None if e_out is None else e_out * vm,
        p=p,
        valid=valid,
    )


# ---------------------------------------------------------------------------------------------
# Differentiable surrogates whose TRUE derivative equals the spec'd gradient (used for gradcheck).
# ---------------------------------------------------------------------------------------------


def _ce_diff(z: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    lse = torch.logsumexp(z, dim=1)
    return lse - z.gather(1, ys[:, None]).squeeze(1)


def surrogate(name: str, z: torch.Tensor, labels: torch.Tensor, frozen: Oracle | None = None, **params):
    """A differentiable function S(z) [N] with dS_n/dz_n == the spec'd gradient of loss `name`.

    ce / ce_entropy: the loss itself. gem_linear: beta*lse(z/beta) - z_y. tailr / mixce / dft: a potential
    F(l) with F'(l) = w(exp(-l)). gem_ls / emo / eaft: the spec'd weights are frozen at the point where
    `frozen` (the oracle) was computed, and the remaining pieces (z_i - z_y, l, DEMD) are differentiated
    numerically by gradcheck, which independently checks the DEMD gradient formula.
    """
    cfg = dict(DEFAULTS[name])
    cfg.update(params)
    y = labels.long()
    valid = y != IGNORE
    ys = torch.where(valid, y, torch.zeros_like(y))
    vm = valid.to(z.dtype)
    ell = _ce_diff(z, ys)
    if name == "ce":
        out = ell
    elif name == "ce_entropy":
        logp = torch.log_softmax(z, dim=1)
        ent = -(logp.exp() * logp).sum(dim=1)
        out = ell - float(cfg["entropy_coef"]) * ent
    elif name == "gem_linear":
        beta = float(cfg["beta"])
        out = beta * torch.logsumexp(z / beta, dim=1) - z.gather(1, ys[:, None]).squeeze(1)
    elif name == "mixce":
        gamma = float(cfg["gamma"])
        out = gamma * ell + (1.0 - gamma) * (1.0 - torch.exp(-ell))
    elif name == "dft":  # F(l) = -exp(-l): F'(l) = p_y
        out = -torch.exp(-ell)
    elif name == "eaft":  # the weight frozen at the oracle's point
        assert frozen is not None
        out = frozen.e.to(z.dtype) * ell
    elif name == "tailr" and cfg["variant"] == "tailr" and float(cfg["min_weight"]) == 0.0:
        # unclamped TaiLr: a potential F(l) with F'(l) = p_y / (gamma + (1 - gamma) p_y)
        gamma = float(cfg["gamma"])
        if gamma == 1.0:
            out = -torch.exp(-ell)
        else:
            out = -torch.log(gamma + (1.0 - gamma) * torch.exp(-ell)) / (1.0 - gamma)
    elif name == "tailr":  # clamped / EMO-code variant: the weight frozen at the oracle's point
        assert frozen is not None
        out = frozen.e.to(z.dtype) * ell
    elif name == "emo":
        assert frozen is not None
        p = torch.softmax(z, dim=1)
        s = frozen.s.to(z.dtype)
        demd = 1.0 - (p * s).sum(dim=1)
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
        out = a0 * ell + b0 * demd
    else:
        raise KeyError(name)
    return out * vm


def gem_ls_frozen_r(z0: torch.Tensor, labels: torch.Tensor, beta: float) -> torch.Tensor:
    """r_i = q_i * sigmoid(0.01 (z_i - z_y)) at z0 (float64, detached)."""
    z0 = z0.detach().double()
    y = labels.long()
    ys = torch.where(y != IGNORE, y, torch.zeros_like(y))
    _, _, q = _softmax_stats(z0 / beta)
    zy = z0.gather(1, ys[:, None])
    w = 1.0 / (1.0 + torch.exp(-SIGMOID_SLOPE * (z0 - zy)))
    return q * w


def make_surrogate(name: str, z0: torch.Tensor, labels: torch.Tensor, **params):
    """Return S(z) with frozen coefficients (where needed) taken at z0."""
    cfg = dict(DEFAULTS[name])
    cfg.update(params)
    frozen = None
    if name in ("emo", "eaft", "tailr"):
        frozen = oracle(name, z0, labels, **params)
    if name == "gem_ls":
        r0 = gem_ls_frozen_r(z0, labels, float(cfg["beta"]))

        def fn(z):
            y = labels.long()
            valid = y != IGNORE
            ys = torch.where(valid, y, torch.zeros_like(y))
            zy = z.gather(1, ys[:, None])
            return (r0.to(z.dtype) * (z - zy)).sum(dim=1) * valid.to(z.dtype)

        return fn
    return lambda z: surrogate(name, z, labels, frozen=frozen, **params)
