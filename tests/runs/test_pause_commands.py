"""``manage.py agent pause|unpause NAME --reason`` and ``startrun --pause-before STEP``."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runs.models import AgentGate, Run
from tests.runs.factory import AGENT, claim, start

pytestmark = pytest.mark.django_db


def test_it_pauses_and_unpauses_an_agent_from_the_command_line() -> None:
    start()
    claim()
    start()
    out = StringIO()
    call_command("agent", "pause", AGENT, "--reason", "INC-9", stdout=out)
    assert (
        f"Paused agent {AGENT!r}: 1 running attempts will stop at their next step; "
        "1 queued runs will wait." in out.getvalue()
    )
    gate = AgentGate.objects.get(pk=AGENT)
    assert gate.paused and gate.reason == "INC-9" and gate.actor == "cli"
    listing = StringIO()
    call_command("agent", "list", stdout=listing)
    assert any(AGENT in line and "PAUSED" in line for line in listing.getvalue().splitlines())
    with pytest.raises(CommandError, match="invalid_state"):
        call_command("agent", "pause", AGENT, "--reason", "again")
    call_command("agent", "unpause", AGENT, stdout=StringIO())
    assert not AgentGate.objects.get(pk=AGENT).paused
    with pytest.raises(CommandError, match="not_found"):
        call_command("agent", "pause", "nobody", "--reason", "x")
    with pytest.raises(CommandError):
        call_command("agent", "pause", AGENT)  # --reason is required


def test_startrun_takes_breakpoints() -> None:
    out = StringIO()
    call_command(
        "startrun", AGENT, "{}", "--pause-before", "two", "--pause-before", "four", stdout=out
    )
    run = Run.objects.get(pk=out.getvalue().strip())
    assert run.pause_before == ["two", "four"]
