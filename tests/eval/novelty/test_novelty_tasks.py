"""NoveltyBench's model-backed scorers and lm-eval tasks on tiny models built in code (tests/eval/novelty/models.py).

* the pair classifier's input is partition.py's ([CLS] a [SEP] b [SEP], 128 tokens each, token types 0 then 1) and a
  batch gives the unpadded pair's probability; the reward conversation has no generation prompt (score.py);
* `distmatch_noveltybench_curated` through the real lm-eval in this process (3 prompts, 3 samples, the tiny Llama):
  the reported distinct / utility are the means of the logged samples re-scored with the rules, and the results file
  records the models as not comparable with the published numbers;
* the pre-flight refuses bad options in one line before any generation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distmatch.errors import DistMatchConfigError
from eval_tasks.novelty import noveltybench as nb
from tests.eval.novelty.models import build_models
from tests.helpers.once import build_once

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_once(tmp_path_factory, "novelty_models", lambda root: build_models(root) and root)


def _paths(root: Path) -> dict[str, Path]:
    return {"model": root / "model", "classifier": root / "classifier", "reward": root / "reward"}


def test_pair_classifier_reads_pairs_as_noveltybench(models: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification

    from eval_tasks.novelty.scorers import PairClassifier

    path = _paths(models)["classifier"]
    clf = PairClassifier(str(path), device="cpu", batch_size=3)
    tok = clf.tokenizer
    long_text = " ".join(["word"] * 400)
    ids, types = clf.encode("a cat sat", long_text)
    a = tok.encode("a cat sat", add_special_tokens=False)
    b = tok.encode(long_text, add_special_tokens=False)[:128]
    assert ids == [tok.cls_token_id, *a, tok.sep_token_id, *b, tok.sep_token_id]
    assert types == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    pairs = [("a cat sat", long_text), ("the dog ran far away today", "a cat sat"), ("x", "y z"), ("q", "r")]
    batched = clf(pairs)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    for (x, y), got in zip(pairs, batched):
        i, t = clf.encode(x, y)
        with torch.no_grad():  # NoveltyBench: one unpadded pair, no attention mask
            logits = model(input_ids=torch.tensor([i]), token_type_ids=torch.tensor([t])).logits
        assert got == pytest.approx(logits.softmax(-1)[0, 1].item(), abs=1e-5)
    assert clf([("a b", "c d")]) != clf([("c d", "a b")])  # the order of the pair is kept


def test_scorer_partitions_and_scores_first_members(models: Path) -> None:
    from eval_tasks.novelty.scorers import NoveltyRewardScorer, NoveltyScorer, PairClassifier

    paths = _paths(models)
    reward = NoveltyRewardScorer(str(paths["reward"]), device="cpu")
    text = reward.text("Name a colour.", "Blue.")
    assert text.rstrip().endswith("Blue.</s>") or text.rstrip().endswith(
        "Blue."
    )  # no assistant header after it
    assert text.count("<|assistant|>") == 1
    clf = PairClassifier(str(paths["classifier"]), device="cpu")
    responses = [
        "the sky is blue and wide today",
        "green grass grows in the old field",
        "blue",
        "Blue",
        "a small red boat sails on the lake",
    ]
    got = NoveltyScorer(clf, reward).score("Name a colour.", responses)
    classes = nb.partition(responses, clf)
    assert (
        got["partition"] == classes and classes[3] == classes[2]
    )  # "blue" / "Blue": the short-response rule
    firsts = [classes.index(c) for c in range(max(classes) + 1)]
    raw = reward.score(["Name a colour."] * len(firsts), [responses[i] for i in firsts])
    bins = [0] * len(responses)
    for i, r in zip(firsts, raw):
        bins[i] = nb.reward_bin(r)
    assert got["distinct"] == max(classes) + 1
    assert got["utility"] == pytest.approx(nb.prompt_scores(classes, bins)["utility"])


def _evaluate(root: Path, metadata: dict[str, Any], tasks: list[str]) -> Any:
    import lm_eval

    from eval_tasks.lm_eval_tasks import task_manager

    return lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={root / 'model'},dtype=float32",
        tasks=tasks,
        task_manager=task_manager(metadata=metadata),
        metadata=metadata,
        gen_kwargs="max_gen_toks=8",
        apply_chat_template=True,
        log_samples=True,
        device="cpu",
        batch_size=4,
    )


def test_lm_eval_task_reports_the_rules_on_its_samples(models: Path, tmp_path: Path) -> None:
    pytest.importorskip("lm_eval")
    paths = _paths(models)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps(d) + "\n" for d in nb.novelty_documents("curated")[:3]), encoding="utf-8"
    )
    meta = {
        "num_samples": 3,
        "classifier": str(paths["classifier"]),
        "reward_model": str(paths["reward"]),
        "scorer_device": "cpu",
        "reward_batch_size": 2,
        "prompts_file": str(prompts),
    }
    out = _evaluate(models, meta, ["distmatch_noveltybench_curated"])
    task = "distmatch_noveltybench_curated"
    from eval_tasks.novelty.scorers import load_scorer

    scorer = load_scorer(str(paths["classifier"]), str(paths["reward"]), device="cpu", batch_size=2)
    per_prompt = []
    for record in out["samples"][task]:
        samples = record["filtered_resps"][0]
        assert len(samples) == 3 and "<|user|>" in record["arguments"][0][0]  # the chat template
        scored = scorer.score(record["doc"]["prompt"], samples)
        assert {"distinct": record["distinct"], "utility": record["utility"]} == pytest.approx(
            {"distinct": scored["distinct"], "utility": scored["utility"]}
        )
        per_prompt.append(scored)
    assert len(per_prompt) == 3
    results = out["results"][task]
    expected = nb.summarize(per_prompt)
    assert results["distinct,none"] == pytest.approx(expected["distinct"])
    assert results["utility,none"] == pytest.approx(expected["utility"])
    config = out["configs"][task]
    gen = config["generation_kwargs"]  # the creative-writing tasks' sampling (max_gen_toks: this test's 8)
    assert (config["repeats"], gen["do_sample"], gen["temperature"], gen["top_k"], gen["top_p"]) == (
        3,
        True,
        1.0,
        50,
        0.9,
    )
    assert set(results) >= {"ngram_diversity,none", "self_bleu_diversity,none"}
    setting = config["metadata"]["noveltybench_setting"]
    assert setting["comparable"] is False and setting["note"].startswith("not comparable")
    assert setting["classifier"] == str(paths["classifier"]) and setting["num_samples"] == 3
    assert f"prompts_file {prompts} (not NoveltyBench's prompt set)" in setting["note"]


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"classifier": "/nonexistent/cls"}, "classifier='/nonexistent/cls': no such model folder"),
        ({"scorer_device": "gpu0"}, "scorer_device='gpu0' is not a device; accepted: cpu, cuda"),
        ({"num_samples": 1}, "num_samples=1 is invalid for the creative writing and NoveltyBench tasks"),
        ({"reward_batch_size": 0}, "reward_batch_size=0 is invalid"),
        (
            {"reward_model": "BIG", "classifier": "CLS"},
            "is a LlamaForCausalLM checkpoint, not a sequence classifier",
        ),
        ({"classifier": "REWARD"}, "has 1 labels; NoveltyBench's classifier has 2"),
    ],
)
def test_preflight_refuses_before_generation(models: Path, metadata: dict, expected: str) -> None:
    from eval_tasks.lm_eval_tasks.preflight import preflight

    paths = _paths(models)
    metadata = {
        k: {"BIG": str(paths["model"]), "REWARD": str(paths["reward"]), "CLS": str(paths["classifier"])}.get(
            v, v
        )
        for k, v in metadata.items()
    }
    with pytest.raises(DistMatchConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")) as err:
        preflight(["distmatch_noveltybench"], metadata, ["pretrained"])
    assert "\n" not in str(err.value)


def _cache_holding(root: Path, *repos: str) -> Path:
    """A Hugging Face hub cache folder (its real layout) holding a config.json of each repo."""
    for repo in repos:
        folder = root / f"models--{repo.replace('/', '--')}"
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text("0" * 40)
        (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
        (folder / "snapshots" / ("0" * 40) / "config.json").write_text("{}")
    return root


def test_preflight_refuses_a_hub_model_offline_when_not_cached(monkeypatch, tmp_path) -> None:
    """Offline, a Hub id (given, or the published default) must be in the local cache before any generation."""
    from huggingface_hub import constants

    from eval_tasks.lm_eval_tasks.preflight import check_novelty_models

    reward, classifier = (
        "Skywork/Skywork-Reward-Gemma-2-27B-v0.2",
        "yimingzhang/deberta-v3-large-generation-similarity",
    )
    offline = {"HF_HUB_OFFLINE": "1"}
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache_holding(tmp_path / "cls", classifier)))
    given = {"reward_model": reward}
    with pytest.raises(DistMatchConfigError, match=f"reward_model='{reward}' is not in"):
        check_novelty_models(["distmatch_noveltybench_wildchat"], given, offline)
    check_novelty_models(["distmatch_noveltybench_wildchat"], given, {})  # online: loaded after generation
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    # the published defaults too: offline and not cached, the scores would fail only after generation
    with pytest.raises(
        DistMatchConfigError, match=f"classifier \\(unset: the published {classifier}\\) is not in"
    ):
        check_novelty_models(["distmatch_noveltybench"], {}, offline)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache_holding(tmp_path / "hub", classifier)))
    with pytest.raises(
        DistMatchConfigError, match=f"reward_model \\(unset: the published {reward}\\) is not in"
    ):
        check_novelty_models(["distmatch_noveltybench"], {}, offline)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache_holding(tmp_path / "both", classifier, reward)))
    check_novelty_models(["distmatch_noveltybench"], {}, offline)  # both cached: accepted
    check_novelty_models(
        ["distmatch_poem_diversity"], {"scorer_device": "bad"}, {}
    )  # not a NoveltyBench task


def test_lm_eval_refuses_a_bad_option_before_the_model_loads(models: Path) -> None:
    """Through lm-eval itself (the activation hook's pre-flight): the model named does not exist, so any refusal
    other than ours would be lm-eval's failure to load it."""
    pytest.importorskip("lm_eval")
    import lm_eval

    from eval_tasks.lm_eval_tasks import task_manager

    meta = {"scorer_device": "gpu0"}
    with pytest.raises(DistMatchConfigError, match="scorer_device='gpu0' is not a device"):
        lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={models / 'no-such-model'}",
            tasks=["distmatch_noveltybench_curated"],
            task_manager=task_manager(metadata=meta),
            metadata=meta,
        )


def test_tasks_built_by_lm_eval_default_to_the_published_setting() -> None:
    """The group's two tasks as lm-eval builds them from the YAMLs (the shipped prompts, nothing generated): 10 samples,
    the published models, recorded as comparable."""
    pytest.importorskip("lm_eval")
    from eval_tasks.lm_eval_tasks import task_manager

    tasks = task_manager().load(["distmatch_noveltybench"])["tasks"]
    for name, rows in (("distmatch_noveltybench_curated", 100), ("distmatch_noveltybench_wildchat", 1000)):
        task = tasks[name]
        docs = list(task.test_docs())
        assert (
            len(docs) == rows
            and docs[0]["prompt"] == nb.novelty_documents(name.rsplit("_", 1)[1])[0]["prompt"]
        )
        assert task.config.repeats == 10
        setting = task.config.metadata["noveltybench_setting"]
        assert setting == nb.comparability(None, None, 10) and setting["comparable"] is True
        assert (setting["classifier"], setting["reward_model"]) == (
            nb.PUBLISHED_CLASSIFIER,
            nb.PUBLISHED_REWARD_MODEL,
        )
