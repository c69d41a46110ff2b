"""The claim's lease names its members one by one: what the service's ``Lease`` carries for
the server's own use (``run_cost`` as a ``Decimal``, ``agent_version``) is read off the row
the claim locked and answered once, in the protocol's form, never leaked twice or as a type
JSON cannot hold; and the run is not read again after the claim for them."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.models import Run
from runtime.backend import attempt_lease
from tests.api.conftest import post
from tests.runs.factory import claim, start

pytestmark = pytest.mark.django_db

ANSWERED = {
    "attempt_id",
    "run_id",
    "agent",
    "number",
    "reason",
    "worker_id",
    "lease_epoch",
    "cancel_epoch",
    "lease_seconds",
    "heartbeat_seconds",
    "lease_expires_at",
    "input",
    "approvals",
    "pause_before",
    "resume_from",
    "resume_request",
    "answers",
    "run_cost",
    "agent_version",
}


def test_the_claim_answers_the_documented_members_and_the_cost_as_a_decimal_string(
    wclient,
) -> None:
    run = start()
    Run.objects.filter(pk=run.id).update(cost=Decimal("1.25"))
    response = post(wclient, "/api/worker/claim", {"worker_id": "w"})
    assert response.status_code == 200, response.content
    lease = response.json()
    assert set(lease) == ANSWERED
    assert lease["run_cost"] == "1.250000"
    assert lease["agent_version"] is None


def test_the_service_lease_carries_the_cost_and_version_from_the_locked_row() -> None:
    run = start()
    Run.objects.filter(pk=run.id).update(cost=Decimal("2.5"))
    lease = claim()
    assert lease.run_cost == Decimal("2.5")
    assert lease.agent_version == Run.objects.get(pk=run.id).agent_version
    # The in-process runtime's lease asks the database nothing more for them.
    with CaptureQueriesContext(connection) as queries:
        runtime_lease = attempt_lease(lease)
    assert runtime_lease.run_cost == Decimal("2.5")
    assert not [q for q in queries if "runs_run" in q["sql"]], queries.captured_queries
    assert isinstance(services.Lease.__dataclass_fields__["run_cost"].default, Decimal)
