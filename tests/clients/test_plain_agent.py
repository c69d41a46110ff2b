"""The agent of ``tests/runtime/plain_agent.py``, written only against the client package,
served over HTTP by a ``holdpoint_client.Worker``: the same object ``runagents`` runs in
the server's process (tests/runtime/test_plain_agent.py) and the harness runs in memory,
with the same hold points and the same outcome."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.models import SideEffect
from runs import services
from runs.models import Run
from tests.clients.conftest import answer, wait_pending, wait_status
from tests.runtime import plain_agent

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_a_remote_worker_runs_the_plain_agent_the_same_way(worker, operator, approver) -> None:
    plain_agent.tickets.tickets.clear()
    worker([plain_agent.agent])
    run_id = services.run_start(
        agent="plain-deploy", input={"service": "gateway"}, user=operator
    ).id
    asked = wait_pending(run_id, "input_required")
    assert asked.step_id == "plan.ask"
    answer(run_id, asked, {"versions": ["v2"]}, operator)
    approval: Any = wait_pending(run_id, "auth_required")
    assert approval.step_id == "apply.plain-ticket.approve"  # ask_before
    answer(run_id, approval, {"decision": "approve"}, approver)
    wait_status(run_id, "succeeded")

    run = Run.objects.get(pk=run_id)
    assert (run.label, run.result) == ("Deploy gateway", {"ticket": "T-1", "versions": ["v2"]})
    effect = SideEffect.objects.get(run_id=run_id)
    assert (effect.tool, effect.status, effect.external_reference) == (
        "plain-ticket",
        "confirmed",
        "T-1",
    )
