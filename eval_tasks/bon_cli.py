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

The output JSON (``kind``: ``distmatch.voting`` / ``distmatch.reward``; ``task``: the published benchmark id, ``curve``:
metric@k -> value) is read by ``distmatch-eval report``, which plots the curves beside GEM's published points.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from eval_tasks import samples as S
from eval_tasks.samples import InputError

__all__ = ["add_commands", "cmd_reward", "cmd_voting", "read_sampled", "voting_curve"]


def read_sampled(path: str) -> list[dict[str, Any]]:
    """Records ``{"prompt", "samples", "gold", "reference"}`` of an lm-eval samples file or a generate JSONL."""
    out = []
    records = S.read_jsonl(path)
    S.check_unique_ids(
        records, path, "doc_id" if any("doc_id" in r for r in records if isinstance(r, dict)) else "id"
    )
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise InputError(f"{path}: record {i} is a {type(record).__name__}, expected an object.")
        doc = record.get("doc") if isinstance(record.get("doc"), Mapping) else record
        if "filtered_resps" in record:
            filtered = record["filtered_resps"]  # lm-eval: [[the n responses]]
            responses = filtered[0] if isinstance(filtered, list) and filtered else None
        elif "samples" in record:
            responses = record["samples"]
        else:
            raise InputError(
                f"{path}: record {i} has neither filtered_resps (lm-eval) nor samples (generate)."
            )
        if not isinstance(responses, list) or not responses:
            raise InputError(f"{path}: record {i} holds no list of sampled responses.")
        out.append(
            {
                "prompt": doc.get("prompt", doc.get("instruction", doc.get("question"))),
                "samples": [str(s) for s in responses],
                "gold": doc.get("gold"),
                "answer": doc.get("answer"),
                "solution": doc.get("solution", doc.get("output")),
                "reference": doc.get("reference"),
            }
        )
    if not out:
        raise InputError(f"{path}: no records.")
    return out


def _gold(record: Mapping[str, Any], task: str, where: str) -> str:
    from eval_tasks.math_answers import gsm8k_gold_answer, math_gold_answer

    if record["gold"] is not None:
        return str(record["gold"])
    if task == "gsm8k" and record["answer"] is not None:
        return str(gsm8k_gold_answer(str(record["answer"])))
    if task == "math" and record["solution"] is not None:
        gold = math_gold_answer(str(record["solution"]))
        if gold is None:  # else the string "None" would be the gold answer
            raise InputError(
                f"{where}: no gold answer: its solution has no readable \\boxed{{...}} or \\fbox{{...}}; give the "
                "record a gold field."
            )
        return gold
    need = "answer (with '#### n')" if task == "gsm8k" else "solution (with \\boxed{})"
    raise InputError(f"{where}: no gold answer: give each record a gold or {need} field.")


def _gsm8k_gold(gold: str, where: str) -> int | None:
    """A GSM8K gold answer as an integer ("1,200" and "18.0" read as the extractor reads answers)."""
    from eval_tasks.math_answers import extract_gsm8k_answer

    if gold == "None":  # the dataset row's answer has no number
        return None
    try:
        return int(gold)
    except ValueError:
        value = extract_gsm8k_answer(f"The answer is {gold}")
    if value is None:
        raise InputError(f"{where}: gold {gold!r} is not a number (GSM8K answers are integers).")
    return value


def _same_count(records: Sequence[Mapping[str, Any]], path: str) -> int:
    counts = {len(r["samples"]) for r in records}
    if len(counts) != 1:
        raise InputError(
            f"{path}: the records hold different sample counts ({sorted(counts)}); first-k needs one."
        )
    return counts.pop()


def voting_curve(
    records: Sequence[Mapping[str, Any]], task: str, checker: str = "hendrycks", where: str = "samples"
) -> dict[str, float]:
    """MV@k and BON@k for k = 1..n over the records (x100)."""
    from eval_tasks.math_answers import (
        canonical_math_answer,
        extract_gsm8k_answer,
        extract_math_answer,
        math_answer_correct,
    )
    from eval_tasks.metrics.voting import voting_accuracies

    n = _same_count(records, where)
    golds = [_gold(r, task, f"{where}: record {i}") for i, r in enumerate(records)]
    if task == "gsm8k":
        answers = [[extract_gsm8k_answer(s) for s in r["samples"]] for r in records]
        gold_values: list[Any] = [_gsm8k_gold(g, f"{where}: record {i}") for i, g in enumerate(golds)]
        return voting_accuracies(answers, gold_values, ks=range(1, n + 1))
    answers = [[canonical_math_answer(extract_math_answer(s)) for s in r["samples"]] for r in records]
    return voting_accuracies(
        answers,
        golds,
        ks=range(1, n + 1),
        equal=lambda a, g: a is not None and math_answer_correct(a, g, checker),
    )


def cmd_voting(args: argparse.Namespace) -> int:
    records = read_sampled(args.samples)
    curve = voting_curve(records, args.task, args.math_checker, args.samples)
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
    from eval_tasks.best_of_n import RewardScorer, rows_by_prompt
    from eval_tasks.metrics.voting import reward_best_of_n, win_rate_best_of_n

    records = read_sampled(args.samples)
    n = _same_count(records, args.samples)
    if args.references:
        by_prompt = rows_by_prompt(S.read_jsonl(args.references))
        for i, r in enumerate(records):
            ref = by_prompt.get(str(r["prompt"]))
            if ref is None:
                raise InputError(f"{args.references}: no reference output for the prompt of record {i}.")
            r["reference"] = ref["output"]
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}.")
    scorer = RewardScorer(
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
    sub.metavar = (sub.metavar or "").rstrip("}") + ",voting,reward}"
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
