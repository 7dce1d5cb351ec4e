"""``distmatch-eval``: sample from checkpoints, score diversity / next-token statistics, and build comparison reports.

Subcommands (``distmatch-eval <cmd> --help`` for every flag):

* ``generate``  K samples per prompt from a checkpoint -> JSONL (HF ``generate``; vLLM when installed and a GPU is
  present). Defaults are GEM's creative-writing settings: 16 samples, temperature 1.0, top-k 50, top-p 0.9, up to
  512 new tokens; the tokenizer's chat template is applied when it has one. A prompt longer than the model's context
  less the new tokens keeps its last tokens, as lm-eval does, with a warning.
* ``diversity`` n-gram / Self-BLEU / Sentence-BERT diversity (and MAUVE against references) of such a JSONL -> JSON.
* ``nexttoken`` perplexity, mean token entropy, mean top-1 probability of a checkpoint on a dataset, and the
  next-token distributions of a few prompts (GEM figure 6) -> JSON.
* ``report``    several runs (lm-eval result JSONs, diversity / nexttoken JSONs, trainer_state.json) -> a markdown
  report with the papers' published numbers side by side, plus PNG plots.
* ``voting`` / ``reward`` first-k curves (MV@k, BON@k; Reward / Win Rate BON@k) over a run's saved samples.
* ``open-ended`` EMO's open-ended generation protocol: ``prompts`` of a corpus, ``score`` (MAUVE, ROUGE, oracle PPL).
* ``alpacaeval`` AlpacaEval's prompts, the outputs export, and the judge's annotations -> win rate.
* ``novelty``   NoveltyBench's distinct / utility of a samples file (its classifier and reward model) -> JSON.

Errors in the input (a prompt with fewer than 2 samples, empty samples, unknown models, missing optional
dependencies, unreadable files, files that are not UTF-8, a cut-off last line, an existing ``generate -o`` file
without ``--overwrite``, ``--resume`` into a file made with other settings, ``--max-new-tokens`` at or above the model's
context, ``diversity`` on a file whose records were made with different settings or that holds a prompt twice, a
``--sbert-model`` that cannot be loaded) end the command with exit status 2 and a one-line
message; set ``DISTMATCH_EVAL_DEBUG=1`` for the traceback.

One module per command group registers its subcommands (``add_commands``) and maps their flags onto the library:
:mod:`.sampling` (generate, diversity, nexttoken), :mod:`.report`, :mod:`.bon` (voting, reward),
:mod:`.open_ended`, :mod:`.alpacaeval` and :mod:`.novelty`. Nothing of the library imports this package.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from eval_tasks import metrics as M
from eval_tasks.cli import alpacaeval, bon, novelty, open_ended, report, sampling
from eval_tasks.samples import InputError

__all__ = ["build_parser", "main"]

#: The command groups in the order ``--help`` lists their subcommands.
COMMAND_GROUPS = (sampling, report, bon, open_ended, alpacaeval, novelty)


def _quiet_progress_bars() -> None:
    """--no-progress: also silence transformers' / huggingface_hub's own progress bars (weight loading)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distmatch-eval",
        description="Diversity / distribution metrics of the EMO and GEM papers and comparison reports.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "no_progress", False):
        _quiet_progress_bars()
    try:
        return int(args.func(args) or 0)
    except (InputError, M.DiversityInputError, ValueError, ImportError, OSError, LookupError) as err:
        if os.environ.get("DISTMATCH_EVAL_DEBUG") == "1":
            raise
        print(f"distmatch-eval {args.command}: error: {err}", file=sys.stderr)
        return 2
