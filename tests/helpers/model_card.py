"""Reading back the model card (`README.md`) a real run wrote: its tags and the distmatch section
(`trl_ext/model_card.py`), for the TRL and Axolotl tests."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml


def read_card(folder: Path) -> tuple[list[str], dict[str, Any]]:
    """(the card's tags, its distmatch section as {loss, framework, version, options, paper})."""
    text = (folder / "README.md").read_text(encoding="utf-8")
    front = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert front, f"{folder / 'README.md'} has no metadata block:\n{text[:500]}"
    tags = list(yaml.safe_load(front.group(1)).get("tags") or [])
    assert text.count("<!-- distmatch: begin -->") == 1 == text.count("<!-- distmatch: end -->"), text[-3000:]
    body = text[text.index("<!-- distmatch: begin -->") : text.index("<!-- distmatch: end -->")]
    head = re.search(r"distmatch loss `(\w+)` through (\w+), distmatch (\S+)\.", body)
    assert head, body
    options = {
        name: json.loads(value) for name, value in re.findall(r"^\| `(\w+)` \| `(.*)` \|$", body, re.M)
    }
    paper = re.search(r"^Paper: (.*)$", body, re.M)
    return tags, {
        "loss": head.group(1),
        "framework": head.group(2),
        "version": head.group(3),
        "options": options,
        "paper": paper.group(1) if paper else None,
    }
