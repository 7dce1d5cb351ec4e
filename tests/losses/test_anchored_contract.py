"""trl_ext.losses' `asft` and `sft_kl` (Anchored SFT, Zhu et al.) against docs/losses.md, for what the oracle tests
leave open: the specs are built when the module is imported, so a test that builds them again checks what the
builder gives (the documented option, its default and help, the `kl` statistic, the reference model the losses
need, the closed forms and references the registered losses run), and the refusal of a KL weight out of range."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trl_ext.losses import LOSSES, resolve
from trl_ext.losses.objectives import anchored

ROOT = Path(__file__).resolve().parents[2]


def _documented_option(name: str) -> tuple[str, str, str]:
    """(default, losses, help) of option `name` in docs/losses.md's option table."""
    for line in (ROOT / "docs" / "losses.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == f"`{name}`":
            return cells[1], cells[2], cells[3]
    raise AssertionError(f"{name} is not in docs/losses.md")


@pytest.mark.parametrize("name", ["asft", "sft_kl"])
def test_a_spec_built_again_is_the_documented_one(name: str) -> None:
    registered = LOSSES[name]
    built = anchored._spec(name, name == "asft", registered.summary)
    assert (built.name, built.summary) == (name, registered.summary)
    assert built.stats == ("kl",) and built.needs_reference is True
    assert [p.name for p in built.params] == ["kl_weight"] and built.params[0].default == 0.1
    reference, kl_weight = built.options
    assert reference.name == "anchor_reference" and reference.from_model is True
    default, losses, help_text = _documented_option("anchor_kl_weight")
    assert (kl_weight.name, kl_weight.param, repr(kl_weight.default)) == (
        "anchor_kl_weight",
        "kl_weight",
        default,
    )
    assert kl_weight.help == help_text and re.findall(r"`(\w+)`", losses) == ["asft", "sft_kl"]
    # The registered losses (checked against the authors' formula by tests/losses/test_oracle.py) run these.
    for field in ("rows", "reference"):
        mine, theirs = getattr(built, field), getattr(registered, field)
        assert (
            (mine.func, mine.args)
            == (theirs.func, theirs.args)
            == (getattr(anchored, f"_{field}"), (name == "asft",))
        )


def test_a_kl_weight_out_of_range_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError) as err:
        resolve("asft", {"kl_weight": 1001.0})
    assert str(err.value) == (
        "Loss 'asft': kl_weight=1001.0 is invalid; expected a number >= 0 and <= 1000 (the KL's gradient grows with "
        "it: 1e30 gives an infinite gradient norm; the ASFT authors use 0.1 - 1)."
    )
