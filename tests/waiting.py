"""Waiting on wall time in tests: one helper, whose deadlines hold on a loaded machine.

A test that waits for another thread or process (a worker claims, a page follows a run, a
server starts listening) polls a predicate until it is true or a deadline passes. The
deadline is a budget for a broken run to fail in, never an expectation of how long it
takes: a passing test returns as soon as the predicate holds, so a budget may be generous
and costs nothing.

What a budget must survive is the machine: the suite runs at a load of 8 on 2 cores (CI, or
four people's suites on one box), where starting a Python process takes 10 to 20 times
longer than on an idle machine. So every budget is stretched by the load at the time of the
wait (the one-minute load per core, up to 4 times), and by ``HOLDPOINT_TEST_WAIT_SCALE``
when a machine needs more. A latency a test asserts on (how soon a worker woke) is not a
budget: such a test measures with the seconds ``wait_for`` returns and compares those
itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

MAX_LOAD_STRETCH = 4.0


def stretch() -> float:
    """How much longer than on an idle machine a wait may take now: the one-minute load per
    core (at least 1, at most ``MAX_LOAD_STRETCH``) times ``HOLDPOINT_TEST_WAIT_SCALE``."""
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        per_core = 1.0
    scale = float(os.environ.get("HOLDPOINT_TEST_WAIT_SCALE") or 1)
    return min(max(per_core, 1.0), MAX_LOAD_STRETCH) * scale


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    *,
    interval: float = 0.05,
    sleep: Callable[[float], Any] = time.sleep,
    give_up: bool = False,
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something true, and
    return that; after ``timeout`` seconds (stretched by the load, ``stretch``) fail with
    "timed out … waiting for ``what``".

    ``predicate`` may raise to fail at once (a process that died will never be ready).
    ``sleep`` is what waits between calls (a Playwright page's ``wait_for_timeout``, so the
    page keeps dispatching its events). ``give_up``: return the last (false) value at the
    deadline instead of failing, for a caller that says what was missing itself.
    """
    budget = timeout * stretch()
    deadline = time.monotonic() + budget
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            if give_up:
                return value
            raise AssertionError(f"timed out after {budget:.0f}s waiting for {what}")
        sleep(interval)


def timed_wait(predicate: Callable[[], Any], timeout: float, what: str, **options: Any) -> float:
    """``wait_for``, returning the seconds the wait took (for a test that asserts on them)."""
    started = time.monotonic()
    wait_for(predicate, timeout, what, **options)
    return time.monotonic() - started
