"""What the end of a run tells the user (`trl_ext.teardown`): communication threads still running at exit are a
warning (the level a user sees by default), the debug line goes to stderr only with DISTMATCH_DEBUG, and no
process group at all is silent. In process: the thread count is replaced, no process group is started."""

from __future__ import annotations

import logging

import pytest

from trl_ext import teardown


@pytest.fixture(autouse=True)
def no_collection(monkeypatch):
    """No full garbage collection of the test process's heap (seconds; nothing here holds a process group)."""
    monkeypatch.setattr(teardown.gc, "collect", lambda *args: 0)


@pytest.mark.parametrize("left", [0, 3])
def test_threads_left_at_exit_are_a_warning_and_none_is_silent(monkeypatch, caplog, capsys, left):
    monkeypatch.setattr(teardown, "communication_threads", lambda: left)
    monkeypatch.delenv("DISTMATCH_DEBUG", raising=False)
    with caplog.at_level(logging.DEBUG, logger=teardown.__name__):
        assert teardown.release_process_groups() == left
    records = [r for r in caplog.records if r.name == teardown.__name__]
    if left:
        assert [r.levelno for r in records] == [logging.WARNING]
        assert f"{left} communication threads are still running at exit" in records[0].getMessage()
    else:
        assert records == []
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("debug", "printed"), [("1", True), ("0", False), ("off", False)])
def test_the_released_line_is_printed_only_with_distmatch_debug(monkeypatch, capsys, debug, printed):
    monkeypatch.setattr(teardown, "communication_threads", lambda: 0)
    monkeypatch.setenv("DISTMATCH_DEBUG", debug)
    monkeypatch.setenv("RANK", "2")
    teardown.release_process_groups()
    err = capsys.readouterr().err
    assert (teardown.RELEASED_LINE.format(left=0) + " (rank 2)" in err) == printed
