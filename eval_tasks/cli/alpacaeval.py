"""``distmatch-eval alpacaeval`` (``prompts``, ``export``, ``winrate``): AlpacaEval (EMO Tables 9-10) around the
judging, which runs outside with the user's judge; the formats and the win rate are :mod:`eval_tasks.chat.alpacaeval`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from eval_tasks import samples
from eval_tasks.chat import alpacaeval as A
from eval_tasks.samples import InputError

__all__ = ["add_commands", "cmd_alpacaeval"]


def _read_list(path: str | Path, what: str) -> list[Any]:
    file = Path(path)
    if not file.is_file():
        raise InputError(f"{what} {file}: no such file.")
    try:
        data = json.loads(samples.read_text(file))
    except json.JSONDecodeError:
        data = samples.read_jsonl(file)
    if not isinstance(data, list):
        raise InputError(f"{what} {file}: expected a JSON list of records.")
    return data


def cmd_alpacaeval(args: argparse.Namespace) -> int:
    if args.step == "prompts":
        records = A.prompt_records(_read_list(args.eval_set, "--eval-set"))
        samples.write_jsonl(args.output, records)
    elif args.step == "export":
        rows, prompts = samples.read_jsonl(args.samples), samples.read_jsonl(args.prompts)
        Path(args.output).write_text(
            json.dumps(A.export_outputs(rows, args.generator, prompts), indent=2) + "\n"
        )
    else:
        samples.write_json(
            args.output, A.win_rate(_read_list(args.annotations, "annotations"), args.generator)
        )
    print(f"distmatch-eval alpacaeval {args.step}: -> {args.output}", file=sys.stderr)
    return 0


def add_commands(sub: Any) -> None:
    """Register ``alpacaeval`` (``prompts``, ``export``, ``winrate``) on distmatch-eval's subparsers."""
    top = sub.add_parser(
        "alpacaeval", help="AlpacaEval: Alpaca-format prompts, outputs export, annotations -> win rate"
    )
    steps = top.add_subparsers(dest="step", required=True, metavar="{prompts,export,winrate}")
    p = steps.add_parser(
        "prompts", help="AlpacaEval evaluation set -> generate prompts (Stanford-Alpaca format)"
    )
    p.add_argument(
        "--eval-set", required=True, help="AlpacaEval's evaluation set (JSON list with 'instruction')"
    )
    p.add_argument("-o", "--output", required=True)
    e = steps.add_parser("export", help="generate JSONL -> AlpacaEval model_outputs.json")
    e.add_argument("samples", help="distmatch-eval generate output of the alpacaeval prompts")
    e.add_argument("--generator", required=True, help="the model's name in the outputs")
    e.add_argument("--prompts", required=True, help="the alpacaeval prompts JSONL (instructions and subsets)")
    e.add_argument("-o", "--output", required=True)
    w = steps.add_parser("winrate", help="alpaca_eval annotations.json -> win rate JSON")
    w.add_argument("annotations", help="annotations.json written by alpaca_eval")
    w.add_argument("--generator", help="generator_2 to score (default: the only one)")
    w.add_argument("-o", "--output", required=True)
    for parser in (p, e, w):
        parser.set_defaults(func=cmd_alpacaeval)
