"""``distmatch-eval report``: collect several runs' results and write a markdown report with PNG plots.

A run is a name and one or more files or folders. Files are recognised by content:

* lm-eval results (``results_*.json``: ``results`` + ``configs``/``versions``) - every task's metrics;
* ``distmatch-eval diversity`` output (``kind: distmatch.diversity``), or a ``generate`` JSONL (scored here with
  the default settings);
* ``distmatch-eval nexttoken`` output (``kind: distmatch.nexttoken``);
* a Trainer's ``trainer_state.json`` (``log_history``); in a folder, the one with the highest ``global_step``.

The papers' numbers (``eval_tasks.published``) are shown under the runs for every benchmark the runs have, with
the paper and table of each row; protocol differences that make a comparison unfair are listed under each table.
"""

from __future__ import annotations

from eval_tasks.report.build import build_report
from eval_tasks.report.collect import ReportError, RunData, collect_run, parse_run_specs
from eval_tasks.report.labels import DIVERSITY_METRICS, METRIC_TITLES

__all__ = [
    "DIVERSITY_METRICS",
    "METRIC_TITLES",
    "ReportError",
    "RunData",
    "build_report",
    "collect_run",
    "parse_run_specs",
]
