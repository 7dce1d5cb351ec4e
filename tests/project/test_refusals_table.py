"""docs/refusals.md is the reliability table: every row (a bad input or a fault, and what happens) names the tests that
back it, and each named test exists."""

from __future__ import annotations

import re

from tests.helpers.env import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "refusals.md"
TEST_ID = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _rows() -> list[list[str]]:
    lines = PAGE.read_text().splitlines()
    start = lines.index("| input or fault | what happens | test |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_every_row_names_existing_tests() -> None:
    rows = _rows()
    assert len(rows) >= 20
    for row in rows:
        assert len(row) == 3, row
        ids = TEST_ID.findall(row[2])
        assert ids, f"no test named for: {row[0]}"
        for path, name in ids:
            source = REPO_ROOT / path
            assert source.is_file(), f"{path} (row: {row[0]})"
            assert re.search(rf"^def {name}\(", source.read_text(), re.M), f"{path}::{name} (row: {row[0]})"


def test_the_faults_asked_for_have_rows() -> None:
    faults = " ".join(row[0] for row in _rows() if row[0].startswith("**fault**"))
    for fault in ("kill -9", "disk fills up", "second training run into the `output_dir`"):
        assert fault in faults, fault
