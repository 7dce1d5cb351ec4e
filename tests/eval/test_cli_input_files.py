"""distmatch-eval on damaged or unusual input files: a file holding prompts twice, prompts whose samples are all
empty, GSM8K numbers beyond float range, a causal LM as reward model, files that are not UTF-8, and the cut-off last
line an interrupted `generate` leaves. Each through the real command: `cli.main` (what the console script calls),
and once through a process of its own."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from eval_tasks import cli
from tests.helpers.env import OFFLINE_ENV, REPO_ROOT

PROMPTS = [f"Write a poem titled '{t}' with no more than 200 words." for t in ("Sea", "Night", "Road")]


def run_cli(*argv: object) -> int:
    return cli.main([str(a) for a in argv])


def _one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"distmatch-eval {command}: error: "), err
    return lines[0]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


RECORDS = [
    {"id": "p0", "prompt": PROMPTS[0], "samples": ["the sea is blue and deep", "waves on the old stone"]},
    {"id": "p1", "prompt": PROMPTS[1], "samples": ["a quiet night with stars", "the night is cold"]},
    {"id": "p2", "prompt": PROMPTS[2], "samples": ["an old road in the rain", "the road goes on"]},
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("input_files") / "causal_lm", seed=0)


# ---------------------------------------------------------------------------------------------------------------
# The same prompt twice


def test_a_file_holding_its_prompts_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    twice = _write_jsonl(tmp_path / "twice.jsonl", RECORDS + RECORDS)  # `cat run.jsonl run.jsonl`
    assert run_cli("diversity", twice, "--metrics", "ngram", "--no-progress") == 2
    line = _one_error_line(capsys, "diversity")
    assert f'{twice}: records #0 and #3 have the same id "p0"' in line and "would count twice" in line, line
    assert not twice.with_suffix(".diversity.json").exists()
    # report scores samples files too
    assert run_cli("report", "--run", f"x={twice}", "-o", tmp_path / "r") == 2
    assert "have the same id" in _one_error_line(capsys, "report")
    gsm = [{"id": i, "answer": "#### 2", "samples": ["The answer is 2", "no"]} for i in range(2)]
    gsm_twice = _write_jsonl(tmp_path / "gsm.jsonl", gsm + gsm[:1])
    assert run_cli("voting", "--samples", gsm_twice, "--task", "gsm8k", "-o", tmp_path / "v.json") == 2
    assert "records #0 and #2 have the same id 0" in _one_error_line(capsys, "voting")
    # an lm-eval samples file: its key is doc_id
    lm_eval = [{"doc_id": 0, "doc": {"gold": "2"}, "filtered_resps": [["The answer is 2"]]}] * 2
    lm_eval_twice = _write_jsonl(tmp_path / "samples_distmatch_gsm8k.jsonl", lm_eval)
    assert run_cli("voting", "--samples", lm_eval_twice, "--task", "gsm8k", "-o", tmp_path / "v.json") == 2
    assert "have the same doc_id 0" in _one_error_line(capsys, "voting")
    refs = _write_jsonl(
        tmp_path / "refs.jsonl", [{"id": "p0", "reference": "a"}, {"id": "p0", "reference": "b"}]
    )
    once = _write_jsonl(tmp_path / "once.jsonl", RECORDS)
    assert run_cli("diversity", once, "--metrics", "mauve", "--references", refs, "--no-progress") == 2
    assert f'{refs}: records #0 and #1 have the same id "p0"' in _one_error_line(capsys, "diversity")
    assert run_cli("diversity", once, "--metrics", "ngram", "--no-progress") == 0
    assert json.loads(once.with_suffix(".diversity.json").read_text())["num_prompts"] == 3


def test_the_console_command_refuses_in_one_line(tmp_path: Path) -> None:
    """`python -m eval_tasks.cli` from the repository root (this checkout's code), as the console script runs it."""
    twice = _write_jsonl(tmp_path / "twice.jsonl", RECORDS + RECORDS)
    torn = tmp_path / "torn.jsonl"
    torn.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps(RECORDS[1])[:30], encoding="utf-8")
    for path, expected in ((twice, "have the same id"), (torn, "the last line is cut off")):
        done = subprocess.run(
            [sys.executable, "-m", "eval_tasks.cli", "diversity", str(path), "--metrics", "ngram"],
            cwd=REPO_ROOT,
            env={"PATH": "/usr/bin:/bin", **OFFLINE_ENV},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("distmatch-eval diversity: error: ") and expected in done.stderr


@pytest.mark.launches
def test_an_sbert_model_that_cannot_be_loaded_is_refused_in_one_line_before_scoring(tmp_path: Path) -> None:
    """`diversity --sbert-model NAME` with a Hub name the Hub cannot give (a closed loopback port as the Hub, the Hub
    client online) or, offline, one not in the cache: one line naming the flag, why and what is accepted, before
    any scoring, and without the Hub client's retries (the message was two lines, and online came after about 70 s
    of retries and after the other metrics were computed). The same as lm-eval's pre-flight (tests/eval/lm_eval_tasks/
    test_preflight.py). In a process of its own: the Hub settings are read when huggingface_hub is imported."""
    path = _write_jsonl(tmp_path / "s.jsonl", RECORDS)
    hub = {"HF_HOME": str(tmp_path / "hf_home")}
    cases = [
        (
            {**hub, "HF_ENDPOINT": "http://127.0.0.1:9"},
            "the Hugging Face Hub (http://127.0.0.1:9) cannot be reached",
        ),
        (
            {**hub, **OFFLINE_ENV},
            "it is not in the local Hugging Face cache and the Hub is off (HF_HUB_OFFLINE)",
        ),
    ]
    for env, reason in cases:
        done = subprocess.run(
            [sys.executable, "-m", "eval_tasks.cli", "diversity", str(path), "--sbert-model", "models/sbert"],
            cwd=REPO_ROOT,
            env={"PATH": "/usr/bin:/bin", **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(
            f"distmatch-eval diversity: error: --sbert-model models/sbert: cannot be loaded: {reason}"
        ), done.stderr
        assert "leave it out for the offline default." in done.stderr and "diversity:" not in done.stdout
        assert not path.with_suffix(".diversity.json").exists()


# ---------------------------------------------------------------------------------------------------------------
# Prompts whose samples are all empty


def test_allow_empty_scores_a_prompt_of_empty_samples_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [RECORDS[0], {"id": "blank", "prompt": PROMPTS[1], "samples": ["", "  \n"]}]
    path = _write_jsonl(tmp_path / "s.jsonl", rows)
    assert run_cli("diversity", path, "--no-progress") == 2
    line = _one_error_line(capsys, "diversity")
    assert "prompt #1 (id='blank'): sample(s) [0, 1] are empty" in line and "--allow-empty" in line, line
    out = tmp_path / "d.json"
    assert run_cli("diversity", path, "--allow-empty", "--no-progress", "-o", out) == 0  # all three metrics
    assert "1 prompt(s) with only empty samples scored 0 on every metric" in capsys.readouterr().err
    result = json.loads(out.read_text())
    blank = result["per_prompt"][1]
    assert blank == {
        "id": "blank",
        "num_samples": 2,
        "ngram_diversity": 0.0,
        "self_bleu_diversity": 0.0,  # sacrebleu alone would call two empty strings 100 % diverse
        "sbert_diversity": 0.0,
        "all_empty": True,
    }
    first = result["per_prompt"][0]
    for key, value in result["metrics"].items():
        assert value == pytest.approx(first[key] / 2), key  # the mean over both prompts
    assert result["settings"]["all_empty_prompts"] == 1
    # the lm-eval creative-writing tasks score such a prompt the same way (docs/evaluation.md)
    from eval_tasks.creative.creative import diversity_scores

    assert diversity_scores(["", " ", "\n"]) == {key: 0.0 for key in blank if key.endswith("_diversity")}
    # a prompt with some empty samples is scored as it is
    some = _write_jsonl(tmp_path / "some.jsonl", [{"id": 0, "samples": ["a b c", ""]}])
    assert run_cli("diversity", some, "--metrics", "ngram", "--allow-empty", "--no-progress", "-o", out) == 0
    assert json.loads(out.read_text())["metrics"]["ngram_diversity"] == pytest.approx(100.0)


# ---------------------------------------------------------------------------------------------------------------
# Sentence-BERT diversity per prompt when some prompts' samples are all empty


def test_voting_records_no_answer_for_a_number_beyond_float_range(tmp_path: Path) -> None:
    huge = "The answer is -" + "1" * 400
    rows = [
        {
            "id": 0,
            "answer": "#### 7",
            "samples": [huge, "The answer is 7", "The answer is " + "1" * 400 + "/3"],
        },
        {
            "id": 1,
            "answer": "#### 3",
            "samples": ["The answer is 3", "The answer is 1/00", "The answer is 3"],
        },
    ]
    path = _write_jsonl(tmp_path / "gsm.jsonl", rows)
    out = tmp_path / "curve.json"
    assert run_cli("voting", "--samples", path, "--task", "gsm8k", "-o", out) == 0
    # q0 answers None, 7, None; q1 3, None, 3. k=1: MV/BON q1 only -> 50; k=2: MV q0 tie None/7 -> None, BON 100.
    assert json.loads(out.read_text())["curve"] == {
        "mv@1": 50.0,
        "bon@1": 50.0,
        "mv@2": 50.0,
        "bon@2": 100.0,
        "mv@3": 50.0,
        "bon@3": 100.0,
    }


# ---------------------------------------------------------------------------------------------------------------
# A reward model without a trained score head


def test_reward_refuses_a_model_without_a_trained_score_head(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = _write_jsonl(tmp_path / "s.jsonl", [{"id": 0, "prompt": "hi", "samples": ["a", "b"]}])
    out = tmp_path / "r.json"
    assert run_cli("reward", "--samples", samples, "--reward-model", model, "-o", out) == 2
    line = _one_error_line(capsys, "reward")
    assert f"--reward-model {model} is a LlamaForCausalLM checkpoint (config.json 'architectures')" in line, (
        line
    )
    assert not out.exists()
    # without `architectures` in config.json: found by the weights the checkpoint lacks
    bare = tmp_path / "bare"
    bare.mkdir()
    for file in model.iterdir():
        (bare / file.name).write_bytes(file.read_bytes())
    config = json.loads((bare / "config.json").read_text())
    del config["architectures"]
    (bare / "config.json").write_text(json.dumps(config))
    assert run_cli("reward", "--samples", samples, "--reward-model", bare, "-o", out) == 2
    line = _one_error_line(capsys, "reward")
    assert f"--reward-model {bare}: its checkpoint has no weights for score.weight" in line, line
    assert not out.exists()
    # the lm-eval AlpacaEval best-of-n task: refused by the pre-flight, before the evaluated model samples
    from distmatch.errors import DistMatchConfigError
    from eval_tasks.lm_eval_tasks.preflight import preflight

    with pytest.raises(
        DistMatchConfigError, match=rf"reward_model='{re.escape(str(model))}' is a LlamaForCausalLM"
    ):
        preflight(["distmatch_alpacaeval_bon"], {"reward_model": str(model)}, [])


# ---------------------------------------------------------------------------------------------------------------
# Files that are not UTF-8


def test_a_file_that_is_not_utf8_is_refused_naming_file_and_line(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"id": 0, "samples": ["a b", "c d"]}\n{"id": 1, "samples": ["caf\xe9", "b"]}\n')
    assert run_cli("diversity", latin, "--no-progress") == 2
    line = _one_error_line(capsys, "diversity")
    assert f"{latin}:2: not UTF-8 (byte 0xe9 at column 27)" in line and "iconv" in line, line
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes("first\nsecond caf\xe9\n".encode("latin-1"))
    out = tmp_path / "o.jsonl"
    assert run_cli("generate", "--model", model, "--prompts", prompts, "-o", out, "--no-progress") == 2
    assert f"{prompts}:2: not UTF-8 (byte 0xe9 at column 11)" in _one_error_line(capsys, "generate")
    assert not out.exists()
    assert run_cli("report", "--run", f"x={latin}", "-o", tmp_path / "r") == 2
    assert f"{latin}:2: not UTF-8" in _one_error_line(capsys, "report")
    assert run_cli("voting", "--samples", latin, "--task", "gsm8k", "-o", tmp_path / "v.json") == 2
    assert f"{latin}:2: not UTF-8" in _one_error_line(capsys, "voting")


# ---------------------------------------------------------------------------------------------------------------
# A prompt longer than the model's context


def test_a_prompt_longer_than_the_context_keeps_its_last_tokens_as_lm_eval_does(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """lm-eval's HF backend (generate_until) keeps the last `max_length - max_gen_toks` tokens of a context, chat
    template included, with a warning; `generate` did not look at the context at all (the tiny model's is 256)."""
    from transformers import AutoTokenizer

    long_text = " ".join(f"the river {i} runs past the mill" for i in range(300))  # about 2,000 tokens
    rows = [
        {"id": "long", "prompt": long_text},
        {"id": "short", "prompt": PROMPTS[0]},
        {"id": "raw", "text": long_text},
    ]
    prompts = _write_jsonl(tmp_path / "p.jsonl", rows)
    out = tmp_path / "o.jsonl"
    flags = ["-k", "2", "--max-new-tokens", "6", "--no-progress"]
    assert run_cli("generate", "--model", model, "--prompts", prompts, "-o", out, *flags) == 0
    err = capsys.readouterr().err
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    assert warning == (
        "distmatch-eval generate: warning: 2 prompt(s) ('long', 'raw') longer than the 250 tokens the context leaves "
        "(256, max_position_embeddings in its config, less --max-new-tokens 6): their last tokens are kept, as "
        "lm-eval does (input_truncated in their records)."
    ), err
    records = {r["id"]: r for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    tokenizer = AutoTokenizer.from_pretrained(model)
    # lm-eval: the whole context encoded (the chat template, or the text with the tokenizer's special tokens), then
    # its last max_length - max_gen_toks tokens
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": long_text}], tokenize=False, add_generation_prompt=True
    )
    for key, whole in (("long", tokenizer(chat, add_special_tokens=False)), ("raw", tokenizer(long_text))):
        kept = whole["input_ids"][-250:]
        assert len(whole["input_ids"]) > 1000 and records[key]["input_truncated"] is True
        assert records[key]["input_text"] == tokenizer.decode(kept, skip_special_tokens=False), key
        assert (
            records[key]["prompt"] == long_text and len(records[key]["samples"]) == 2
        )  # the prompt as given
    assert records["long"]["input_text"].endswith("<|assistant|>")  # the end of the template is kept
    assert "input_truncated" not in records["short"]
    assert records["short"]["input_text"].startswith("<|user|>" + PROMPTS[0])


def test_max_new_tokens_that_leave_no_room_for_the_prompt_are_refused(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """lm-eval refuses max_gen_toks >= max_length (an assertion); generate ran past the context (GEM's 512 new tokens
    on the tiny model's 256)."""
    prompts = _write_jsonl(tmp_path / "p.jsonl", [{"id": 0, "prompt": PROMPTS[0]}])
    out = tmp_path / "o.jsonl"
    for tokens in ("512", "256"):
        assert (
            run_cli(
                "generate",
                "--model",
                model,
                "--prompts",
                prompts,
                "-o",
                out,
                "-k",
                "2",
                "--max-new-tokens",
                tokens,
                "--no-progress",
            )
            == 2
        )
        line = _one_error_line(capsys, "generate")
        assert line == (
            f"distmatch-eval generate: error: --max-new-tokens {tokens}: {model} has a context of 256 tokens "
            "(max_position_embeddings in its config), which leaves no room for the prompt; give at most 255 (lm-eval "
            "refuses it the same way)."
        ), line
        assert not out.exists()


def _peak_rss_mb(argv: list[str], cwd: Path, limit_mb: int) -> tuple[int, int, str]:
    """(exit status, peak resident memory in MB, stderr) of a command, stopped (exit -9) once above `limit_mb`."""
    import os
    import signal
    import time

    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", **OFFLINE_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    peak, started = 0, time.monotonic()
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            break
        rss = (
            next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
            // 1024
        )
        peak = max(peak, rss)
        if rss > limit_mb or time.monotonic() - started > 300:
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.05)
    _, err = proc.communicate()
    return proc.returncode, peak, err.decode(errors="replace")


@pytest.mark.launches
def test_a_huge_one_line_prompt_costs_what_its_kept_tokens_cost(model: Path, tmp_path: Path) -> None:
    """A 20 MB one-line prompt grew `generate` to 22.5 GB until the kernel killed it (tokenizing it alone
    takes about 230 bytes a character: 4.6 GB). Only a tail long enough for the kept tokens is tokenized now, so a
    4 MB prompt costs about what a short one does: the command is stopped if it needs 400 MB more."""
    huge = _write_jsonl(
        tmp_path / "huge.jsonl", [{"id": "huge", "prompt": "the river runs past the mill " * 140_000}]
    )
    short = _write_jsonl(tmp_path / "short.jsonl", [{"id": "short", "prompt": PROMPTS[0]}])
    runs = {}
    for name, prompts in (("short", short), ("huge", huge)):
        argv = [
            sys.executable,
            "-m",
            "eval_tasks.cli",
            "generate",
            "--model",
            str(model),
            "--prompts",
            str(prompts),
            "-o",
            str(tmp_path / f"{name}.out.jsonl"),
            "-k",
            "2",
            "--max-new-tokens",
            "6",
            "--no-progress",
        ]
        runs[name] = _peak_rss_mb(argv, REPO_ROOT, limit_mb=runs["short"][1] + 400 if runs else 4000)
        assert runs[name][0] == 0, (name, runs[name])
    assert runs["huge"][1] < runs["short"][1] + 400, runs
    assert "1 prompt(s) ('huge') longer than the 250 tokens the context leaves" in runs["huge"][2]
    (record,) = map(json.loads, (tmp_path / "huge.out.jsonl").read_text(encoding="utf-8").splitlines())
    assert record["input_truncated"] is True and record["input_text"].endswith("<|assistant|>")
    assert len(record["prompt"]) == 29 * 140_000


# ---------------------------------------------------------------------------------------------------------------
# An interrupted generate


def _generate(model: Path, prompts: Path, out: Path, *extra: str) -> int:
    flags = ["-k", "2", "--max-new-tokens", "6", "--batch-size", "1", "--no-progress"]
    return run_cli("generate", "--model", model, "--prompts", prompts, "-o", out, *flags, *extra)


def test_a_cut_off_last_line_says_how_to_continue(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = _write_jsonl(
        tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)]
    )
    whole, out = tmp_path / "whole.jsonl", tmp_path / "o.jsonl"
    assert _generate(model, prompts, whole) == 0
    data = whole.read_bytes()
    first_two = data.index(b"\n", data.index(b"\n") + 1) + 1
    out.write_bytes(data[: first_two - 40])  # killed while writing the second record
    capsys.readouterr()
    assert _generate(model, prompts, out, "--resume") == 2
    line = _one_error_line(capsys, "generate")
    keep = data.index(b"\n") + 1
    assert f"{out}:2: the last line is cut off" in line, line
    assert (
        f"remove it (truncate -s {keep} {out}), then run the same generate command with --resume" in line
    ), line
    # diversity says the same
    assert run_cli("diversity", out, "--metrics", "ngram", "--no-progress") == 2
    assert f"{out}:2: the last line is cut off" in _one_error_line(capsys, "diversity")
    with out.open("r+b") as f:  # what the line says to do
        f.truncate(keep)
    assert _generate(model, prompts, out, "--resume") == 0
    assert out.read_bytes() == data  # the same records as the uninterrupted run (same seed and batch size)


def test_resume_after_a_last_record_without_line_end_keeps_one_record_a_line(
    model: Path, tmp_path: Path
) -> None:
    prompts = _write_jsonl(
        tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)]
    )
    out = tmp_path / "o.jsonl"
    assert _generate(model, prompts, out, "--limit", "1") == 0
    out.write_bytes(out.read_bytes().rstrip(b"\n"))  # e.g. saved by an editor that drops the final line end
    assert _generate(model, prompts, out, "--resume") == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["p0", "p1", "p2"]


# ---------------------------------------------------------------------------------------------------------------
# Found by probing: flag values and records that ended in a traceback, a silent change or a late error


def test_limit_and_non_finite_sampling_values_are_refused_before_the_model_loads(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = _write_jsonl(
        tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)]
    )
    out = tmp_path / "o.jsonl"
    for flags, expected in (
        (["--limit", "-1"], "--limit -1: must be >= 1"),  # slicing read it as "all but the last prompt"
        (["--limit", "0"], "--limit 0: must be >= 1"),  # an empty file
        (["--temperature", "nan"], "need a finite --temperature >= 0"),  # failed after the model loaded
        (["--temperature", "inf"], "need a finite --temperature >= 0"),
    ):
        assert (
            run_cli("generate", "--model", tmp_path / "no_model", "--prompts", prompts, "-o", out, *flags)
            == 2
        )
        assert expected in _one_error_line(capsys, "generate"), flags
        assert not out.exists()
    assert run_cli("nexttoken", "--model", model, "--probes", "none", "--limit", "0", "-o", out) == 2
    assert "--limit 0: must be >= 1" in _one_error_line(capsys, "nexttoken")
    samples = _write_jsonl(tmp_path / "s.jsonl", RECORDS)
    assert run_cli("diversity", samples, "--n-max", "0", "--no-progress") == 2
    assert "need --n-max >= 1 and --batch-size >= 1, got 0 and 64" in _one_error_line(capsys, "diversity")


def test_a_byte_order_mark_is_read_past(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bom = tmp_path / "bom.jsonl"  # what some Windows editors write
    bom.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in RECORDS).encode())
    out = tmp_path / "d.json"
    assert run_cli("diversity", bom, "--metrics", "ngram", "--no-progress", "-o", out) == 0
    assert json.loads(out.read_text())["num_prompts"] == 3
    capsys.readouterr()
    bom.write_bytes(b'\xef\xbb\xbf{"id": 0, "samples": ["caf\xe9", "b"]}\n')
    assert run_cli("diversity", bom, "--no-progress") == 2  # the column does not count the mark
    assert f"{bom}:1: not UTF-8 (byte 0xe9 at column 27)" in _one_error_line(capsys, "diversity")


def test_voting_refuses_malformed_records_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "v.json"
    for rows, expected in (
        ([["The answer is 2"]], "record 0 is a list, expected an object"),  # was an AttributeError traceback
        ([{"doc": {"gold": "2"}, "filtered_resps": []}], "record 0 holds no list of sampled responses"),
        ([{"gold": "2", "samples": {"a": 1}}], "record 0 holds no list of sampled responses"),
        ([{"gold": "two", "samples": ["The answer is 2"]}], "record 0: gold 'two' is not a number"),
    ):
        path = _write_jsonl(tmp_path / "s.jsonl", rows)
        assert run_cli("voting", "--samples", path, "--task", "gsm8k", "-o", out) == 2
        assert f"{path}: {expected}" in _one_error_line(capsys, "voting")
    path = _write_jsonl(tmp_path / "s.jsonl", [{"gold": "1,200", "samples": ["The answer is 1200", "no"]}])
    assert run_cli("voting", "--samples", path, "--task", "gsm8k", "-o", out) == 0  # read as answers are
    assert json.loads(out.read_text())["curve"]["bon@1"] == 100.0
