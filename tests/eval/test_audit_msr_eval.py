"""Outside audit "mutation score round": eval_tasks' metrics, MATH / GSM8K answers and results, against values
computed by hand from the documented definitions (module docstrings, GEM's and Chen et al.'s formulas,
docs/evaluation.md), not from the code under test."""

from __future__ import annotations

import math

import pytest

from eval_tasks.math.math_answers import extract_gsm8k_answer, math_gold_answer
from eval_tasks.metrics.corpus import corpus_diversity
from eval_tasks.metrics.ngram import ngram_diversity
from eval_tasks.metrics.paired import paired_differences
from eval_tasks.metrics.pass_at_k import pass_at_k
from eval_tasks.metrics.voting import majority_vote, voting_accuracies, win_rate_best_of_n
from eval_tasks.results import diversity_result

# --- n-gram diversity: an order no sample reaches is left out of the mean -----------------------------------


def test_ngram_order_no_sample_reaches_is_left_out_of_the_mean() -> None:
    # "a b", "a c" (whitespace tokens): distinct-1 = |{a, b, c}| / 4 = 0.75, distinct-2 = 2 / 2 = 1, no 3-gram.
    assert ngram_diversity(["a b", "a c"], 3, tokenizer="whitespace") == pytest.approx(100 * (0.75 + 1.0) / 2)


# --- Self-BLEU with gem_compat: the first other sample is the reference (GEM's script) ----------------------


def test_self_bleu_gem_compat_uses_the_first_other_sample() -> None:
    from sacrebleu.metrics import BLEU

    from eval_tasks.metrics.bleu import self_bleu

    samples = [
        "the cat sat on the mat today",
        "the cat sat on the mat today",
        "a dog ran far away from home",
    ]
    bleu = BLEU()  # corpus_bleu defaults, GEM's settings
    # GEM's script: reference of sample j = the first of the others, in order.
    firsts = [samples[1], samples[0], samples[0]]
    expected = sum(bleu.corpus_score([h], [[r]]).score for h, r in zip(samples, firsts, strict=True)) / 3
    assert self_bleu(samples, gem_compat=True) == pytest.approx(expected)
    lasts = [samples[2], samples[2], samples[1]]
    other = sum(bleu.corpus_score([h], [[r]]).score for h, r in zip(samples, lasts, strict=True)) / 3
    assert abs(expected - other) > 1.0  # the choice of reference shows


# --- pass@k: 1 - C(n - c, k) / C(n, k) ------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "c", "k"), [(2, 1, 1), (5, 2, 3), (10, 7, 3), (4, 0, 2)])
def test_pass_at_k_is_one_minus_the_binomial_ratio(n: int, c: int, k: int) -> None:
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


# --- paired differences: ids unique in both runs ---------------------------------------------------------------


def test_paired_differences_refuses_a_reference_with_a_repeated_id() -> None:
    rows = [{"id": 1, "m": 1.0}, {"id": 2, "m": 2.0}]
    reference = [{"id": 1, "m": 0.0}, {"id": 2, "m": 0.0}, {"id": 2, "m": 5.0}]
    with pytest.raises(ValueError, match="not unique"):
        paired_differences(rows, reference, ["m"])


# --- corpus diversity: prompt prefix and the all-empty prompts in the mean ------------------------------------


def test_include_prompt_without_input_text_puts_a_newline_after_the_prompt() -> None:
    # "P\nx", "P\ny" split on whitespace: P x P y -> distinct-1 = 3 / 4; without the newline "Px", "Py": 2 / 2.
    result = corpus_diversity(
        [{"prompt": "P", "samples": ["x", "y"]}],
        metrics=("ngram",),
        include_prompt=True,
        n_max=1,
        tokenizer="whitespace",
    )
    assert result.metrics["ngram_diversity"] == pytest.approx(75.0)


def test_all_empty_prompts_count_zero_in_the_corpus_mean() -> None:
    # first prompt: "a b", "c d" -> distinct-1 = 4 / 4 = 100; second: all empty -> 0; mean over prompts 50.
    result = corpus_diversity(
        [["a b", "c d"], ["", ""]], metrics=("ngram",), n_max=1, tokenizer="whitespace", allow_empty=True
    )
    assert result.metrics["ngram_diversity"] == pytest.approx(50.0)
    assert result.settings["all_empty_prompts"] == 1


# --- voting: ties to the first seen, None votes, win rate's sigmoid ----------------------------------------------


