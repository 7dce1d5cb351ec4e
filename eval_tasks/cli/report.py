"""``distmatch-eval report``: several runs' result files -> a markdown report with the papers' published numbers
side by side, plus PNG plots (:mod:`eval_tasks.report`, imported when the command runs: it loads matplotlib)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_commands", "cmd_report"]


def cmd_report(args: argparse.Namespace) -> int:
    from eval_tasks import report

    runs = report.parse_run_specs(args.run)
    written = report.build_report(
        runs,
        Path(args.output),
        title=args.title,
        published=not args.no_published,
        published_model=args.published_model,
    )
    print(f"distmatch-eval report: {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0


def add_commands(sub: Any) -> None:
    """Register ``report`` on distmatch-eval's subparsers."""
    r = sub.add_parser("report", help="runs -> markdown report + PNG plots, with the papers' numbers")
    r.add_argument(
        "--run",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a run's file or folder (lm-eval results_*.json, *.diversity.json, nexttoken JSON, trainer_state.json; "
        "folders are searched recursively); repeat, also with the same NAME for several files",
    )
    r.add_argument("-o", "--output", required=True, help="output folder (report.md, report.json, *.png)")
    r.add_argument("--title", default="distmatch evaluation report")
    r.add_argument(
        "--published-model", help="only published rows whose base model contains this (e.g. llama-7b)"
    )
    r.add_argument("--no-published", action="store_true", help="leave the papers' numbers out")
    r.set_defaults(func=cmd_report)
