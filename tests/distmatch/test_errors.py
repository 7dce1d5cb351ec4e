"""`distmatch.errors`: the refused-setting error and its one-line report (exit status 2, no traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from distmatch import DistMatchConfigError as exported
from distmatch.errors import CONFIG_ERROR_STATUS, DistMatchConfigError, config_errors
from tests.helpers.env import REPO_ROOT


def test_the_error_is_a_value_error_exported_at_the_top() -> None:
    assert exported is DistMatchConfigError and issubclass(DistMatchConfigError, ValueError)
    assert CONFIG_ERROR_STATUS == 2  # argparse's status for a bad argument


def test_config_errors_follows_the_cause_chain() -> None:
    try:
        try:
            raise DistMatchConfigError("gem_beta=0 is invalid")
        except DistMatchConfigError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert config_errors(outer) == ["gem_beta=0 is invalid"]
    assert config_errors(ValueError("other")) == []


def test_config_errors_reads_a_pydantic_validation_error() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Args(pydantic.BaseModel):
        loss: str

        @pydantic.field_validator("loss")
        @classmethod
        def known(cls, value: str) -> str:
            raise DistMatchConfigError(f"loss={value!r} is not a distmatch loss")

    with pytest.raises(pydantic.ValidationError) as info:
        Args(loss="x")
    assert config_errors(info.value) == ["loss='x' is not a distmatch loss"]


@pytest.mark.parametrize(
    ("raised", "status", "line"),
    [("DistMatchConfigError('bad x')", 2, "error: bad x"), ("KeyError('k')", 1, "Traceback")],
)
def test_the_hook_prints_one_line_only_for_refusals(raised: str, status: int, line: str) -> None:
    code = (
        "from distmatch.errors import DistMatchConfigError, print_config_errors_as_one_line\n"
        f"print_config_errors_as_one_line()\nraise {raised}\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )
    assert out.returncode == status
    assert out.stderr.startswith(line)
    if status == 2:
        assert out.stderr == "error: bad x\n"
