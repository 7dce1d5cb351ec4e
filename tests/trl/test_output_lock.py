"""The output folder's lock (`trl_ext.output_lock`): one run per `output_dir`. Within one process a folder locked
once stays usable under any spelling of its path (a second trainer, the launcher's check); another process is
refused while the lock is held, and the folder is free again once the holder's descriptor is closed (what the
kernel does when a run ends)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.flock_probe import holder, probe
from trl_ext import output_lock
from trl_ext.checks import DistMatchConfigError

pytest.importorskip("fcntl")


@pytest.fixture
def release():
    """Forget and release the locks a test took (the module keeps them for the life of the process)."""
    before = dict(output_lock._HELD)
    yield
    for key in [k for k in output_lock._HELD if k not in before]:
        os.close(output_lock._HELD.pop(key))


def test_within_one_process_the_locked_folder_stays_usable_under_any_spelling(tmp_path, monkeypatch, release):
    monkeypatch.chdir(tmp_path)
    output_lock.lock_output_dir("out")  # relative, as `--output_dir out`
    assert (tmp_path / "out").is_dir()
    for spelling in ("out", "./out", str(tmp_path / "out"), "out/../out"):
        output_lock.lock_output_dir(spelling)
        output_lock.check_output_dir_free(spelling)
    assert len([k for k in output_lock._HELD if Path(k) == tmp_path / "out"]) == 1


def test_another_process_is_refused_while_the_lock_is_held_and_free_after(tmp_path, release):
    out = tmp_path / "out"
    output_lock.lock_output_dir(out)
    assert probe(out) == "busy"
    os.close(output_lock._HELD.pop(str(out.resolve())))  # the run ends
    assert probe(out) == "free"


def test_a_folder_another_process_holds_is_refused_in_one_line(tmp_path, release):
    out = tmp_path / "out"
    out.mkdir()
    held = holder(out)  # it holds the lock now
    try:
        for take in (output_lock.check_output_dir_free, output_lock.lock_output_dir):
            with pytest.raises(
                DistMatchConfigError, match="is being written by another training run"
            ) as caught:
                take(str(out))
            assert "\n" not in str(caught.value)
    finally:
        held.communicate("", timeout=60)
    output_lock.check_output_dir_free(str(out))  # released with the holder
    output_lock.check_output_dir_free(str(tmp_path / "missing"))  # no folder: nothing to check
    output_lock.check_output_dir_free(None)
