"""Required means not empty (issue 15, point 1): the API, answerrun and the form share
runs.schemas' validator, so an empty list or string for a required field is refused
everywhere with invalid_input and a pointer, and nothing changes."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from runs.models import InputRequest
from tests.api.conftest import client_for, post
from tests.runs.factory import interrupted, snapshot

pytestmark = pytest.mark.django_db

FULL = {
    "type": "object",
    "properties": {
        "versions": {"type": "array", "items": {"type": "string"}},
        "why": {"type": "string"},
    },
    "required": ["versions", "why"],
}


@pytest.mark.parametrize(
    ("schema", "value", "pointer"),
    [
        ({"versions": "string[]"}, {"versions": []}, "/versions"),
        (FULL, {"versions": [], "why": "x"}, "/versions"),
        (FULL, {"versions": ["v2"], "why": "   "}, "/why"),
    ],
)
def test_it_refuses_an_empty_required_answer_with_a_pointer(
    operator, schema, value, pointer
) -> None:
    run, _lease, cp, request = interrupted(schema=schema)
    before = snapshot(run.pk)
    body = {"request_id": request.id, "checkpoint_id": cp.id, "value": value}
    response = post(client_for(operator), f"/api/runs/{run.pk}/resume", body, key="empty")
    assert response.status_code == 422
    problem = response.json()
    assert problem["code"] == "invalid_input"
    assert [e["pointer"] for e in problem["errors"]] == [f"/value{pointer}"]
    assert snapshot(run.pk) == before
    assert InputRequest.objects.get(pk=request.id).status == "pending"


def test_it_accepts_a_list_with_an_item(operator) -> None:
    run, _lease, cp, request = interrupted()
    body = {"request_id": request.id, "checkpoint_id": cp.id, "value": {"versions": ["v2"]}}
    response = post(client_for(operator), f"/api/runs/{run.pk}/resume", body, key="one")
    assert response.status_code == 202


def test_answerrun_refuses_the_same_empty_answer(operator) -> None:
    run, _lease, _cp, request = interrupted()
    with pytest.raises(CommandError, match="versions"):
        call_command("answerrun", run.pk, '{"versions": []}', "--as", operator.username)
    assert InputRequest.objects.get(pk=request.id).status == "pending"


EMAIL_ONLY = {
    "type": "object",
    "properties": {"notify": {"type": "string", "format": "email"}},
    "required": ["notify"],
}


def test_a_format_alone_is_enforced_by_the_api_and_the_form(operator) -> None:
    # No pattern beside it: the one validator's format checker refuses it by itself.
    from dashboard.schema_forms import SchemaForm

    run, _lease, cp, request = interrupted(schema=EMAIL_ONLY)
    before = snapshot(run.pk)
    body = {"request_id": request.id, "checkpoint_id": cp.id, "value": {"notify": "nobody"}}
    response = post(client_for(operator), f"/api/runs/{run.pk}/resume", body, key="fmt")
    assert response.status_code == 422
    assert [e["pointer"] for e in response.json()["errors"]] == ["/value/notify"]
    assert snapshot(run.pk) == before

    from django.http import QueryDict

    refused = SchemaForm(EMAIL_ONLY, QueryDict("answer/notify=nobody"))
    assert not refused.is_valid()
    accepted = SchemaForm(EMAIL_ONLY, QueryDict("answer/notify=ops%40example.com"))
    assert accepted.is_valid() and accepted.value == {"notify": "ops@example.com"}

    body["value"] = {"notify": "ops@example.com"}
    response = post(client_for(operator), f"/api/runs/{run.pk}/resume", body, key="fmt-ok")
    assert response.status_code == 202
