"""The tests' one wait on wall time (``tests/waiting.py``): what it returns, how it fails,
how its budget stretches with the load, and that the tests use it instead of loops of
their own."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests import waiting
from tests.waiting import stretch, timed_wait, wait_for

TESTS = Path(__file__).resolve().parents[1]


def test_it_returns_the_first_true_value() -> None:
    calls = iter([None, 0, "", "found"])
    assert wait_for(lambda: next(calls), 5, "a value", interval=0.001) == "found"


def test_it_fails_naming_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"timed out after \d+s waiting for the moon"):
        wait_for(lambda: False, 0.05, "the moon", interval=0.01)


def test_it_gives_up_with_the_last_value_when_asked() -> None:
    assert wait_for(lambda: [], 0.05, "nothing", interval=0.01, give_up=True) == []


def test_a_predicate_that_raises_fails_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the server died"):
        wait_for(lambda: (_ for _ in ()).throw(RuntimeError("the server died")), 60, "x")
    assert time.monotonic() - started < 5


def test_it_waits_with_the_sleep_it_is_given() -> None:
    slept: list[float] = []
    answers = iter([False, False, True])
    assert wait_for(lambda: next(answers), 5, "x", interval=0.25, sleep=slept.append)
    assert slept == [0.25, 0.25]
    assert timed_wait(lambda: True, 5, "x") < 5


def test_its_budget_stretches_with_the_load_and_the_scale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HOLDPOINT_TEST_WAIT_SCALE", raising=False)
    monkeypatch.setattr(waiting.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(waiting.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert stretch() == 1.0  # an idle machine: the budget as written
    monkeypatch.setattr(waiting.os, "getloadavg", lambda: (6.0, 6.0, 6.0))
    assert stretch() == 3.0  # load 6 on 2 cores
    monkeypatch.setattr(waiting.os, "getloadavg", lambda: (40.0, 40.0, 40.0))
    assert stretch() == waiting.MAX_LOAD_STRETCH
    monkeypatch.setenv("HOLDPOINT_TEST_WAIT_SCALE", "2")
    assert stretch() == 2 * waiting.MAX_LOAD_STRETCH


def test_no_test_polls_the_clock_in_a_loop_of_its_own() -> None:
    """A wait on wall time goes through ``tests.waiting`` so its deadline holds under load.

    Left alone: agent steps that wait inside the step on purpose (``tests/runtime/agents.py``:
    a pause must not cut it short; the conformance scenarios' script steps) and the loop that
    keeps the machine loaded for a set time (``tests/clients/test_lease_clock.py``); none of
    them is a test waiting for something to happen.
    """
    allowed = {
        "waiting.py",
        "runtime/agents.py",
        "conformance/script.py",
        "clients/test_lease_clock.py",
    }
    own_loops = []
    for path in TESTS.rglob("*.py"):
        name = str(path.relative_to(TESTS))
        if name in allowed:
            continue
        if re.search(r"deadline = time\.monotonic\(\)|while time\.monotonic\(\)", path.read_text()):
            own_loops.append(name)
    assert own_loops == []
