"""The repository root and the offline environment every test (and every subprocess a test starts) runs with."""

from __future__ import annotations

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
    tests/conftest.py): inside the venv, so that builds for other interpreters or venvs (whose include paths differ)
    do not replace each other, a rebuilt venv starts without a stale build, and every DeepSpeed launch of a run (the
    TRL ZeRO runs, the ZeRO-3 worker, the sharded-loss benchmark) reuses the one build. The venv step builds it
    (`python -m tests.helpers.env`), where a core is idle, not the first DeepSpeed test (about 75 s of compiling)."""
    return str(Path(sys.prefix) / "torch-extensions")


def build_deepspeed_op() -> None:
    """Compile DeepSpeed's CPU shared-memory op into `extensions_dir()` now, as DeepSpeed's first launch would."""
    import os

    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    from deepspeed.comm.torch import build_shm_op

    if build_shm_op() is None:
        raise SystemExit(
            "tests/helpers/env.py: DeepSpeed reports its CPU shm op as incompatible here (g++ missing?)"
        )


if __name__ == "__main__":
    build_deepspeed_op()
