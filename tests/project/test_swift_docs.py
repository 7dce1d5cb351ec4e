"""docs/swift.md names the losses the ms-swift plugin refuses for lack of a model-side input: exactly those whose spec
needs a cost embedding or a reference model (the plugin's own test, tests/swift/, refuses each of them)."""

from __future__ import annotations

import re

from tests.helpers.env import REPO_ROOT
from trl_ext.losses import LOSSES


def test_the_unavailable_losses_of_the_page_are_those_the_specs_mark() -> None:
    page = (REPO_ROOT / "docs" / "swift.md").read_text(encoding="utf-8")
    sentence = page.split("except those that need a model-side input", 1)[1].split(
        "Those are refused by name", 1
    )[0]
    named = set(re.findall(r"`([a-z_0-9]+)`", sentence))
    wanted = {name for name, spec in LOSSES.items() if spec.needs_cost_embedding or spec.needs_reference}
    assert named == wanted, (named, wanted)
