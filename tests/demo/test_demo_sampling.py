"""The demo's sampler (examples/demo/demo_sampling.py): the tokens it allows are Hugging Face's top-k / top-p sets,
it draws them with their probabilities, a last-bit change of the logits does not change what it draws, and the
samples of a prompt do not depend on how the prompts are batched."""

from __future__ import annotations

import importlib
import sys

import pytest

from tests.helpers.env import REPO_ROOT
from tests.helpers.tiny_model import build_tiny_llama

torch = pytest.importorskip("torch")
if str(REPO_ROOT / "examples" / "demo") not in sys.path:  # the demo's modules import as top-level modules
    sys.path.insert(0, str(REPO_ROOT / "examples" / "demo"))
sampling = importlib.import_module("demo_sampling")


def _hf_allowed(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The tokens Hugging Face's own warpers leave finite (the oracle for the allowed set)."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    scores = TopKLogitsWarper(top_k)(None, logits.clone()) if top_k else logits.clone()
    scores = TopPLogitsWarper(top_p)(None, scores) if top_p < 1 else scores
    return torch.isfinite(scores)


@pytest.mark.parametrize(("top_k", "top_p"), [(50, 0.9), (0, 0.9), (50, 1.0), (5, 0.5)])
def test_allowed_tokens_are_hf_top_k_top_p(top_k: int, top_p: float) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 300, generator=gen, dtype=torch.float64) * 3
    allowed = _hf_allowed(logits, top_k, top_p)
    weights = sampling.allowed_probabilities(logits, 1.0, top_k, top_p)
    assert torch.equal(weights > 0, allowed)
    full = torch.softmax(logits, dim=-1) * allowed  # the allowed tokens' probabilities, in proportion
    assert torch.allclose(weights / weights.sum(1, keepdim=True), full / full.sum(1, keepdim=True))
    for value in (0.0, 0.3, 0.999999):  # every draw is an allowed token
        chosen = sampling.choose_tokens(logits, torch.full((64,), value), 1.0, top_k, top_p)
        assert allowed[torch.arange(64), chosen].all()


def test_draws_follow_the_probabilities() -> None:
    probs = torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15], dtype=torch.float64)
    u = torch.as_tensor(sampling.uniforms(7, 0, 1, 20000)[0])
    logits = torch.log(probs).expand(20000, 5)
    freq = torch.bincount(sampling.choose_tokens(logits, u, 1.0, 0, 1.0), minlength=5).double() / 20000
    assert torch.allclose(freq, probs, atol=0.01)
    sharp = torch.bincount(sampling.choose_tokens(logits, u, 0.5, 0, 1.0), minlength=5).double() / 20000
    assert (
        abs(sharp[1] - 0.16 / (probs**2).sum()) < 0.01
    )  # temperature 0.5: probabilities squared, renormalised
    nucleus = torch.bincount(sampling.choose_tokens(logits, u, 1.0, 0, 0.6), minlength=5).double() / 20000
    assert nucleus[[0, 2, 4]].sum() == 0 and abs(nucleus[1] - 0.4 / 0.7) < 0.01  # top-p 0.6 keeps 0.4 and 0.3


def test_a_last_bit_change_of_the_logits_does_not_change_the_draws() -> None:
    """float32 logits that differ by one unit in the last place (what another CPU's kernels give): the same tokens."""
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2000, 500, generator=gen) * 4).float()
    nudged = torch.nextafter(logits, torch.full_like(logits, float("inf")))
    assert not torch.equal(logits, nudged)
    u = torch.as_tensor(sampling.uniforms(42, 0, 1, 2000)[0])
    a = sampling.choose_tokens(logits, u, 1.0, 50, 0.9)
    b = sampling.choose_tokens(nudged, u, 1.0, 50, 0.9)
    assert torch.equal(a, b)


def test_uniforms_are_keyed_by_prompt_and_sample() -> None:
    a = sampling.uniforms(42, 3, 4, 10)
    assert a.shape == (4, 10) and (a >= 0).all() and (a < 1).all()
    assert (sampling.uniforms(42, 3, 2, 10) == a[:2]).all()  # fewer samples: the same first rows
    assert (sampling.uniforms(42, 3, 4, 5) == a[:, :5]).all()  # fewer steps: the same first draws
    assert (
        not (sampling.uniforms(43, 3, 4, 10) == a).all() and not (sampling.uniforms(42, 4, 4, 10) == a).all()
    )


def test_samples_do_not_depend_on_the_batch_layout(tmp_path) -> None:
    """A real (tiny) model through model.generate: each prompt alone, or padded next to a longer one, draws the
    same K samples (the padding changes the logits' last bits; torch's sampling would also change its random
    numbers with the layout)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_llama(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompts = [
        tokenizer("a short one")["input_ids"],
        tokenizer("a much longer prompt than the first one is")["input_ids"],
    ]
    kwargs = {
        "num_samples": 3,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 0.9,
        "max_new_tokens": 8,
        "seed": 42,
    }
    together = sampling.sample_batch(model, tokenizer, prompts, [0, 1], **kwargs)
    alone = [sampling.sample_batch(model, tokenizer, [p], [i], **kwargs)[0] for i, p in enumerate(prompts)]
    assert together == alone
    assert all(len(set(samples)) > 1 for samples in together)  # sampled, not K copies of one continuation
    other_seed = sampling.sample_batch(model, tokenizer, prompts, [0, 1], **{**kwargs, "seed": 43})
    assert other_seed != together
