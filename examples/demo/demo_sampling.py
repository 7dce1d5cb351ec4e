"""The demo's sampler: temperature / top-k / top-p sampling whose draws do not depend on the machine.

Hugging Face's sampling (`torch.multinomial` on float32 probabilities, random numbers from torch's generator in the
order the batch is laid out) changes a token when a last-bit difference in a probability moves it across the random
number, and the rest of the sample then differs; its random numbers also depend on the batch layout. Here:

- the random numbers are not torch's: one uniform per (seed, prompt position, sample index, step) from numpy's PCG64
  (`numpy.random.default_rng([seed, position, sample])`, a stream numpy keeps stable across platforms), so they do
  not depend on the batch layout, the thread count or the CPU;
- the allowed tokens (top-k, then top-p) and their probabilities are computed in float64 from the model's logits,
  and the token is the inverse CDF of the uniform over the allowed tokens in token-id order (not in probability
  order, so two nearly tied tokens that swap ranks on another machine do not move each other's interval).

A last-bit change of a probability therefore changes the drawn token only when the uniform lies within that change
of an interval boundary (or a token sits on the top-k / top-p border). The model's logits themselves still differ
in the last bits between CPUs (see docs/demo/README.md). Decoding goes through `model.generate` (greedy over the one
token the processor leaves), so prompts are encoded, padded and stopped as `distmatch-eval generate` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SAMPLER = (
    "inverse CDF in float64 over the top-k / top-p tokens in token-id order, uniforms from numpy PCG64 seeded by "
    "(seed, prompt position, sample index)"
)


def uniforms(seed: int, position: int, num_samples: int, steps: int) -> Any:
    """(num_samples, steps) float64 uniforms in [0, 1): row k is `default_rng([seed, position, k]).random(steps)`."""
    import numpy as np

    return np.stack([np.random.default_rng([seed, position, k]).random(steps) for k in range(num_samples)])


def allowed_probabilities(scores: Any, temperature: float, top_k: int, top_p: float) -> Any:
    """(batch, vocab) float64 probabilities of `scores` (logits) / temperature, zero outside the top-k, then
    top-p tokens (Hugging Face's sets: the k largest, then the most likely tokens until their mass reaches top-p);
    not renormalised. Tokens tied with the last one kept are all kept, so no sort order matters."""
    import torch

    x = scores.to(torch.float64) / temperature
    keep = torch.isfinite(x)
    top_k_applies = 0 < top_k < x.shape[-1]
    if top_k_applies:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        keep &= x >= kth
    probs = torch.softmax(x.masked_fill(~keep, float("-inf")), dim=-1)
    if top_p < 1.0:
        # Only the kept tokens can be in the top-p set: with top-k, sorting its k largest probabilities (ties with
        # the k-th fall outside them but are kept by the `>=` below) gives the same count as sorting the vocabulary.
        ordered = (
            torch.topk(probs, top_k, dim=-1).values
            if top_k_applies
            else torch.sort(probs, dim=-1, descending=True).values
        )
        before = torch.cumsum(ordered, dim=-1) - ordered  # probability of the more likely tokens
        count = (before < top_p).sum(dim=-1, keepdim=True).clamp(min=1)
        keep &= probs >= torch.gather(ordered, -1, count - 1)
    return probs * keep


def choose_tokens(scores: Any, u: Any, temperature: float, top_k: int, top_p: float) -> Any:
    """The token of each row of `scores` (batch, vocab logits) for the uniforms `u` (batch,): the inverse CDF, in
    token-id order and float64, of :func:`allowed_probabilities`."""
    import torch

    weights = allowed_probabilities(scores, temperature, top_k, top_p)
    cdf = torch.cumsum(weights, dim=-1)  # token-id order
    target = u.to(torch.float64).unsqueeze(-1) * cdf[:, -1:]
    index = torch.searchsorted(cdf, target, right=True).clamp(max=scores.shape[-1] - 1)
    return index.squeeze(-1)


def make_processor(draws: Any, prompt_width: int, temperature: float, top_k: int, top_p: float) -> Any:
    """A logits processor that picks each row's token with :func:`choose_tokens` and leaves only that token
    (score 0, the rest -inf), so greedy decoding takes it. `draws`: (rows, max_new_tokens) uniforms."""
    import torch
    from transformers import LogitsProcessor

    table = torch.as_tensor(draws, dtype=torch.float64)

    class InverseCdfSampler(LogitsProcessor):
        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            step = input_ids.shape[1] - prompt_width
            chosen = choose_tokens(scores, table[:, step], temperature, top_k, top_p).to(scores.device)
            out = torch.full_like(scores, float("-inf"))
            out.scatter_(-1, chosen.unsqueeze(-1), 0.0)
            return out

    return InverseCdfSampler()


def sample_batch(
    model: Any,
    tokenizer: Any,
    batch: Sequence[Sequence[int]],
    positions: Sequence[int],
    *,
    num_samples: int,
    temperature: float,
    top_k: int,
    top_p: float,
    max_new_tokens: int,
    seed: int,
) -> list[list[str]]:
    """`num_samples` continuations of each prompt of `batch` (token ids; `positions`: their places in the prompt
    file), left-padded by `eval_tasks.generation.left_pad` (as `hf_generate` is), drawn with :func:`make_processor`."""
    import numpy as np
    import torch
    from transformers import LogitsProcessorList

    from eval_tasks.generation import left_pad

    input_ids, attention, pad = left_pad(tokenizer, batch)
    width = input_ids.shape[1]
    draws = np.concatenate([uniforms(seed, p, num_samples, max_new_tokens) for p in positions])
    processor = make_processor(draws, width, temperature, top_k, top_p)
    device = next(model.parameters()).device
    # rows: prompt 0 sample 0..K-1, prompt 1 ... (as num_return_sequences lays them out)
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids.repeat_interleave(num_samples, dim=0).to(device),
            attention_mask=attention.repeat_interleave(num_samples, dim=0).to(device),
            pad_token_id=pad,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            logits_processor=LogitsProcessorList([processor]),
        )
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return [texts[i * num_samples : (i + 1) * num_samples] for i in range(len(batch))]
