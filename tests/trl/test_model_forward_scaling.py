"""Models that transform their logits after the LM head, built in code: the patched forward (`model_forward.py`)
gives the loss values and every parameter's gradient of the model's own logits, on the fused and the logits path.

* Gemma-2 style final-logit soft-capping (`final_logit_softcapping`): `tanh(z / cap) * cap`. The fused path
  cannot apply it, so the forward takes the logits path even when not forced.
* Cohere style `logit_scale`: `z * scale`, folded into the hidden states on the fused path.

The reference is the model's own forward (`model(...).logits`, transformers applies the cap / scale there) and
`reference_token_loss`, float64.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
from torch import nn

from trl_ext.anchor import Reference
from trl_ext.losses import LOSS_NAMES, reference_token_loss
from trl_ext.model_forward import LossRequest, install_loss_forward

VOCAB = 64
CAP = 3.0
SCALE = 0.25


def gemma2_softcapped() -> nn.Module:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        final_logit_softcapping=CAP,
        attn_implementation="eager",
    )
    model = Gemma2ForCausalLM(config)
    with torch.no_grad():  # logits well beyond the cap, so soft-capping changes them a lot
        model.lm_head.weight.mul_(40.0)
    return model.double()


def cohere_scaled() -> nn.Module:
    from transformers import CohereConfig, CohereForCausalLM

    torch.manual_seed(0)
    config = CohereConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        logit_scale=SCALE,
        attn_implementation="eager",
    )
    model = CohereForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model.double()


MODELS = {"gemma2_softcap": gemma2_softcapped, "cohere_logit_scale": cohere_scaled}


def batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    input_ids = torch.randint(0, VOCAB, (2, 10), generator=gen)
    labels = input_ids.clone()
    labels[0, :3] = -100
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def params_for(loss: str, model: nn.Module) -> dict[str, Any]:
    if loss in ("asft", "sft_kl"):  # the anchored losses: a frozen reference model, not the model itself
        frozen = copy.deepcopy(model).requires_grad_(False)
        with torch.no_grad():
            for i, p in enumerate(frozen.parameters()):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i), dtype=p.dtype) * 0.05)
        return {"reference_model": frozen}
    return {"cost_embedding": model.get_output_embeddings().weight.detach().clone()} if loss == "emo" else {}


def reference(
    model: nn.Module, loss: str, cost: dict[str, Any]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    b = batch()
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
    targets = b["labels"][:, 1:].reshape(-1)
    cost = dict(cost)
    if "reference_model" in cost:  # its own forward: its logits soft-capped / scaled by transformers
        frozen = cost.pop("reference_model")
        ref = frozen(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
        cost["reference_logits"] = ref.reshape(-1, VOCAB)
    per_token = reference_token_loss(loss, logits.reshape(-1, VOCAB), targets, **cost)
    value = per_token.sum() / (targets != -100).sum()
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return per_token.detach(), grads


def patched(model: nn.Module, loss: str, cost: dict[str, Any], force_logits: bool) -> tuple[Any, dict]:
    install_loss_forward(model)
    request = LossRequest(
        name=loss,
        params={},
        cost_embedding=cost.get("cost_embedding"),
        force_logits_path=force_logits,
        reference=Reference(model=cost["reference_model"]) if "reference_model" in cost else None,
    )
    out = model(**batch(), distmatch_loss=request)
    value = out.per_token_loss.sum() / out.label_mask.sum()
    value.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("loss", LOSS_NAMES)
@pytest.mark.parametrize("force_logits", [False, True], ids=["default_path", "forced_logits"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_values_and_gradients_match_the_models_own_logits(kind, force_logits, loss):
    model = MODELS[kind]()
    ours = copy.deepcopy(model)
    cost = params_for(loss, model)
    ref_per_token, ref_grads = reference(model, loss, cost)
    out, grads = patched(ours, loss, cost, force_logits)
    expected_path = "logits" if force_logits or kind == "gemma2_softcap" else "fused"
    assert out.path == expected_path
    torch.testing.assert_close(out.per_token_loss.reshape(-1), ref_per_token, rtol=1e-10, atol=1e-12)
    assert set(grads) == set(ref_grads) and len(grads) == len(list(model.parameters()))
    for name, ref in ref_grads.items():
        torch.testing.assert_close(grads[name], ref, rtol=1e-9, atol=1e-12, msg=f"{kind} {loss} {name}")


@pytest.mark.parametrize("kind", list(MODELS))
def test_the_transform_matters_for_these_models(kind):
    """Without the cap / scale the reference loss would differ clearly, so the tests above can see it missing."""
    model = MODELS[kind]()
    b = batch()
    with torch.no_grad():
        hidden = model.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
        raw = model.lm_head(hidden)[:, :-1].reshape(-1, VOCAB)
        own = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
    targets = b["labels"][:, 1:].reshape(-1)
    with_transform = reference_token_loss("ce", own.reshape(-1, VOCAB), targets)
    without = reference_token_loss("ce", raw, targets)
    assert (with_transform - without).abs().max() > 1.0


def test_path_is_logged_once_per_model_and_path(caplog):
    model = cohere_scaled()
    cost: dict[str, Any] = {}
    with caplog.at_level(logging.INFO, logger="trl_ext.model_forward"):
        for force_logits in (False, False, True, True):
            patched(model, "ce", cost, force_logits)
    messages = [r.getMessage() for r in caplog.records if r.name == "trl_ext.model_forward"]
    assert len(messages) == 2, messages
    assert "CohereForCausalLM: fused" in messages[0] and "no [tokens, vocab] logits" in messages[0]
    assert "CohereForCausalLM: logits" in messages[1]
