"""The repository root and the offline environment every test (and every subprocess a test starts) runs with."""

from __future__ import annotations

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
