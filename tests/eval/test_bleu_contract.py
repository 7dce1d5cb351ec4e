"""eval_tasks.metrics.bleu against its contract, for what the other metric tests leave open: the first use builds
sacrebleu's BLEU with GEM's settings (identical samples score 100), and an empty sample is refused unless
``allow_empty=True`` (the default of every diversity metric, eval_tasks.metrics.inputs.check_samples)."""

from __future__ import annotations

import pytest

from eval_tasks.metrics import bleu
from eval_tasks.metrics.bleu import self_bleu, self_bleu_diversity
from eval_tasks.metrics.inputs import DiversityInputError


def test_the_first_use_builds_the_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bleu, "_BLEU", None)  # before the module's first use
    same = ["the cat sat on the mat today", "the cat sat on the mat today"]
    assert self_bleu(same) == pytest.approx(100.0)
    assert self_bleu_diversity(same) == pytest.approx(0.0)


def test_an_empty_sample_is_refused_by_default() -> None:
    samples = ["the cat sat on the mat today", ""]
    with pytest.raises(DiversityInputError):
        self_bleu(samples)
    with pytest.raises(DiversityInputError):
        self_bleu_diversity(samples)
    assert self_bleu(samples, allow_empty=True) == pytest.approx(0.0)
