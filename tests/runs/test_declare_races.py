"""Issue 25, point 10: the first declarations of one agent, at once, make exactly one
version, on real PostgreSQL. Four workers starting together each PUT the same new agent:
one creates it (201), the others wait for it and get 200 for the same declaration; none
answers 500 (``IntegrityError`` on the version's uniqueness, the lock having been taken on
a row that did not exist yet)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runs.models import AgentVersion, DeclaredAgent
from runs.tokens import worker_token_create
from tests.api.test_worker_protocol import declare
from tests.runs.test_races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

BODY = {"input_schema": {"ticket": "string"}, "label": "Triage {ticket}"}


def test_simultaneous_first_declarations_make_one_version() -> None:
    _, secret = worker_token_create(name="fleet")

    def first_declaration(name: str) -> object:
        # One client per worker process, all with the fleet's token.
        worker = APIClient()
        worker.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        return declare(worker, name, BODY)

    for round_ in range(12):
        name = f"triage-{round_}"
        responses = race(*(lambda: first_declaration(name) for _ in range(4)))
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [200, 200, 200, 201], [r.content[:200] for r in responses]
        assert AgentVersion.objects.filter(agent=name).count() == 1
        agent = DeclaredAgent.objects.get(name=name)
        assert (agent.version, agent.owners) == (1, ["fleet"])
