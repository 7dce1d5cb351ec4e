"""Fixtures of the Axolotl plugin tests: a fresh plugin manager around every test, the tiny model and data per module.
Axolotl is imported inside the fixtures: this folder is collected in venvs without it (its modules skip there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trl_ext.testing import build_tiny_llama, write_alpaca_jsonl, write_sft_jsonl


@pytest.fixture(autouse=True)
def fresh_plugin_manager():
    """Axolotl's PluginManager is a process-wide singleton: start and end every test without plugins."""
    from axolotl.integrations.base import PluginManager

    PluginManager.get_instance().plugins.clear()
    yield
    PluginManager.get_instance().plugins.clear()


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("axolotl_assets")
    return {
        "model": build_tiny_llama(root / "model"),
        "chat": write_sft_jsonl(root / "chat.jsonl", n=64),
        "alpaca": write_alpaca_jsonl(root / "alpaca.jsonl", n=64),
        "prepared": root / "prepared",
    }
