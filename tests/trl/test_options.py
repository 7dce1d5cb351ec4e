"""The loss options (`trl_ext/options.py`): `python -m trl_ext.options` prints the loss and option tables built from
the loss specs; `loss_params` turns user options into the functional API's parameters, validated."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.helpers.env import REPO_ROOT
from trl_ext.losses import LOSSES
from trl_ext.options import (
    DISTMATCH_LOSSES,
    LOSS_OPTIONS,
    OPTION_DEFAULTS,
    cost_embedding_option,
    loss_params,
    losses_table,
    options_of,
    options_table,
)


def _rows(table: str) -> list[list[str]]:
    """The body rows of a markdown table, cells stripped (header and separator left out)."""
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table.splitlines()[2:]]


def test_module_prints_the_loss_table_then_the_option_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "trl_ext.options"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{losses_table()}\n\n{options_table()}\n"
    losses, options = out.stdout.rstrip("\n").split("\n\n")
    assert losses.splitlines()[0].startswith("| name | per valid token")
    assert options.splitlines()[:2] == ["| option | default | used by | meaning |", "|---|---|---|---|"]
    assert [row[0] for row in _rows(losses)] == [f"`{name}`" for name in LOSSES]
    assert [row[0] for row in _rows(options)] == [f"`{o.name}`" for o in LOSS_OPTIONS]


def test_table_cells_come_from_the_specs() -> None:
    losses = {row[0].strip("`"): row for row in _rows(losses_table())}
    assert losses["ce"][2:] == ["—", "—", "yes"]  # no parameters, no options, a Triton kernel
    assert losses["gem_ls"][3] == "`gem_beta`"
    assert losses["emo"][3] == "`emo_cost_embedding`, `emo_weighting`, `emo_ratio_clamp`, `emo_target_mass`"
    assert losses["mixce"][4] == "—"
    options = {row[0].strip("`"): row for row in _rows(options_table())}
    assert options["gem_beta"][1:3] == ["0.7", "`gem_linear`, `gem_ls`"]
    assert options["emo_cost_embedding"][1] == "`frozen`"  # strings quoted as code, numbers as repr
    assert options["emo_ratio_clamp"][1] == "None"
    assert options["emo_target_mass"][1:3] == ["`excluded`", "`emo`"]
    assert all(len(row) == 4 for row in options.values())  # a "|" in a help text would add a column


def test_options_of_and_defaults() -> None:
    def math(loss: str) -> list[str]:
        return [o.name for o in options_of(loss) if not o.path]

    assert math("gem_ls") == ["gem_beta"]
    assert math("tailr") == ["tailr_gamma", "tailr_min_weight", "tailr_variant"]
    assert math("ce") == math("dft") == []
    paths = ["loss_chunk_memory_mb", "loss_chunk_logits", "loss_grad_weight_accum", "loss_kernels"]
    assert all([o.name for o in options_of(loss) if o.path] == paths for loss in ("ce", "emo", "asft"))
    assert OPTION_DEFAULTS["gem_beta"] == 0.7 and OPTION_DEFAULTS["emo_weighting"] == "emo1"
    assert cost_embedding_option("emo") == "emo_cost_embedding"
    assert cost_embedding_option("gem_ls") is None


def test_loss_params_defaults_user_values_and_other_losses_options() -> None:
    assert loss_params("gem_ls", {}) == {"beta": 0.7}
    assert loss_params("gem_ls", {"gem_beta": 0.5, "tailr_gamma": 0.9}) == {"beta": 0.5}  # others ignored
    assert loss_params("ce", {}) == {}
    assert loss_params("eaft", {"eaft_k": 5}) == {"alpha": 1.0, "k": 5}


def test_loss_params_emo_cost_embedding_only_when_given() -> None:
    without = loss_params("emo", {"emo_weighting": "emo2"})
    assert "cost_embedding" not in without and without["weighting"] == "emo2"
    embedding = torch.ones(4, 3)
    given = loss_params("emo", {}, cost_embedding=embedding)
    assert given["cost_embedding"] is embedding and given["weighting"] == "emo1"


@pytest.mark.parametrize(
    ("loss", "options", "message"),
    [
        ("nope", {}, "Unknown loss 'nope'. Valid losses: " + ", ".join(DISTMATCH_LOSSES)),
        ("tailr", {"tailr_gamma": 1.5}, "tailr_gamma="),  # the user-facing name, not the parameter `gamma`
        ("emo", {"emo_weighting": "emo3"}, "emo_weighting="),
        ("emo", {"emo_cost_embedding": ""}, "emo_cost_embedding="),
    ],
)
def test_loss_params_refuses_bad_values_by_option_name(loss, options, message) -> None:
    with pytest.raises(ValueError) as err:
        loss_params(loss, options)
    assert message in str(err.value)
