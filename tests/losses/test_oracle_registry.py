"""The float64 oracles (tests/helpers/loss_oracles.py): one per registered loss, each with its three pieces, and
independent of the implementation they check.

A loss added to `trl_ext.losses` without an oracle fails here (and its oracle tests would have nothing to compare
with); so does an oracle left behind by a removed loss.
"""

from __future__ import annotations

import ast

import pytest
import torch

import tests.helpers.loss_oracles as O
from tests.helpers.env import REPO_ROOT
from trl_ext.losses import LOSSES


def test_every_registered_loss_has_an_oracle_and_no_other() -> None:
    assert set(O.ORACLES) == set(LOSSES)
    assert set(O.DEFAULTS) == set(LOSSES)


@pytest.mark.parametrize("name", list(LOSSES))
def test_each_oracle_has_its_closed_form_readable_form_and_surrogate(name: str) -> None:
    entry = O.ORACLES[name]
    assert callable(entry.closed_form) and callable(entry.readable) and callable(entry.surrogate), name
    assert entry.defaults == O.DEFAULTS[name]


def test_the_oracles_import_nothing_of_the_implementation() -> None:
    """Written from the formulas: the modules import torch, the standard library and each other only."""
    for module in ("loss_oracles", "loss_oracles_more"):
        tree = ast.parse((REPO_ROOT / "tests" / "helpers" / f"{module}.py").read_text(encoding="utf-8"))
        imported = {
            alias.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names
        }
        own = {
            n.module
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("tests")
        }
        assert own <= {"tests.helpers", "tests.helpers.loss_oracles"}, own
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert imported - {"tests"} <= {"__future__", "torch", "dataclasses", "collections", "typing"}, (
            imported
        )


def test_a_second_registration_or_a_piece_without_its_closed_form_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(O, "ORACLES", dict(O.ORACLES))
    monkeypatch.setattr(O, "DEFAULTS", dict(O.DEFAULTS))
    with pytest.raises(ValueError, match="registered already"):
        O.oracle_for("ce", {})(lambda at, cfg: None)
    with pytest.raises(ValueError, match="registered already"):
        O.readable_for("dft")(lambda r, cfg: None)
    with pytest.raises(ValueError, match="before its surrogate"):
        O.surrogate_for("not_a_loss")(lambda s, cfg: None)


def test_unknown_loss_is_a_key_error() -> None:
    logits = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(KeyError):
        O.oracle("not_a_loss", logits, torch.tensor([0, 1]))
