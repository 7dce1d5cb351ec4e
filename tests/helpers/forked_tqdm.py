"""An autouse fixture for tests whose code shows tqdm bars and that mutmut runs in forked processes
(`make mutation-score`): import it into the test module (`from tests.helpers.forked_tqdm import
tqdm_for_forked_tests  # noqa: F401`)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def tqdm_for_forked_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real tqdm bars, with a lock of this process alone and no monitor thread. tqdm's default write lock includes a
    multiprocessing semaphore shared by every process forked after it was made: mutmut forks one test process per
    mutant, and once one of them is stopped while holding it, every later bar waits on it forever (the mutants
    reported as timed out); its monitor thread takes the same lock."""
    import threading

    import tqdm
    import tqdm.auto

    lock = threading.RLock()
    for cls in {tqdm.tqdm, tqdm.auto.tqdm}:
        monkeypatch.setattr(cls, "_lock", lock, raising=False)
        monkeypatch.setattr(cls, "monitor_interval", 0)
