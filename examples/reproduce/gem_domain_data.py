"""GEM's domain fine-tuning data (GEM Appendix D.2 / D.3) as chat JSONL for the TRL and Axolotl recipes.

* ``metamathqa``: ``meta-math/MetaMathQA`` (``query`` / ``response`` rows), a subset of 79,000 training and 1,000
  held-out samples. The paper does not say how the subset was drawn: here a seeded shuffle (``--seed``), the first
  79,000 rows for training and the next 1,000 held out.
* ``magicoder``: ``ise-uiuc/Magicoder-OSS-Instruct-75K`` (``problem`` / ``solution`` rows), 1,000 test samples
  "randomly selected from the original training set" (a seeded shuffle here) and the rest (74,197 of the 75,197
  rows) for training.

Each row becomes ``{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]}``: the recipes put it into
Llama-3-Instruct's chat format, as GEM did, and train on the assistant turn. Writes ``train.jsonl`` and
``test.jsonl`` under ``--out``. ``--source`` reads a local copy (the dataset's JSON / JSONL / Parquet file or
folder) instead of the Hub. Needs ``datasets``.

    python examples/reproduce/gem_domain_data.py metamathqa --out data/gem/metamathqa
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: dataset -> (Hub id, prompt column, response column, training rows or None = the rest, held-out rows)
DATASETS: dict[str, tuple[str, str, str, int | None, int]] = {
    "metamathqa": ("meta-math/MetaMathQA", "query", "response", 79_000, 1_000),
    "magicoder": ("ise-uiuc/Magicoder-OSS-Instruct-75K", "problem", "solution", None, 1_000),
}


class DataError(ValueError):
    """Bad input: one line naming the setting and what is accepted."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python examples/reproduce/gem_domain_data.py",
        description="GEM's MetaMathQA / Magicoder-OSS-Instruct subsets as chat JSONL (train.jsonl, test.jsonl).",
    )
    p.add_argument("dataset", choices=sorted(DATASETS))
    p.add_argument("--out", required=True, help="output folder (train.jsonl, test.jsonl)")
    p.add_argument("--source", help="a local copy of the dataset (JSON / JSONL / Parquet file or folder)")
    p.add_argument(
        "--train-size", type=int, help="training rows (default: GEM's; Magicoder: all but the test rows)"
    )
    p.add_argument("--test-size", type=int, help="held-out rows (default: GEM's 1,000)")
    p.add_argument("--seed", type=int, default=42, help="seed of the shuffle that draws the subsets")
    return p


def _load(hub_id: str, source: str | None) -> Any:
    import datasets

    if source is None:
        return datasets.load_dataset(hub_id, split="train")
    path = Path(source)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    kinds = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
    found = [p for p in files if p.suffix in kinds]
    if not found or len({kinds[p.suffix] for p in found}) != 1:
        raise DataError(
            f"--source {source}: expected .json / .jsonl files or .parquet files (one kind), found none."
        )
    return datasets.load_dataset(kinds[found[0].suffix], data_files=[str(p) for p in found], split="train")


def prepare(args: argparse.Namespace) -> dict[str, int]:
    """Write the chat JSONL files; returns the row counts."""
    hub_id, prompt_col, response_col, default_train, default_test = DATASETS[args.dataset]
    test_size = default_test if args.test_size is None else args.test_size
    if test_size < 0 or (args.train_size is not None and args.train_size < 1):
        raise DataError("--train-size must be >= 1 and --test-size >= 0.")
    rows = _load(hub_id, args.source)
    missing = [c for c in (prompt_col, response_col) if c not in rows.column_names]
    if missing:
        raise DataError(
            f"{args.source or hub_id}: no {', '.join(missing)} column ({args.dataset} rows have {prompt_col} and "
            f"{response_col}; found {', '.join(rows.column_names)})."
        )
    train_size = args.train_size or default_train or len(rows) - test_size
    if train_size < 1 or train_size + test_size > len(rows):
        raise DataError(
            f"--train-size {train_size} + --test-size {test_size} exceed the {len(rows)} rows of "
            f"{args.source or hub_id}."
        )
    shuffled = rows.shuffle(seed=args.seed)
    # the test rows are drawn first, the training rows are (by default) the rest
    if args.dataset == "magicoder":
        parts = {"test": range(test_size), "train": range(test_size, test_size + train_size)}
    else:
        parts = {"train": range(train_size), "test": range(train_size, train_size + test_size)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, index in parts.items():
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for row in shuffled.select(index):
                messages = [
                    {"role": "user", "content": row[prompt_col]},
                    {"role": "assistant", "content": row[response_col]},
                ]
                f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    return {name: len(index) for name, index in parts.items()}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        counts = prepare(args)
    except DataError as err:
        print(f"gem_domain_data: {err}", file=sys.stderr)
        return 2
    print(f"{args.dataset}: {counts['train']} training rows, {counts['test']} held out -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
