"""EMO's open-ended generation benchmark (Tables 1, 2 and 4): the six corpora, the line filter and the word-level
prefix / human-reference split of the authors' ``language_modeling/test_utils.py`` (``test_batch``).

For each corpus the script scans the first ``eval_num`` rows of the test split in batches of 64, keeps a row only
if it has at least 100 characters, at least ``prefix + continuation + 10`` space-separated words and no ``"=="``,
takes the first ``prefix`` words (split on ``" "``, joined with ``" "``) as the prompt and the prompt + ``" "`` + the
next ``continuation`` words as the human text P. The model text Q is the prompt + ``" "`` + the decoded new tokens
(the script strips the prompt's characters from the decoded sequence; both sides carry the prefix). Generation is
ancestral (top-k 0, top-p 1, temperature 1) with ``min_new_tokens = L`` and ``max_new_tokens = L + 1``.

Corpora are read from local files in each dataset's own format (:func:`read_corpus`); WebText and WritingPrompts
have no Hub id (MixCE's split files), the others are read from their Hub copies (``datasets``) when no file is given.
"""

from __future__ import annotations

import io
import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distmatch.optional import require
from eval_tasks.samples import InputError, read_jsonl, read_text

__all__ = [
    "CORPORA",
    "EMO_FEATURIZER",
    "EMO_MAX_TEXT_LENGTH",
    "ROUNDS",
    "SCORE_KIND",
    "SCAN_BATCH",
    "Corpus",
    "Example",
    "build_examples",
    "decoding_flags",
    "keep_row",
    "model_text",
    "oracle_perplexity",
    "prompt_records",
    "read_corpus",
    "rouge_f",
    "round_texts",
    "rows_scanned",
    "score_files",
    "split_row",
]

#: the script reads the test split in slices of this many rows (``BS = 64``), the last slice past ``eval_num``.
SCAN_BATCH = 64


@dataclass(frozen=True)
class Corpus:
    """One corpus of Table 4: where its test split lives and how it is cut."""

    key: str
    title: str
    prefix_words: int  #: prompt length in words (Table 4 "prefix")
    continuation_words: int  #: human reference length in words after the prefix
    new_tokens: int  #: generation length L in tokens (min L, max L + 1)
    eval_num: int  #: test rows the script scans (before its slicing rounds up to a multiple of 64)
    column: str  #: the text column (PTB: ``sentence``)
    hub_path: str | None  #: ``datasets`` id of the test split (None: MixCE split files only)
    hub_name: str | None = None


#: Table 4 with the script's ``eval_num`` per branch (``'wiki'`` / ``'ptb'`` / ``'ag'`` in the dataset name: 4,000;
#: the train-file branch for WebText / WritingPrompts: 5,000).
CORPORA: dict[str, Corpus] = {
    c.key: c
    for c in (
        Corpus(
            "wikitext2", "WikiText-2", 20, 80, 80, 4000, "text", "Salesforce/wikitext", "wikitext-2-raw-v1"
        ),
        Corpus(
            "wikitext103",
            "WikiText-103",
            20,
            80,
            80,
            4000,
            "text",
            "Salesforce/wikitext",
            "wikitext-103-raw-v1",
        ),
        Corpus("webtext", "WebText", 20, 80, 80, 5000, "text", None),
        Corpus("ptb", "Penn Treebank", 5, 25, 25, 4000, "sentence", "ptb_text_only", "penn_treebank"),
        Corpus("writingprompts", "WritingPrompts", 35, 80, 80, 5000, "text", None),
        Corpus("ag_news", "AG News", 10, 30, 30, 4000, "text", "fancyzhx/ag_news"),
        # Table 2: GPT-2-large's unbiased samples of the GPT-2 output dataset (large-762M.test.jsonl), read by
        # the script's train-file branch like WebText
        Corpus("gpt2_large", "GPT-2-large samples (oracle)", 20, 80, 80, 5000, "text", None),
    )
}
#: the corpus whose texts are the oracle model's samples (EMO Table 2: oracle perplexity, ROUGE-1/L)
ORACLE_CORPUS = "gpt2_large"


def published_benchmark(key: str) -> str:
    """The id of corpus `key`'s published numbers in ``eval_tasks/published`` (Table 1: ``emo_lm_<key>``; the
    oracle data of Table 2: ``emo_oracle_gpt2_large``)."""
    return "emo_oracle_gpt2_large" if key == ORACLE_CORPUS else f"emo_lm_{key}"


