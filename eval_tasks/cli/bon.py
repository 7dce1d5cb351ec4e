"""``distmatch-eval voting`` and ``distmatch-eval reward``: first-k curves over saved samples (GEM Figure 2's shape).

lm-eval reports one number per metric and k; these commands read the samples a run saved and give every k from 1
to the sample count:

* ``voting`` - GSM8K / MATH answers of saved samples -> MV@k and BON@k (coverage) for k = 1..n, x100.
* ``reward`` - scores saved chat samples, and the GPT-4 reference outputs, with any sequence-classification reward
  model -> Reward BON@k and Win Rate BON@k for k = 1..n, plus every reward (to re-curve without the model).

Inputs: an lm-eval samples file of ``distmatch_gsm8k`` / ``distmatch_math`` / ``distmatch_alpacaeval_bon``
(``--log_samples``: ``doc`` and ``filtered_resps``), or a ``distmatch-eval generate`` JSONL (``prompt``,
``samples``) with the gold answer (``gold``; GSM8K ``answer`` with "#### n"; MATH ``solution``) or the reference
(``reference``, or ``--references`` = the alpaca_eval repository's ``model_outputs.json``, matched by instruction).

Reading the samples and the curves are :mod:`eval_tasks.best_of_n`'s (``read_sampled``, ``voting_curve``). The
output JSON (``kind``: ``distmatch.voting`` / ``distmatch.reward``; ``task``: the published benchmark id, ``curve``:
metric@k -> value) is read by ``distmatch-eval report``, which plots the curves beside GEM's published points.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from eval_tasks import samples as S
from eval_tasks.best_of_n import best_of_n as B
from eval_tasks.samples import InputError

__all__ = ["add_commands", "cmd_reward", "cmd_voting"]


def cmd_voting(args: argparse.Namespace) -> int:
    records = B.read_sampled(args.samples)
    curve = B.voting_curve(records, args.task, args.math_checker, args.samples)
    n = len(records[0]["samples"])
    result = {
        "kind": "distmatch.voting",
        "task": args.task,
        "samples_file": str(args.samples),
        "num_questions": len(records),
        "num_samples": n,
        "math_checker": args.math_checker if args.task == "math" else None,
        "curve": curve,
    }
    S.write_json(args.output, result)
    _print_table("k", ["mv", "bon"], curve, n)
    return 0


def cmd_reward(args: argparse.Namespace) -> int:
    from eval_tasks.metrics.voting import reward_best_of_n, win_rate_best_of_n

    records = B.read_sampled(args.samples)
    n = B.sample_count(records, args.samples)
    if args.references:
        by_prompt = B.rows_by_prompt(S.read_jsonl(args.references))
        for i, r in enumerate(records):
            ref = by_prompt.get(str(r["prompt"]))
            if ref is None:
                raise InputError(f"{args.references}: no reference output for the prompt of record {i}.")
            r["reference"] = ref["output"]
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}.")
    scorer = B.RewardScorer(
        args.reward_model,
        batch_size=args.batch_size,
        device=args.device,
        setting=f"--reward-model {args.reward_model}",
    )
    rewards, refs, rows = [], [], []
    for r in records:
        texts = list(r["samples"]) + ([str(r["reference"])] if r["reference"] is not None else [])
        scores = scorer.score([str(r["prompt"])] * len(texts), texts)
        rewards.append(scores[:n])
        refs.append(scores[n] if r["reference"] is not None else None)
        rows.append({"prompt": r["prompt"], "rewards": scores[:n], "reference_reward": refs[-1]})
    curve = reward_best_of_n(rewards, ks=range(1, n + 1))
    if all(x is not None for x in refs):
        curve.update(win_rate_best_of_n(rewards, [float(x) for x in refs], ks=range(1, n + 1)))
    elif any(x is not None for x in refs):
        raise InputError(f"{args.samples}: some records have a reference output and some do not.")
    result = {
        "kind": "distmatch.reward",
        "task": "alpacaeval_bon",
        "samples_file": str(args.samples),
        "reward_model": args.reward_model,
        "num_questions": len(records),
        "num_samples": n,
        "curve": curve,
        "records": rows,
    }
    S.write_json(args.output, result)
    _print_table("k", ["reward_bon", "win_rate_bon"], curve, n)
    return 0


def _print_table(head: str, metrics: list[str], curve: Mapping[str, float], n: int) -> None:
    shown = [m for m in metrics if f"{m}@1" in curve]
    print(" | ".join([head, *shown]))
    for k in range(1, n + 1):
        print(" | ".join([str(k), *(f"{curve[f'{m}@{k}']:.2f}" for m in shown)]))
    sys.stdout.flush()


def add_commands(sub: Any) -> None:
    """Register ``voting`` and ``reward`` on distmatch-eval's subparsers."""
    v = sub.add_parser("voting", help="GSM8K / MATH samples -> MV@k and BON@k (coverage) for k = 1..n")
    v.add_argument(
        "--samples", required=True, help="lm-eval samples_*.jsonl or distmatch-eval generate JSONL"
    )
    v.add_argument(
        "--task", required=True, choices=("gsm8k", "math"), help="how answers are read and compared"
    )
    v.add_argument("--math-checker", choices=("hendrycks", "math_verify"), default="hendrycks")
    v.add_argument("-o", "--output", required=True, help="output JSON (the curve)")
    v.set_defaults(func=cmd_voting)
    r = sub.add_parser(
        "reward", help="score chat samples with a reward model -> Reward / Win Rate BON@k, k = 1..n"
    )
    r.add_argument(
        "--samples", required=True, help="lm-eval samples_*.jsonl or distmatch-eval generate JSONL"
    )
    r.add_argument(
        "--reward-model", required=True, help="sequence-classification reward model (Hub id or folder)"
    )
    r.add_argument(
        "--references",
        help="reference outputs (JSON list / JSONL with instruction, output), e.g. gpt4_1106_preview",
    )
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    r.add_argument("-o", "--output", required=True, help="output JSON (curve and every reward)")
    r.set_defaults(func=cmd_reward)
