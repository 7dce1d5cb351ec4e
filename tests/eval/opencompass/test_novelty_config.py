"""The NoveltyBench OpenCompass config (eval_tasks/opencompass_configs/datasets/distmatch/distmatch_noveltybench_gen.py):
the same prompts and sample count as the lm-eval tasks, and its evaluator = the rules of eval_tasks/novelty on fixed
classifier / reward outputs (a scorer built from plain functions)."""

from __future__ import annotations

import pytest

from eval_tasks.novelty import noveltybench as nb
from tests.eval.opencompass.test_configs import DATASETS, _config


def test_noveltybench_config_and_evaluator(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opencompass")
    from eval_tasks import opencompass_ext as oc
    from eval_tasks.novelty import scorers

    datasets = _config(DATASETS / "distmatch_noveltybench_gen.py")["distmatch_noveltybench_datasets"]
    assert [(d["abbr"], d["subset"], d["num_samples"]) for d in datasets] == [
        ("distmatch_noveltybench_curated", "curated", 10),
        ("distmatch_noveltybench_wildchat", "wildchat", 10),
    ]
    assert all(d["infer_cfg"]["inferencer"]["max_out_len"] == 512 for d in datasets)
    rows = oc.DistMatchNoveltyDataset.load("curated")
    assert len(rows) == 1000 and rows[0]["prompt"] == nb.novelty_documents("curated")[0]["prompt"]
    assert [r["sample"] for r in rows.select(range(10))] == list(range(10))

    class Reward:
        def score(self, prompts, responses):
            return [-3.0 if "good" in r else -7.0 for r in responses]

    def classifier(pairs):  # equivalent when both long texts start with the same word
        return [0.9 if a.split()[0] == b.split()[0] else 0.0 for a, b in pairs]

    monkeypatch.setattr(scorers, "load_scorer", lambda *a, **k: scorers.NoveltyScorer(classifier, Reward()))
    long = "{} one two three four five six"
    predictions = [long.format("good"), long.format("good"), long.format("bad"), "x", "X"]
    result = oc.DistMatchNoveltyEvaluator().score(predictions, ["p1", "p1", "p1", "p2", "p2"])
    p1 = nb.prompt_scores([0, 0, 1], [nb.reward_bin(-3.0), 0, nb.reward_bin(-7.0)])
    p2 = nb.prompt_scores([0, 0], [nb.reward_bin(-7.0), 0])
    assert result["distinct"] == pytest.approx((p1["distinct"] + p2["distinct"]) / 2)
    assert result["utility"] == pytest.approx((p1["utility"] + p2["utility"]) / 2)
    assert (result["num_prompts"], result["samples_per_prompt"]) == (2, 2)
    assert result["setting"]["comparable"] is False  # 2 samples, not 10
    assert "prompts not NoveltyBench's" in result["setting"]["note"]

    # NoveltyBench's prompts, 10 samples each: comparable only over the whole subset (not OpenCompass's test_range)
    prompts = [d["prompt"] for d in nb.novelty_documents("curated")]
    some = [p for p in prompts[:3] for _ in range(10)]
    result = oc.DistMatchNoveltyEvaluator().score([long.format("good")] * len(some), some)
    assert result["setting"]["comparable"] is False
    assert result["setting"]["note"].endswith("3 of the 100 NB-curated prompts")
    every = [p for p in prompts for _ in range(10)]
    result = oc.DistMatchNoveltyEvaluator().score([long.format("good")] * len(every), every)
    assert result["setting"]["comparable"] is True, result["setting"]
