"""eval_tasks.metrics.voting against its contract, for what tests/eval/test_voting.py leaves open: Win-rate BON@k is
Bradley-Terry's sigmoid(r_best - r_reference) also when the best sample loses to the reference (GEM's
``calculation_best_of_n``), and the refusals say what is wrong: k an integer >= 1, the question that has too few
samples, no questions at all."""

from __future__ import annotations

import math
import re

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.metrics.voting import majority_vote, reward_best_of_n, voting_accuracies, win_rate_best_of_n


@pytest.mark.parametrize("diff", [-30.0, -2.0, -0.5, -1e-3])
def test_win_rate_when_the_best_sample_loses_to_the_reference(diff: float) -> None:
    # Bradley-Terry: P(best beats reference) = 1 / (1 + exp(-(r_best - r_ref))), below one half for a loss
    expected = 100.0 / (1.0 + math.exp(-diff))
    got = win_rate_best_of_n([[diff, diff - 1.0]], [0.0], ks=[2])["win_rate_bon@2"]
    assert got == pytest.approx(expected, rel=1e-12)
    assert got < 50.0


def test_win_rate_averages_wins_and_losses() -> None:
    got = win_rate_best_of_n([[1.0], [-1.0]], [0.0, 0.0], ks=[1])["win_rate_bon@1"]
    assert got == pytest.approx(50.0)  # sigmoid(1) + sigmoid(-1) = 1


@pytest.mark.parametrize("k", [True, 2.5, "4", 0, -1])
def test_k_must_be_an_integer_of_at_least_one(k: object) -> None:
    with pytest.raises(
        DistMatchConfigError, match=rf"^k must be an integer >= 1, got {re.escape(repr(k))}\.$"
    ):
        voting_accuracies([[1, 2, 3, 4]], [1], ks=[k])  # type: ignore[list-item]


def test_too_few_samples_name_the_question() -> None:
    rows = [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0]]
    message = r"^k=4 needs at least 4 samples per question; question 1 has 2\.$"
    with pytest.raises(DistMatchConfigError, match=message):
        reward_best_of_n(rows, ks=[4])
    with pytest.raises(DistMatchConfigError, match=message):
        win_rate_best_of_n(rows, [0.0, 0.0], ks=[4])
    with pytest.raises(DistMatchConfigError, match=message):
        voting_accuracies(rows, [1.0, 1.0], ks=[4])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: majority_vote([]), "majority_vote needs at least one answer."),
        (lambda: majority_vote([1, 2], k=0), "majority_vote needs at least one answer."),
        (lambda: voting_accuracies([], []), "voting_accuracies needs at least one question."),
        (lambda: reward_best_of_n([]), "reward_best_of_n needs at least one question."),
        (lambda: win_rate_best_of_n([], []), "win_rate_best_of_n needs at least one question."),
    ],
)
def test_nothing_to_score_is_said_in_words(call, message: str) -> None:
    with pytest.raises(DistMatchConfigError) as err:
        call()
    assert str(err.value) == message
