"""The demo's scoring of one model, all with `distmatch-eval`'s pieces: held-out CE / perplexity / entropy / top-1
probability (`eval_tasks.results.nexttoken_result`), K samples per held-out prompt (`eval_tasks.generation`'s prompt
encoding, drawn by the demo's machine-independent sampler, `demo_sampling`) and their diversity (`eval_tasks.results.diversity_result`, mean ± standard error over prompts from
`eval_tasks.metrics.mean_se`); the run's nexttoken.json / samples.jsonl / diversity.json as `distmatch-eval` writes
them."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from demo_config import DemoConfig, Log, progress_bar
from demo_sampling import SAMPLER, sample_batch
from demo_train import compute_dtype, resolve_device

from eval_tasks.metrics import mean_se
from eval_tasks.metrics.names import DIVERSITY_METRICS
from eval_tasks.report.labels import SHORT_TITLES

HELDOUT_BENCHMARK = "demo_heldout"
#: the diversity columns (metric -> short title), in the order of eval_tasks.metrics.names
METRIC_SHORT = {key: SHORT_TITLES[key] for key in DIVERSITY_METRICS}


def generate_samples(
    model: Any, tokenizer: Any, prompts: Sequence[Mapping[str, Any]], cfg: DemoConfig, desc: str
) -> list[dict[str, Any]]:
    """K samples per prompt: `distmatch-eval generate`'s prompt encoding and samples-file records
    (eval_tasks.generation), drawn by the demo's machine-independent sampler (demo_sampling)."""
    from eval_tasks import generation as G
    from eval_tasks.samples import prompt_text

    sampling = G.Sampling(
        num_samples=cfg.samples,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
    )
    meta = G.generation_meta(
        desc,
        "hf",
        sampling,
        benchmark=HELDOUT_BENCHMARK,
        prompts_file=str(cfg.heldout_file),
        num_prompts_in_file=len(prompts),
    )
    meta = {**meta, "sampler": SAMPLER}
    encoded = G.encode_prompts(tokenizer, [{"id": p["id"], "prompt": p["prompt"]} for p in prompts])
    rows: list[dict[str, Any]] = []
    bar = progress_bar(len(prompts) * cfg.samples, f"sample {desc}", cfg.progress, unit="sample")
    for start in range(0, len(encoded), cfg.gen_batch):
        chunk = encoded[start : start + cfg.gen_batch]
        samples = sample_batch(
            model,
            tokenizer,
            [e.ids for e in chunk],
            list(range(start, start + len(chunk))),
            num_samples=cfg.samples,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=cfg.seed,
        )
        for e, outs in zip(chunk, samples):
            rows.append(
                {
                    "id": e.record["id"],
                    "prompt": prompt_text(e.record),
                    "input_text": e.text,
                    "samples": outs,
                    "meta": {**meta, "chat_template": e.chat},
                }
            )
        bar.update(len(chunk) * cfg.samples)
    bar.close()
    return rows


def evaluate(
    name: str,
    model: Any,
    tokenizer: Any,
    cfg: DemoConfig,
    heldout: Sequence[Mapping[str, Any]],
    run_dir: Path,
    log: Log,
) -> dict[str, Any]:
    """Score `model` on the held-out set and sample from it; write the run's nexttoken / samples / diversity files."""
    import torch

    from eval_tasks import results as E
    from eval_tasks import samples as S

    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg)
    model.to(device=device, dtype=torch.float32).eval()
    started = time.time()
    scored = [{"prompt": r["prompt"], "completion": r["completion"]} for r in heldout[: cfg.eval_examples]]
    nexttoken = E.nexttoken_result(
        model,
        tokenizer,
        model_name=name,
        records=scored,
        benchmark=HELDOUT_BENCHMARK,
        data_file=str(cfg.heldout_file),
        max_length=cfg.max_length,
        progress=cfg.progress,
    )
    S.write_json(run_dir / "nexttoken.json", nexttoken)
    stats = nexttoken["stats"]
    if compute_dtype(cfg, device) == "bfloat16":
        model.to(torch.bfloat16)  # sampling only: about 2x faster on AVX512-BF16 CPUs
    rows = generate_samples(model, tokenizer, heldout[: cfg.prompts], cfg, name)
    samples_file = run_dir / "samples.jsonl"
    S.write_jsonl(samples_file, rows)
    diversity = E.diversity_result(
        rows,
        samples_file=str(samples_file),
        benchmark=HELDOUT_BENCHMARK,
        protocol_differences=[],  # the demo's own prompts: no published numbers to compare with
        allow_empty=True,
        sbert_model=cfg.sbert_model,
    )
    S.write_json(run_dir / "diversity.json", diversity)
    texts = [s for r in rows for s in r["samples"]]
    words = [len(s.split()) for s in texts]
    result = {
        "name": name,
        "stats": stats,
        "diversity": {},
        "mean_words": sum(words) / len(words),
        "empty_samples": sum(1 for s in texts if not s.strip()),
        "num_samples": len(texts),
        "per_prompt": diversity["per_prompt"],
        "eval_seconds": time.time() - started,
    }
    for key, mean in diversity["metrics"].items():
        result["diversity"][key] = (mean, mean_se([row[key] for row in diversity["per_prompt"]])[1])
    log(
        f"eval {name}: perplexity {stats['perplexity']:.2f}, entropy {stats['mean_entropy']:.3f}, "
        + ", ".join(f"{METRIC_SHORT[k]} {v[0]:.1f}" for k, v in result["diversity"].items())
        + f" ({result['eval_seconds']:.0f} s)"
    )
    return result
