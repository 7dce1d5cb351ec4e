"""The repository root and the offline environment every test (and every subprocess a test starts) runs with."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

# tests/helpers/env.py -> the repository root (the folder holding pyproject.toml)
REPO_ROOT = Path(__file__).resolve().parents[2]

# No network in tests, no telemetry; tests/conftest.py sets these before any test module imports transformers.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "AXOLOTL_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}


def extensions_dir() -> str:
    """Where DeepSpeed JIT-builds its CPU shm op for the tests (`TORCH_EXTENSIONS_DIR`, set for the whole run by
    tests/conftest.py): one folder per venv, so that builds for other interpreters or venv paths (whose include paths
    differ) do not replace each other in ~/.cache/torch_extensions, and every DeepSpeed launch of a run (the TRL
    ZeRO runs, the ZeRO-3 worker, the sharded-loss benchmark) reuses the one build."""
    key = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return str(Path.home() / ".cache" / "distmatch-tests" / "torch_extensions" / key)
