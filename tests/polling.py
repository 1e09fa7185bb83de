"""Waiting with a deadline, the tests' one way to wait for something: poll until a condition
holds (``wait_for``), or check that a state lasts (``holds_for``). Never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, *,
             what: str = "condition", diagnose: Callable[[], str] | None = None,
             retry_on: tuple[type[BaseException], ...] = (OSError,)) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy, and
    return that. After ``timeout`` seconds fail with ``what``, its last result and, given
    ``diagnose``, that report. An exception of ``retry_on`` counts as "not yet" and is shown as
    the last result: by default OSError, which requests' errors are (a server not up yet)."""
    deadline = time.monotonic() + timeout
    while True:
        last: object
        try:
            result = predicate()
        except retry_on as e:
            last = e
        else:
            if result:
                return result
            last = result
        if time.monotonic() > deadline:
            extra = f"\n{diagnose()}" if diagnose else ""
            raise AssertionError(f"{what} not met within {timeout}s (last: {last!r}){extra}")
        time.sleep(interval)


def holds_for(check: Callable[[], object], seconds: float, interval: float = 0.2) -> None:
    """Call ``check`` (which asserts) every ``interval`` seconds for ``seconds`` seconds: a
    state that must last, such as a paused job that neither dies nor steps."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        check()
        time.sleep(interval)
