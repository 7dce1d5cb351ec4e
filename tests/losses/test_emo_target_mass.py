"""EMO's `target_mass` (`trl_ext/losses/objectives/emo.py`): the value of D with the target's own mass left out
('excluded', the EMO repository's instruction-tuning / continual code, its `gt_q`) or kept ('included', the EMO
repository's language-modeling code behind the paper's Table 1).

The oracle here is written from the formula of the authors' `language_modeling/gpt2.py`, mode `emo` (DRSY/EMO
@ 14da9d5), not from our implementation: the target row of the unit-normalised cost embedding (taken through a
one-hot smoothed by 1e-15 and renormalised), the expected embedding under p = exp(log_softmax(z)), e = 1 - their dot
product, per token 0.5 (l + sg(l / (e + 1e-10)) e), the masked token mean. The shared sweeps of tests/losses/
(oracle, paths, chunked / fused, Triton) cover 'included' through tests/helpers/loss_cases.py and
tests/losses/test_triton.py's CASES.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.loss_cases import F64, make_cost_embedding, make_fused
from trl_ext.losses import IGNORE_INDEX, fused_token_loss, reference_token_loss, token_loss


def gpt2_emo_loss(logits: torch.Tensor, labels: torch.Tensor, cost_embedding: torch.Tensor) -> torch.Tensor:
    """The batch loss of gpt2.py's mode `emo` on rows already shifted (logits [N, V], labels [N], -100 ignored)."""
    mask = (labels != IGNORE_INDEX).to(logits.dtype)
    mle = torch.nn.functional.cross_entropy(logits, labels, reduction="none")  # 0 at ignored rows
    vocab = logits.shape[1]
    one_hot = torch.nn.functional.one_hot(labels.clamp_min(0), vocab).to(logits.dtype) + 1e-15
    one_hot = one_hot / one_hot.sum(dim=1, keepdim=True)
    emb = cost_embedding / torch.linalg.vector_norm(cost_embedding, dim=1, keepdim=True)
    target_repr = one_hot @ emb
    model_repr = torch.log_softmax(logits, dim=1).exp() @ emb
    emo = 1.0 - (target_repr * model_repr).sum(dim=1)  # no `gt_q`: the target's mass stays in
    token = 0.5 * (mle + (mle / (emo + 1e-10)).detach() * emo)
    return (token * mask).sum() / (mask.sum() + 1e-15)


def _ours(path: str, hidden, weight, labels, emb, target_mass: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch loss, d loss / d hidden) of our `emo` on `path` (logits = hidden W^T), reduced as gpt2.py reduces
    (the valid-token mean)."""
    params = {"cost_embedding": emb, "weighting": "emo1", "target_mass": target_mass}
    h = hidden.clone().requires_grad_(True)
    n_valid = (labels != IGNORE_INDEX).sum()
    if path == "fused":
        loss = fused_token_loss("emo", h, weight, labels, chunk_size=4, **params).sum() / n_valid
    else:
        fn = token_loss if path == "token" else reference_token_loss
        loss = fn("emo", h @ weight.T, labels, **params).sum() / n_valid
    (grad,) = torch.autograd.grad(loss, h)
    return loss.detach(), grad


@pytest.mark.parametrize("path", ["token", "reference", "fused"])
def test_included_is_the_language_modeling_codes_emo(path: str) -> None:
    """Value and gradient (w.r.t. the hidden states under the head) of `target_mass='included'` equal gpt2.py mode
    `emo`'s; 'excluded' (the default) has another gradient (emo1's detached ratio sg(l / e) sees another e)."""
    hidden, weight, labels = make_fused(N=10, V=13, d=6, seed=81)
    emb = make_cost_embedding(13, 5, seed=81, big=False)
    h = hidden.clone().requires_grad_(True)
    official = gpt2_emo_loss(h @ weight.T, labels, emb)
    (official_grad,) = torch.autograd.grad(official, h)
    loss, grad = _ours(path, hidden, weight, labels, emb, "included")
    torch.testing.assert_close(loss, official.detach(), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(grad, official_grad, atol=1e-9, rtol=1e-9)
    loss_x, grad_x = _ours(path, hidden, weight, labels, emb, "excluded")
    torch.testing.assert_close(loss_x, loss, atol=1e-10, rtol=1e-10)  # emo1's value is CE either way
    assert (grad_x - official_grad).abs().max() > 1e-3


def test_default_is_excluded_and_emo2_value_is_twice_demd() -> None:
    """Unset = 'excluded' (nothing changes for existing users); with 'included' emo2's value is 2 DEMD."""
    hidden, weight, labels = make_fused(N=9, V=13, d=6, seed=82)
    logits = hidden @ weight.T
    emb = make_cost_embedding(13, 5, seed=82)
    base = {"cost_embedding": emb, "weighting": "emo2"}
    default = token_loss("emo", logits, labels, **base)
    torch.testing.assert_close(default, token_loss("emo", logits, labels, target_mass="excluded", **base))
    loss, stats = token_loss("emo", logits, labels, target_mass="included", return_stats=True, **base)
    assert stats.demd is not None
    torch.testing.assert_close(loss, 2.0 * stats.demd.to(F64), atol=1e-9, rtol=1e-9)
    p_y = torch.exp(-stats.ce.to(F64)) * (labels != IGNORE_INDEX)  # 'excluded' adds p_y s_y (s_y = 1) to D
    torch.testing.assert_close(default, 2.0 * (stats.demd.to(F64) + p_y), atol=1e-9, rtol=1e-9)


def test_bad_target_mass_is_one_line() -> None:
    logits, labels = torch.zeros(2, 5, dtype=F64), torch.tensor([1, 2])
    with pytest.raises(ValueError) as caught:
        token_loss("emo", logits, labels, cost_embedding=torch.eye(5, dtype=F64), target_mass="kept")
    message = str(caught.value)
    assert (
        "\n" not in message
        and "target_mass" in message
        and "'excluded'" in message
        and "'included'" in message
    )
