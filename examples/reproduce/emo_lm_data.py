"""EMO Table 1's language-modeling data: one corpus's training and validation rows as plain-text JSONL.

EMO (Ren et al., ICLR 2024, Section 4.1) fine-tunes GPT-2 and OPT-125M on the training set of each of the six
open-ended corpora and keeps the checkpoint with the lowest validation loss. The rows are read with the benchmark's
own reader (`eval_tasks.open_ended.read_corpus`, each corpus in its own format) and written as ``{"text": ...}``
lines to ``train.jsonl`` and ``validation.jsonl`` under ``--out``: a folder that ``datasets.load_dataset`` (and so
``trl sft --dataset_name FOLDER``) reads as the splits ``train`` and ``validation``.

Validation rows, as the authors' ``language_modeling/run_lm.py`` takes them:

* WikiText-2, WikiText-103, PTB: the Hub dataset's ``validation`` split (a local copy: ``--valid-source``).
* AG News has no validation split: the first 5% of the training rows (the script's ``train[:5%]``,
  ``validation_split_percentage`` 5; at least one row), the rest for training.
* WebText and WritingPrompts have no Hub copy: MixCE's split files, ``--source`` the train file and
  ``--valid-source`` the valid file (the script's ``--train_file`` / ``--validation_file``).

Rows with no text (WikiText's empty lines) are dropped: they hold no tokens in the script either, and TRL would turn
each into a lone EOS. Needs ``datasets`` for the Hub copies; local files (``--source``) are read without it.

    python examples/reproduce/emo_lm_data.py wikitext2 --out data/emo_lm/wikitext2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The repository root on the path: the script is run as `python examples/reproduce/emo_lm_data.py`.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eval_tasks.open_ended.open_ended import CORPORA, read_corpus  # noqa: E402
from eval_tasks.samples import InputError  # noqa: E402

#: the script's ``--validation_split_percentage`` default: the held-out share of a corpus without a validation split
VALIDATION_PERCENT = 5
#: corpora whose source has no validation split (the script holds out the first 5% of the training rows)
NO_VALIDATION_SPLIT = frozenset({"ag_news"})
#: corpora with no Hub copy: MixCE's train / valid split files (the GPT-2 output dataset's for Table 2's oracle data)
#: are required
FILES_ONLY = frozenset(key for key, spec in CORPORA.items() if spec.hub_path is None)


class DataError(ValueError):
    """Bad input: one line naming the setting and what is accepted."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python examples/reproduce/emo_lm_data.py",
        description="One corpus of EMO Table 1 as plain-text JSONL (train.jsonl, validation.jsonl) for a LM run.",
    )
    p.add_argument("corpus", choices=list(CORPORA))
    p.add_argument("--out", required=True, help="output folder (train.jsonl, validation.jsonl)")
    p.add_argument(
        "--source",
        help="a local copy of the training split (.parquet / .jsonl / .json / text file, the corpus's own format)",
    )
    p.add_argument("--valid-source", help="a local copy of the validation split (MixCE: the valid file)")
    return p


def _rows(key: str, path: str | None, split: str, flag: str) -> list[str]:
    try:
        rows = read_corpus(key, path, split=split)
    except InputError as err:  # the benchmark reader names its own flag (--data): name ours
        raise DataError(f"{flag} {str(err).removeprefix('--data').lstrip(': ')}") from err
    for index, row in enumerate(rows):
        if row is not None and not isinstance(row, str):
            raise DataError(f"{flag} {path or key}: row {index} is not text ({type(row).__name__}).")
    return [row for row in rows if row and row.strip()]


def splits(args: argparse.Namespace) -> dict[str, list[str]]:
    """The training and validation texts of `args.corpus` (checked before anything is written)."""
    key = args.corpus
    if key in FILES_ONLY and (args.source is None or args.valid_source is None):
        raise DataError(
            f"{key}: has no Hub copy; give MixCE's split files (gpt2_large: the GPT-2 output dataset's "
            "large-762M train / valid files): --source (train) and --valid-source (valid)."
        )
    if args.valid_source is not None and args.source is None:
        raise DataError("--valid-source needs --source (the training split file) too.")
    train = _rows(key, args.source, "train", "--source")
    if key in NO_VALIDATION_SPLIT and args.valid_source is None:
        held_out = max(1, round(len(train) * VALIDATION_PERCENT / 100))  # AG News: 6,000 of 120,000
        valid, train = train[:held_out], train[held_out:]
    elif args.source is not None and args.valid_source is None:
        raise DataError(f"{key}: --source given without --valid-source (its validation split file).")
    else:
        valid = _rows(key, args.valid_source, "validation", "--valid-source")
    if not train or not valid:
        empty = "training" if not train else "validation"
        raise DataError(f"{key}: no {empty} row with text ({args.source or 'the Hub copy'}).")
    return {"train": train, "validation": valid}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        parts = splits(args)
    except DataError as err:
        print(f"emo_lm_data: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, texts in parts.items():
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for text in texts:
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    print(
        f"{args.corpus}: {len(parts['train'])} training rows, {len(parts['validation'])} validation -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
