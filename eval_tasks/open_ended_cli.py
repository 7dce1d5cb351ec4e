"""``distmatch-eval open-ended``: EMO's open-ended generation protocol (Tables 1-2) outside lm-eval.

* ``open-ended prompts``: a corpus's test split -> generate prompt records (prefix as ``text``, human text P as
  ``reference``) and the ``distmatch-eval generate`` flags of the protocol (ancestral sampling, forced length,
  ``-k 5``: the five sampling rounds);
* ``open-ended score``: one or more generate outputs (one per training seed) -> MAUVE (x100) of each round (sample
  ``r`` of every prompt against the references), ROUGE-1 / ROUGE-L F (x100) and, with ``--oracle``, the oracle
  model's perplexity of the model texts; mean and standard deviation over rounds, per seed and over all.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from distmatch.optional import require
from eval_tasks import open_ended as O
from eval_tasks import samples
from eval_tasks.samples import InputError

__all__ = [
    "add_commands",
    "decoding_flags",
    "oracle_perplexity",
    "round_texts",
    "rouge_f",
    "score_files",
    "SCORE_KIND",
]

#: the script's ``for iteration in range(5)`` sampling rounds per trained model
ROUNDS = 5
#: MAUVE's featurizer in the script (``featurize_model_name='./gpt2-large'``, ``max_text_length=256``)
EMO_FEATURIZER = "lm:gpt2-large"
EMO_MAX_TEXT_LENGTH = 256
#: ``test_utils.compute_ppl``'s batch size
ORACLE_BATCH = 64
#: the ``kind`` of ``open-ended score``'s output (``distmatch-eval report`` reads it)
SCORE_KIND = "distmatch.open_ended"


def decoding_flags(spec: O.Corpus, rounds: int = ROUNDS) -> list[str]:
    """The ``distmatch-eval generate`` flags of the script's decoding for `spec` (``do_sample``, top-k 0, top-p 1,
    typical-p 1, temperature 1, ``min_new_tokens = L``, ``max_new_tokens = L + 1``; no chat template)."""
    return [
        "-k", str(rounds), "--temperature", "1", "--top-k", "0", "--top-p", "1",
        "--min-new-tokens", str(spec.new_tokens), "--max-new-tokens", str(spec.new_tokens + 1),
        "--chat-template", "never", "--benchmark", O.published_benchmark(spec.key),
    ]  # fmt: skip


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
            rounds[r].append(O.model_text(prefix, text))
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
        rows = samples.read_jsonl(path)
        benchmarks[str(path)] = str((rows[0].get("meta") or {}).get("benchmark") or "") if rows else ""
        refs, rounds = round_texts(rows, str(path))
        p_feats = None
        seed_rounds = []
        for texts in rounds:
            if p_feats is None:
                from eval_tasks.metrics.mauve import text_features

                p_feats = text_features(refs, featurizer, max_length=max_text_length, device=device)
            m = mauve_score(
                None, texts, featurizer=featurizer, p_features=p_feats, max_text_length=max_text_length,
                device=device,
            )  # fmt: skip
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
        + " ".join(decoding_flags(spec)),
        file=sys.stderr,
    )
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    if args.max_text_length < 1:
        raise InputError("--max-text-length must be >= 1 (EMO: 256).")
    result = score_files(
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
    sub.metavar = (sub.metavar or "").rstrip("}") + ",open-ended}"
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
    s.add_argument("--featurizer", default=EMO_FEATURIZER, help="MAUVE features (EMO: lm:gpt2-large)")
    s.add_argument(
        "--max-text-length", type=int, default=EMO_MAX_TEXT_LENGTH, help="tokens per text (EMO: 256)"
    )
    s.add_argument("--oracle", help="oracle causal LM for PPL_oracle (Table 2: gpt2-large)")
    s.add_argument("--device", help="cpu / cuda (default: cuda when present)")
    s.add_argument("-o", "--output", required=True, help="output JSON")
    s.set_defaults(func=cmd_score)
