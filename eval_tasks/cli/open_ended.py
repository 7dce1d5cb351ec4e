"""``distmatch-eval open-ended``: EMO's open-ended generation protocol (Tables 1-2) outside lm-eval.

* ``open-ended prompts``: a corpus's test split -> generate prompt records (prefix as ``text``, human text P as
  ``reference``) and the ``distmatch-eval generate`` flags of the protocol (ancestral sampling, forced length,
  ``-k 5``: the five sampling rounds);
* ``open-ended score``: one or more generate outputs (one per training seed) -> MAUVE (x100) of each round (sample
  ``r`` of every prompt against the references), ROUGE-1 / ROUGE-L F (x100) and, with ``--oracle``, the oracle
  model's perplexity of the model texts; mean and standard deviation over rounds, per seed and over all.

The protocol and the scoring are :mod:`eval_tasks.open_ended`'s (the lm-eval tasks use the same functions).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eval_tasks import samples
from eval_tasks.open_ended import open_ended as O
from eval_tasks.samples import InputError

__all__ = ["add_commands", "cmd_prompts", "cmd_score"]


def cmd_prompts(args: argparse.Namespace) -> int:
    spec = O.corpus(args.corpus)
    rows = O.read_corpus(spec.key, args.data)
    records = O.prompt_records(O.build_examples(rows, spec), spec)
    if not records:
        raise InputError(f"--data: no row of {spec.title} passes the script's filter.")
    samples.write_jsonl(args.output, records)
    print(
        f"distmatch-eval open-ended: {len(records)} {spec.title} prompts -> {args.output}; generate with:\n"
        f"  distmatch-eval generate --model MODEL --prompts {args.output} -o SAMPLES.jsonl "
        + " ".join(O.decoding_flags(spec)),
        file=sys.stderr,
    )
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    if args.max_text_length < 1:
        raise InputError("--max-text-length must be >= 1 (EMO: 256).")
    result = O.score_files(
        args.samples,
        featurizer=args.featurizer,
        max_text_length=args.max_text_length,
        oracle=args.oracle,
        device=args.device,
    )
    samples.write_json(args.output, result)
    line = f"MAUVE {result['mauve']['mean']:.2f} ± {result['mauve']['std']:.2f}"
    print(
        f"distmatch-eval open-ended: {line} over {len(args.samples)} file(s) -> {args.output}",
        file=sys.stderr,
    )
    return 0


def add_commands(sub: Any) -> None:
    """Register ``open-ended`` (``prompts``, ``score``) on distmatch-eval's subparsers."""
    top = sub.add_parser("open-ended", help="EMO's open-ended generation (MAUVE, Tables 1-2): prompts, score")
    steps = top.add_subparsers(dest="step", required=True, metavar="{prompts,score}")
    p = steps.add_parser("prompts", help="a corpus's test split -> generate prompts (prefix + reference)")
    p.add_argument("--corpus", required=True, help=f"one of {', '.join(O.CORPORA)}")
    p.add_argument("--data", help="the test split file (parquet / jsonl / json / txt); default: the Hub copy")
    p.add_argument("-o", "--output", required=True, help="prompt JSONL for distmatch-eval generate")
    p.set_defaults(func=cmd_prompts)
    s = steps.add_parser("score", help="generate outputs (one per training seed) -> MAUVE, ROUGE, oracle PPL")
    s.add_argument(
        "samples", nargs="+", help="generate JSONL files of the open-ended prompts (-k 5 = 5 rounds)"
    )
    s.add_argument("--featurizer", default=O.EMO_FEATURIZER, help="MAUVE features (EMO: lm:gpt2-large)")
    s.add_argument(
        "--max-text-length", type=int, default=O.EMO_MAX_TEXT_LENGTH, help="tokens per text (EMO: 256)"
    )
    s.add_argument("--oracle", help="oracle causal LM for PPL_oracle (Table 2: gpt2-large)")
    s.add_argument("--device", help="cpu / cuda (default: cuda when present)")
    s.add_argument("-o", "--output", required=True, help="output JSON")
    s.set_defaults(func=cmd_score)
