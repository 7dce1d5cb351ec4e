"""distmatch_open_ended through the real lm-eval on the tiny model: the WikiText-2 and PTB fixtures (each corpus's
own format) loaded by the task's loader, 5 forced-length ancestral samples per prefix, MAUVE with the tiny model as
featurizer, ROUGE-1/L and the oracle perplexity; the reported numbers are recomputed from the logged samples."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")  # the task module needs it (not in .venv-opencompass)

from eval_tasks.open_ended import open_ended as O  # noqa: E402
from eval_tasks.open_ended.harness import mauve_rounds, oracle_ppl_rounds  # noqa: E402
from eval_tasks.open_ended.open_ended import rouge_f  # noqa: E402
from tests.eval.lm_eval_tasks.helpers import (  # noqa: E402
    _check,
    _lm_eval_cmd,
    _results,
    _run,
    _samples,
    needs_lm_eval,
)
from tests.helpers.env import REPO_ROOT  # noqa: E402

pytestmark = [pytest.mark.slow, needs_lm_eval]
FIXTURES = REPO_ROOT / "tests" / "eval" / "fixtures" / "open_ended"
TASKS = ("distmatch_open_ended_wikitext2", "distmatch_open_ended_ptb")


@pytest.fixture(scope="module")
def open_ended_run(workdir: Path, env: dict[str, str]) -> tuple[Path, dict[str, Any]]:
    data = workdir / "open_ended_data"
    for key, name in (("wikitext2", "wikitext2_test-00000-of-00001.parquet"), ("ptb", "ptb.test.txt")):
        (data / key).mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / name, data / key / f"test{Path(name).suffix}")
    model = workdir / "model"
    meta = {"data_dir": str(data), "mauve_featurizer": f"lm:{model}", "oracle_model": str(model)}
    out = workdir / "out_open_ended"
    cmd = _lm_eval_cmd(model, ",".join(TASKS), out, meta, "--limit", "6")  # 6 documents per corpus
    _check(_run(cmd, dict(env, DISTMATCH_LM_EVAL_HOOK="0"), workdir))
    return out, meta


def test_open_ended_tasks_generate_forced_length_and_score(open_ended_run) -> None:
    out, meta = open_ended_run
    results = _results(out)
    for task, key in zip(TASKS, ("wikitext2", "ptb")):
        rows = _samples(out, task)
        spec = O.CORPORA[key]
        rows_file = FIXTURES / (
            "wikitext2_test-00000-of-00001.parquet" if key == "wikitext2" else "ptb.test.txt"
        )
        expected = O.build_examples(O.read_corpus(key, rows_file), spec)
        assert [r["doc"]["prefix"] for r in rows] == [e.prefix for e in expected[:6]]
        config = results["configs"][task]
        assert config["generation_kwargs"]["min_new_tokens"] == spec.new_tokens
        assert config["generation_kwargs"]["max_gen_toks"] == spec.new_tokens + 1
        assert config["generation_kwargs"]["top_k"] == 0 and config["repeats"] == 5
        samples = [r["filtered_resps"][0] for r in rows]
        assert all(len(s) == 5 and all(x for x in s) for s in samples)
        texts = [[O.model_text(r["doc"]["prefix"], x) for x in s] for r, s in zip(rows, samples)]
        refs = [r["doc"]["reference"] for r in rows]
        got = results["results"][task]
        mauve_items = [(p, q, meta["mauve_featurizer"]) for p, q in zip(refs, texts)]
        assert got["mauve,none"] == pytest.approx(mauve_rounds(mauve_items), rel=1e-6)
        assert 0 < got["mauve,none"] <= 100
        rouge = [rouge_f(q, [p] * 5) for p, q in zip(refs, texts)]
        assert got["rouge1,none"] == pytest.approx(sum(x["rouge1"] for x in rouge) / len(rouge))
        ppl = oracle_ppl_rounds([(None, q, meta["oracle_model"]) for q in texts])
        assert got["oracle_ppl,none"] == pytest.approx(ppl, rel=1e-4) and ppl > 1
