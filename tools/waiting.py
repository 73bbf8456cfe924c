"""Waiting in tests for something another thread or process brings about."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(check: Callable[[], bool], timeout: float) -> float:
    """Seconds until `check()` held (AssertionError after `timeout`)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"not so within {timeout} s"
        time.sleep(0.1)
    return time.monotonic() - started