@dataclass(frozen=True)
class Example:
    """One kept test row: the prompt (prefix) and the human text P (prefix + " " + continuation)."""

    row: int  #: index of the row in the test split
    prefix: str
    reference: str


def corpus(key: str) -> Corpus:
    """The :data:`CORPORA` entry `key`, or one clear error naming the accepted keys."""
    if key not in CORPORA:
        raise InputError(f"--corpus {key!r}: unknown; accepted: {', '.join(CORPORA)}.")
    return CORPORA[key]


def rows_scanned(spec: Corpus, num_rows: int) -> int:
    """How many rows the script's loop reads: ``eval_num`` capped at the split size, then rounded up to the
    64-row slices (``val_set['text'][i:i+64]`` for ``i < eval_num``), capped again at the split size."""
    eval_num = min(spec.eval_num, num_rows)
    return min(num_rows, math.ceil(eval_num / SCAN_BATCH) * SCAN_BATCH)


def keep_row(text: str, spec: Corpus) -> bool:
    """The script's filter: >= 100 characters, >= prefix + continuation + 10 words (split on " "), no ``"=="``."""
    if len(text) < 100 or "==" in text:
        return False
    return len(text.split(" ")) >= spec.prefix_words + spec.continuation_words + 10


def split_row(text: str, spec: Corpus) -> tuple[str, str]:
    """(prefix, human text P) of a kept row: words are split on a single space, so a leading space gives an
    empty first word (WikiText lines start with one) exactly as in the script."""
    words = text.split(" ")
    prefix = " ".join(words[: spec.prefix_words])
    continuation = " ".join(words[spec.prefix_words : spec.prefix_words + spec.continuation_words])
    return prefix, prefix + " " + continuation


def build_examples(texts: Sequence[str], spec: Corpus) -> list[Example]:
    """The kept examples of a test split given as its rows' texts, in row order."""
    out = []
    for row in range(rows_scanned(spec, len(texts))):
        text = texts[row]
        if not isinstance(text, str):
            raise InputError(f"{spec.title}: row {row} has no text ({type(text).__name__}).")
        if keep_row(text, spec):
            prefix, reference = split_row(text, spec)
            out.append(Example(row, prefix, reference))
    return out


def model_text(prefix: str, continuation: str) -> str:
    """Q as the script builds it: the prefix + " " + the decoded new tokens (which usually start with their own
    space, so Q often has two spaces after the prefix)."""
    return prefix + " " + continuation


def prompt_records(examples: Iterable[Example], spec: Corpus) -> list[dict[str, Any]]:
    """``distmatch-eval generate`` prompt records: ``text`` (the prefix, continued without a chat template) and
    ``reference`` (P)."""
    return [
        {"id": f"{spec.key}-{e.row}", "text": e.prefix, "reference": e.reference, "corpus": spec.key}
        for e in examples
    ]


def _read_lines(path: Path) -> list[str]:
    # the original releases (wiki.test.raw, ptb.test.txt, MixCE .txt): one row per line, line end removed
    return [line.rstrip("\n") for line in io.StringIO(read_text(path), newline=None)]


def _read_json_rows(path: Path, column: str) -> list[Any]:
    if path.suffix == ".jsonl":
        rows = read_jsonl(path)
    else:
        rows = json.loads(read_text(path))
        if isinstance(rows, dict):
            rows = rows.get("data", rows.get("rows"))
    if not isinstance(rows, list):
        raise InputError(f"{path}: expected a JSON list of records (or JSON lines).")
    return [_column(r, column, path, i) for i, r in enumerate(rows)]


def _column(record: Any, column: str, path: Path, index: int) -> Any:
    if isinstance(record, str):
        return record
    for name in (column, "text", "sentence"):
        if isinstance(record, dict) and name in record:
            return record[name]
    raise InputError(f"{path}: record #{index} has no {column!r} field.")


