"""LM heads through every path of the patched forward (`trl_ext/model_forward.py`): untied, tied, with a bias, tied with
a bias, Gemma-2 soft-capping and Cohere `logit_scale` each also with a biased head; on the path the forward picks,
the forced logits path and small chunks; CE and EMO with a frozen and a live cost embedding.

The reference is independent of `trl_ext.losses`: the model's own full forward (`model(...).logits`, which applies the
head's bias, the cap and the scale) with plain `torch.nn.functional.cross_entropy`, and for EMO the hand-written
float64 oracle (tests/helpers/loss_oracles.py) whose closed-form logit gradient is pushed through the model's own
autograd. Tiny float64 models built in code; no trainer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.loss_oracles import oracle
from trl_ext.model_forward import LossRequest, install_loss_forward

VOCAB, HIDDEN = 48, 16


def _biased(model: nn.Module, tied: bool = False) -> nn.Module:
    """The model with a biased linear head (same weight, or the input embedding when `tied`); a bias large enough
    to change every loss clearly."""
    old = model.get_output_embeddings()
    head = nn.Linear(HIDDEN, VOCAB, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.copy_(torch.randn(VOCAB, generator=torch.Generator().manual_seed(3)) * 4.0)
    if tied:
        head.weight = model.get_input_embeddings().weight
    model.lm_head = head
    return model


def llama(tie: bool = False, bias: bool = False) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    if bias:
        _biased(model, tied=tie)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    return model.double()


def gemma2_biased() -> nn.Module:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        final_logit_softcapping=3.0,
        attn_implementation="eager",
        tie_word_embeddings=False,
    )
    model = Gemma2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return _biased(model).double()


def cohere_biased() -> nn.Module:
    from transformers import CohereConfig, CohereForCausalLM

    torch.manual_seed(0)
    config = CohereConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        logit_scale=0.25,
        attn_implementation="eager",
        tie_word_embeddings=False,
    )
    model = CohereForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return _biased(model).double()


MODELS: dict[str, tuple[Callable[[], nn.Module], str]] = {  # builder, the path the forward must pick itself
    "untied": (lambda: llama(), "fused"),
    "tied": (lambda: llama(tie=True), "fused"),
    "biased": (lambda: llama(bias=True), "logits"),
    "tied_biased": (lambda: llama(tie=True, bias=True), "logits"),
    "gemma2_softcap_biased": (gemma2_biased, "logits"),
    "cohere_logit_scale_biased": (cohere_biased, "logits"),
}
PATHS = {"own": {}, "forced_logits": {"force_logits_path": True}, "chunks_of_3": {"chunk_size": 3}}


def batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    input_ids = torch.randint(0, VOCAB, (2, 9), generator=gen)
    labels = input_ids.clone()
    labels[0, :3] = -100
    labels[1, 5] = -100
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def reference(
    model: nn.Module, loss: str, cost: torch.Tensor | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss and parameter gradients of mean loss, from the model's own logits."""
    b = batch()
    logits = (
        model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1].reshape(-1, VOCAB)
    )
    targets = b["labels"][:, 1:].reshape(-1)
    count = (targets != -100).sum()
    if loss == "ce":
        per_token = F.cross_entropy(logits, targets, ignore_index=-100, reduction="none")
        (per_token.sum() / count).backward()
        return per_token.detach(), _grads(model)
    expected = oracle("emo", logits, targets, cost_embedding=cost)
    valid = (targets != -100).double()
    logits.backward(expected.grad * valid[:, None] / count)
    return expected.value * valid, _grads(model)


@pytest.mark.parametrize("loss", ["ce", "emo_frozen", "emo_live"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind", list(MODELS))
def test_head_matches_the_models_own_logits(kind, path, loss):
    build, own_path = MODELS[kind]
    model = build()
    frozen = model.get_output_embeddings().weight.detach().clone()
    if loss != "ce":  # training moved the head since the frozen copy was taken: live and frozen now differ
        with torch.no_grad():
            model.get_output_embeddings().weight.add_(
                torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
            )
    current = model.get_output_embeddings().weight.detach().clone()
    ours = copy.deepcopy(model)
    cost = {"ce": None, "emo_frozen": frozen, "emo_live": current}[loss]
    want, want_grads = reference(model, loss, cost)

    install_loss_forward(ours)
    request = LossRequest(
        name="emo" if loss != "ce" else "ce",
        params={"weighting": "emo1", "ratio_clamp": None} if loss != "ce" else {},
        cost_embedding=frozen if loss == "emo_frozen" else None,
        live_cost=loss == "emo_live",
        **PATHS[path],
    )
    out = ours(**batch(), distmatch_loss=request)
    assert out.path == ("logits" if path == "forced_logits" else own_path)
    torch.testing.assert_close(out.per_token_loss.reshape(-1), want, rtol=1e-9, atol=1e-11)
    (out.per_token_loss.sum() / out.label_mask.sum()).backward()
    got_grads = _grads(ours)
    assert set(got_grads) == set(want_grads) == {n for n, _ in model.named_parameters()}
    for name, ref in want_grads.items():
        torch.testing.assert_close(
            got_grads[name], ref, rtol=1e-8, atol=1e-10, msg=f"{kind} {path} {loss} {name}"
        )


@pytest.mark.parametrize("kind", ["biased", "tied_biased"])
def test_the_bias_matters(kind):
    """Without the bias the loss would differ clearly, so the test above sees a path that ignores it."""
    model = MODELS[kind][0]()
    b = batch()
    with torch.no_grad():
        hidden = model.model(input_ids=b["input_ids"]).last_hidden_state[:, :-1]
        without = F.linear(hidden, model.lm_head.weight).reshape(-1, VOCAB)
        own = model(input_ids=b["input_ids"]).logits[:, :-1].reshape(-1, VOCAB)
    targets = b["labels"][:, 1:].reshape(-1)
    difference = F.cross_entropy(own, targets, reduction="none") - F.cross_entropy(
        without, targets, reduction="none"
    )
    assert difference.abs().max() > 1.0
