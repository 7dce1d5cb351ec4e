"""``distmatch-eval novelty``: NoveltyBench's ``distinct`` and ``utility`` of a samples file, outside lm-eval.

The samples file is ``distmatch-eval generate``'s JSONL (one record per prompt: ``prompt``, ``samples``); the same
rules and models as the lm-eval tasks (:mod:`eval_tasks.novelty`). The output JSON (``kind: distmatch.novelty``)
holds the means, the per-prompt numbers, GEM's n-gram / Self-BLEU diversity of the same samples, and the setting:
the models, K, the prompt set, and whether that is NoveltyBench's published setting (``comparable``) or not.
``distmatch-eval report`` shows it beside the GEM diversity metrics.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eval_tasks import samples as S
from eval_tasks.novelty import noveltybench as nb
from eval_tasks.samples import InputError

__all__ = ["add_commands", "cmd_novelty", "score_records"]


def score_records(records: list[dict[str, Any]], scorer: Any, path: str) -> dict[str, Any]:
    """The result of `records` (``prompt``, ``samples``) scored by `scorer` (:class:`NoveltyScorer`)."""
    per_prompt = []
    counts = set()
    for i, record in enumerate(records):
        prompt = S.prompt_text(record)
        responses = record.get("samples")
        if not isinstance(prompt, str) or not isinstance(responses, list) or not responses:
            raise InputError(f"{path}: record #{i} needs a 'prompt' and a non-empty list 'samples'.")
        responses = [str(r) for r in responses]
        counts.add(len(responses))
        scored = scorer.score(prompt, responses)
        per_prompt.append(
            {
                "id": record.get("id", i),
                "distinct": scored["distinct"],
                "utility": scored["utility"],
                "partition": scored["partition"],
                **nb.gem_diversity(responses),
            }
        )
    if not per_prompt:
        raise InputError(f"{path}: no records.")
    if len(counts) != 1:
        raise InputError(
            f"{path}: the prompts have different numbers of samples ({sorted(counts)}); give K each."
        )
    return {"per_prompt": per_prompt, "num_samples": counts.pop()}


def cmd_novelty(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise InputError("--batch-size must be >= 1.")
    records = S.read_jsonl(args.samples)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise InputError(
            f"{args.samples}: expected JSON Lines of objects (distmatch-eval generate's output)."
        )
    S.check_unique_ids(records, args.samples)
    prompts = [S.prompt_text(r) for r in records]
    subset, note = nb.prompt_set_note([p for p in prompts if isinstance(p, str)], len(records))
    if args.subset and subset != args.subset:
        raise InputError(
            f"{args.samples}: --subset {args.subset}, but its prompts are not all NB-{args.subset}'s."
        )
    from eval_tasks.novelty.scorers import load_scorer

    scorer = load_scorer(args.classifier, args.reward_model, device=args.device, batch_size=args.batch_size)
    scored = score_records(records, scorer, args.samples)
    metrics = nb.summarize(scored["per_prompt"])
    metrics.update(
        {m: sum(p[m] for p in scored["per_prompt"]) / len(scored["per_prompt"]) for m in nb.GEM_METRICS}
    )
    result = {
        "kind": "distmatch.novelty",
        "benchmark": f"noveltybench_{subset}" if subset else None,
        "samples_file": str(args.samples),
        "num_prompts": len(records),
        "metrics": metrics,
        "setting": nb.comparability(args.classifier, args.reward_model, scored["num_samples"], note),
        "per_prompt": scored["per_prompt"],
    }
    S.write_json(args.output, result)
    print(
        f"distmatch-eval novelty: distinct {metrics['distinct']:.2f}, utility {metrics['utility']:.2f} over "
        f"{len(records)} prompts ({result['setting']['note']}) -> {args.output}",
        file=sys.stderr,
    )
    return 0


def add_commands(sub: Any) -> None:
    """Register ``novelty`` on distmatch-eval's subparsers."""
    p = sub.add_parser(
        "novelty", help="NoveltyBench distinct / utility of a samples file (K samples per prompt)"
    )
    p.add_argument("samples", help="distmatch-eval generate JSONL (NoveltyBench: 10 samples per prompt)")
    p.add_argument("--subset", choices=tuple(nb.NOVELTY_SETS), help="refuse a file of other prompts")
    p.add_argument(
        "--classifier", default=nb.PUBLISHED_CLASSIFIER, help="2-label pair classifier (Hub id / folder)"
    )
    p.add_argument("--reward-model", default=nb.PUBLISHED_REWARD_MODEL, help="reward model (Hub id / folder)")
    p.add_argument("--device", help="cpu / cuda (default: cuda when present)")
    p.add_argument("--batch-size", type=int, default=8, help="pairs / conversations per forward pass")
    p.add_argument("-o", "--output", required=True, help="output JSON")
    p.set_defaults(func=cmd_novelty)