def read_corpus(key: str, path: str | os.PathLike[str] | None = None, *, split: str = "test") -> list[str]:
    """The rows (texts) of corpus `key`'s `split` (the benchmark reads ``test``; the language-modeling recipe's
    data script, examples/reproduce/emo_lm_data.py, reads ``train`` and ``validation``).

    `path`: a local copy in the dataset's own format: ``.parquet`` (the Hub's files: WikiText ``text``, PTB
    ``sentence``, AG News ``text``), ``.jsonl`` / ``.json`` (GPT-2 output-dataset WebText records, MixCE splits:
    field ``text``), or a text file (``wiki.test.raw``, ``ptb.test.txt``, MixCE ``.txt``: one row per line). Without
    `path`, the `split` of the Hub copy through ``datasets`` (WebText and WritingPrompts need a file).
    """
    spec = corpus(key)
    if path is None:
        if spec.hub_path is None:
            raise InputError(
                f"--data: {spec.title} has no Hub copy; give its {split} split file (MixCE split or GPT-2 output "
                "dataset: .jsonl/.json/.txt)."
            )
        from distmatch.optional import require

        datasets = require("datasets", extra="eval", feature="open-ended corpora")
        args = {"path": spec.hub_path, "split": split}
        if spec.hub_name:
            args["name"] = spec.hub_name
        return list(datasets.load_dataset(**args)[spec.column])
    file = Path(path)
    if not file.is_file():
        raise InputError(f"--data {file}: no such file.")
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(file)
        names = [n for n in (spec.column, "text", "sentence") if n in table.column_names]
        if not names:
            raise InputError(f"--data {file}: no {spec.column!r} column (has {table.column_names}).")
        return list(table.column(names[0]).to_pylist())
    if file.suffix in (".jsonl", ".json"):
        return _read_json_rows(file, spec.column)
    return _read_lines(file)


# Scoring generated texts as the script does (distmatch-eval open-ended score and the lm-eval tasks): MAUVE of each
# sampling round against the human texts, ROUGE-1 / ROUGE-L, and the oracle model's perplexity.

#: the script's ``for iteration in range(5)`` sampling rounds per trained model
ROUNDS = 5
#: MAUVE's featurizer in the script (``featurize_model_name='./gpt2-large'``, ``max_text_length=256``)
EMO_FEATURIZER = "lm:gpt2-large"
EMO_MAX_TEXT_LENGTH = 256
#: ``test_utils.compute_ppl``'s batch size
ORACLE_BATCH = 64
#: the ``kind`` of ``open-ended score``'s output (``distmatch-eval report`` reads it)
SCORE_KIND = "distmatch.open_ended"


def decoding_flags(spec: Corpus, rounds: int = ROUNDS) -> list[str]:
    """The ``distmatch-eval generate`` flags of the script's decoding for `spec` (``do_sample``, top-k 0, top-p 1,
    typical-p 1, temperature 1, ``min_new_tokens = L``, ``max_new_tokens = L + 1``; no chat template)."""
    # flag / value pairs, one pair a line
    return [
        *("-k", str(rounds)),
        *("--temperature", "1"),
        *("--top-k", "0"),
        *("--top-p", "1"),
        *("--min-new-tokens", str(spec.new_tokens)),
        *("--max-new-tokens", str(spec.new_tokens + 1)),
        *("--chat-template", "never"),
        *("--benchmark", published_benchmark(spec.key)),
    ]


def round_texts(rows: Sequence[Mapping[str, Any]], where: str) -> tuple[list[str], list[list[str]]]:
    """(P texts, Q texts per round) of a generate output: round ``r`` is sample ``r`` of every prompt."""
    if not rows:
        raise InputError(f"{where}: no records.")
    refs, rounds = [], None
    for i, row in enumerate(rows):
        outs, ref, prefix = row.get("samples"), row.get("reference"), row.get("prompt")
        if not isinstance(outs, list) or not isinstance(ref, str) or not isinstance(prefix, str):
            raise InputError(
                f"{where}: record #{i} needs 'prompt', 'reference' and 'samples' (generate's output for the prompts "
                "of distmatch-eval open-ended prompts)."
            )
        if rounds is None:
            rounds = [[] for _ in outs]
        if len(outs) != len(rounds):
            raise InputError(f"{where}: record #{i} has {len(outs)} samples, the first had {len(rounds)}.")
        refs.append(ref)
        for r, text in enumerate(outs):
            rounds[r].append(model_text(prefix, text))
    return refs, rounds or []