def test_majority_vote_tie_goes_to_the_answer_seen_first() -> None:
    assert majority_vote(["b", "a", "a", "b"]) == "b"
    assert majority_vote(["a", "b", "b", "a"], k=4) == "a"


def test_a_missing_answer_votes_like_any_other() -> None:
    assert majority_vote([None, None, "1"]) is None
    # the gold "1" loses the vote to the two missing answers: MV@3 = 0, coverage BON@3 = 100
    assert voting_accuracies([[None, None, "1"]], ["1"], ks=[3]) == {"mv@3": 0.0, "bon@3": 100.0}


@pytest.mark.parametrize("margin", [-3.0, -1.0, -0.25, 0.0, 2.0])
def test_win_rate_is_the_bradley_terry_sigmoid_of_the_margin(margin: float) -> None:
    expected = 100.0 / (1.0 + math.exp(-margin))
    assert win_rate_best_of_n([[margin, margin - 5.0]], [0.0], ks=[2])["win_rate_bon@2"] == pytest.approx(
        expected
    )


# --- next-token statistics: which tokens are scored -------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_lm():
    from tests.helpers.tiny_model import tiny_llama_in_memory
    from trl_ext.testing import build_tokenizer

    tok = build_tokenizer()
    model = tiny_llama_in_memory(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        max_position_embeddings=2048,
        initializer_range=0.3,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return model.eval(), tok


def _mean_nll(model, ids: list[int], start: int) -> float:
    """Mean -log p(ids[t] | ids[:t]) over t >= start, by a plain forward pass."""
    import torch

    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)
    return -sum(float(logp[t - 1, ids[t]]) for t in range(start, len(ids))) / (len(ids) - start)


def test_a_text_record_scores_every_token_after_the_first(tiny_lm) -> None:
    from eval_tasks.metrics.next_token import next_token_stats

    model, tok = tiny_lm
    text = "the river under the quiet mountain"
    ids = list(tok(text, add_special_tokens=True)["input_ids"])
    stats = next_token_stats(model, tok, [{"text": text}], chat_template="never")
    assert stats.num_tokens == len(ids) - 1
    assert stats.mean_nll == pytest.approx(_mean_nll(model, ids, 1), rel=1e-4)


def test_a_prompt_response_record_scores_the_response_and_eos_only(tiny_lm) -> None:
    from eval_tasks.metrics.next_token import next_token_stats

    model, tok = tiny_lm
    prompt, response = "write a short poem about", " the sea"
    p = list(tok(prompt, add_special_tokens=True)["input_ids"])
    r = list(tok(response, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
    stats = next_token_stats(model, tok, [{"prompt": prompt, "response": response}], chat_template="never")
    assert stats.num_tokens == len(r)
    assert stats.mean_nll == pytest.approx(_mean_nll(model, p + r, len(p)), rel=1e-4)


# --- MATH / GSM8K answers ------------------------------------------------------------------------------------------


def test_math_gold_is_the_last_boxed() -> None:
    assert math_gold_answer("First \\boxed{1}, corrected: \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"


def test_gsm8k_accepts_a_lower_case_the_and_rounds_halves_to_even() -> None:
    assert extract_gsm8k_answer("so the answer is 42.") == 42
    assert extract_gsm8k_answer("The answer is 2.7") == 3
    assert extract_gsm8k_answer("The answer is 3.5") == 4
    assert extract_gsm8k_answer("The answer is 2.5") == 2


# --- results: protocol notes and comparability ----------------------------------------------------------------


def _records(ks: list[int]) -> list[dict]:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()
    return [
        {"id": i, "samples": [f"{words[j % 16]} {words[(j + i) % 16]}" for j in range(k)]}
        for i, k in enumerate(ks)
    ]


def test_mixed_samples_per_prompt_are_noted_off_protocol() -> None:
    result = diversity_result(
        _records([8, 16]), samples_file="s.jsonl", metrics=["ngram"], tokenizer="whitespace"
    )
    assert "8/16 samples per prompt (paper: 16)" in result["protocol_differences"]
    assert result["samples_per_prompt"] == [8, 16]
    assert result["comparable_to_published"] is False


def test_given_protocol_differences_are_never_comparable() -> None:
    result = diversity_result(
        _records([16]),
        samples_file="s.jsonl",
        metrics=["ngram"],
        tokenizer="whitespace",
        protocol_differences=[],
    )
    assert result["protocol_differences"] == []
    assert result["comparable_to_published"] is False
