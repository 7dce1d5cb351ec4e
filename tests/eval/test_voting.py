"""First-k voting, coverage and reward best-of-n against hand-computed values."""

from __future__ import annotations

import math

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.math.math_answers import is_equiv
from eval_tasks.metrics.voting import majority_vote, reward_best_of_n, voting_accuracies, win_rate_best_of_n


def test_majority_vote_counts_missing_answers_and_breaks_ties_by_first_seen() -> None:
    assert majority_vote([3, None, None, 3, None]) is None  # None is a vote and can win
    assert majority_vote([5, 7, 7, 5]) == 5  # 2-2 tie: 5 was seen first
    assert majority_vote([7, 5, 5, 7]) == 7
    assert majority_vote([1, 2, 2, 2, 1, 1, 1], k=4) == 2  # only the first k count
    with pytest.raises(DistMatchConfigError, match="at least one answer"):
        majority_vote([])


def test_voting_accuracies_first_k() -> None:
    answers = [
        # q0 gold 1: the first 4 vote 2 (2 x2 vs 1 x1, None x1); 1 is among them; the first 8 vote 1 (4 vs 3)
        [2, 1, 2, None, 1, 1, 1, 2],
        # q1 gold 9: never produced
        [None] * 8,
        # q2 gold 4: first 4 tie 4-4-3-3 -> 4 first seen; all 8 say 4 more often
        [4, 3, 4, 3, 4, 4, 0, 0],
        # q3 gold 6: appears only at position 6 (outside the first 4)
        [0, 0, 0, 0, 0, 6, 0, 0],
    ]
    golds = [1, 9, 4, 6]
    out = voting_accuracies(answers, golds, ks=(4, 8))
    # MV@4: q0 no (2), q1 no, q2 yes, q3 no -> 1/4. MV@8: q0 yes (1 x4 vs 2 x3), q2 yes -> 2/4.
    # BON@4: q0, q2 -> 2/4. BON@8: q0, q2, q3 -> 3/4.
    assert out == {"mv@4": 25.0, "bon@4": 50.0, "mv@8": 50.0, "bon@8": 75.0}


def test_voting_accuracies_with_the_math_check() -> None:
    answers = [["\\frac12", "0.5", "3", "3"]]
    # Votes are the strings as given (canonicalise first to merge equal answers): "3" x2 beats the two spellings of
    # 1/2 (x1 each) -> MV wrong; coverage finds "\frac12" equal to the gold under is_equiv.
    out = voting_accuracies(answers, ["\\frac{1}{2}"], ks=(4,), equal=is_equiv)
    assert out == {"mv@4": 0.0, "bon@4": 100.0}


def test_voting_needs_k_samples_and_matching_lengths() -> None:
    with pytest.raises(
        DistMatchConfigError, match="k=8 needs at least 8 samples per question; question 0 has 4"
    ):
        voting_accuracies([[1, 2, 3, 4]], [1], ks=(8,))
    with pytest.raises(DistMatchConfigError, match="2 questions of answers but 1 gold answers"):
        voting_accuracies([[1], [2]], [1], ks=(1,))
    with pytest.raises(DistMatchConfigError, match="k must be an integer >= 1"):
        voting_accuracies([[1]], [1], ks=(0,))


def test_reward_best_of_n_and_win_rate() -> None:
    rewards = [[0.1, 0.5, -1.0, 2.0], [1.0, 0.0, 0.3, 0.2]]
    assert reward_best_of_n(rewards, ks=(2, 4)) == pytest.approx({"reward_bon@2": 0.75, "reward_bon@4": 1.5})
    refs = [0.5, 1.0]
    # k=2: sigmoid(0.5 - 0.5) = 0.5, sigmoid(1.0 - 1.0) = 0.5 -> 50. k=4: sigmoid(1.5), sigmoid(0) -> mean x100.
    expected4 = 100 * (1 / (1 + math.exp(-1.5)) + 0.5) / 2
    out = win_rate_best_of_n(rewards, refs, ks=(2, 4))
    assert out == pytest.approx({"win_rate_bon@2": 50.0, "win_rate_bon@4": expected4})
    assert expected4 == pytest.approx(65.8787, abs=1e-3)
    # Extreme differences do not overflow.
    assert win_rate_best_of_n([[-1000.0]], [1000.0], ks=(1,))["win_rate_bon@1"] == 0.0
    with pytest.raises(DistMatchConfigError, match="2 questions of rewards but 1 reference rewards"):
        win_rate_best_of_n(rewards, [0.0], ks=(1,))