def rouge_f(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1 and ROUGE-L F-measure x100 (``rouge_score``, no stemming: the scorer behind HF ``evaluate``'s
    ``rouge``, which reports a bootstrap median of the same per-pair F values)."""
    scorer_mod = require("rouge_score.rouge_scorer", extra="eval", feature="ROUGE (package rouge-score)")
    scorer = scorer_mod.RougeScorer(["rouge1", "rougeL"], use_stemmer=False)
    scores = [scorer.score(ref, pred) for pred, ref in zip(predictions, references)]
    return {
        "rouge1": 100.0 * statistics.fmean(s["rouge1"].fmeasure for s in scores),
        "rougeL": 100.0 * statistics.fmean(s["rougeL"].fmeasure for s in scores),
    }


def oracle_perplexity(
    texts: Sequence[str], oracle: Any, *, batch_size: int = ORACLE_BATCH, device: str | None = None
) -> float:
    """``test_utils.compute_ppl``: batches of 64 right-padded texts, pad tokens (= EOS when the tokenizer has no
    pad) masked out of the labels, exp of the mean over batches of each batch's token-mean cross-entropy.
    `oracle`: a causal-LM folder or Hub name, or a loaded (model, tokenizer)."""
    torch = require("torch", extra="eval", feature="oracle perplexity")
    if isinstance(oracle, tuple):
        model, tokenizer = oracle
    else:
        transformers = require("transformers", extra="eval", feature="oracle perplexity")
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(oracle)
            model = transformers.AutoModelForCausalLM.from_pretrained(oracle)
        except Exception as err:
            raise InputError(f"--oracle {oracle!r}: could not load ({type(err).__name__}: {err}).") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    losses = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(list(texts[start : start + batch_size]), padding=True, return_tensors="pt")
            labels = batch["input_ids"].clone()
            labels[labels.eq(tokenizer.pad_token_id)] = -100
            out = model(**batch.to(device), labels=labels.to(device))
            losses.append(float(out.loss))
    return math.exp(statistics.fmean(losses))


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def score_files(
    paths: Sequence[str],
    *,
    featurizer: Any = EMO_FEATURIZER,
    max_text_length: int = EMO_MAX_TEXT_LENGTH,
    oracle: Any = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Per seed file and round: MAUVE, ROUGE-1/L (and oracle PPL); mean / std over rounds and over all files."""
    from eval_tasks.metrics.mauve import mauve_score

    if not paths:
        raise InputError("open-ended score: give at least one samples file.")
    per_seed, metrics = [], {"mauve": [], "rouge1": [], "rougeL": [], "oracle_ppl": []}
    benchmarks: dict[str, str] = {}  # samples file -> the benchmark its generate meta names
    for path in paths:
        rows = read_jsonl(path)
        benchmarks[str(path)] = str((rows[0].get("meta") or {}).get("benchmark") or "") if rows else ""
        refs, rounds = round_texts(rows, str(path))
        p_feats = None
        seed_rounds = []
        for texts in rounds:
            if p_feats is None:
                from eval_tasks.metrics.mauve import text_features

                p_feats = text_features(refs, featurizer, max_length=max_text_length, device=device)
            m = mauve_score(
                None,
                texts,
                featurizer=featurizer,
                p_features=p_feats,
                max_text_length=max_text_length,
                device=device,
            )
            row = {"mauve": m["mauve"], **rouge_f(texts, refs)}
            if oracle is not None:
                row["oracle_ppl"] = oracle_perplexity(texts, oracle, device=device)
            seed_rounds.append(row)
            for key, value in row.items():
                metrics[key].append(value)
        per_seed.append(
            {
                "file": str(path),
                "num_texts": len(refs),
                "rounds": seed_rounds,
                **{k: _spread([r[k] for r in seed_rounds]) for k in seed_rounds[0]},
            }
        )
    named = set(benchmarks.values())
    if len(named) > 1:
        raise InputError(
            "open-ended score: the samples files are of different corpora ("
            + ", ".join(f"{p}: {b or 'none'}" for p, b in benchmarks.items())
            + "); score one corpus at a time."
        )
    return {
        "kind": SCORE_KIND,
        "benchmark": named.pop() or None,
        "protocol": "emo_official",
        "featurizer": str(featurizer)
        if not callable(featurizer)
        else getattr(featurizer, "__name__", "callable"),
        "max_text_length": max_text_length,
        "seeds": per_seed,
        **{k: _spread(v) for k, v in metrics.items() if v},
    }
