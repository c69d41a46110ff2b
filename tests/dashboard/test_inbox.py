"""The inbox and answering from it: order, counts, forms, validation, stale forms, approvals."""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from runs import services
from runs.models import Attempt, InputRequest, Run
from tests.dashboard.support import HTMX, answer, ask, card_html, hidden, text
from tests.runs.factory import interrupted, snapshot

pytestmark = pytest.mark.django_db

CHOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "versions": {
            "type": "array",
            "items": {"type": "string", "enum": ["v1", "v2", "v3"]},
            "minItems": 1,
            "description": "旧版本仍被接受",
        },
        "grace_days": {"type": "integer", "minimum": 1, "maximum": 90, "default": 14},
    },
    "required": ["versions", "grace_days"],
}


def test_it_lists_what_the_user_may_answer_soonest_expiry_first(
    client: Client, approver: User
) -> None:
    _r1, _l1, _c1, late = interrupted(expires_in=7200)
    _r2, _l2, _c2, soon = interrupted(kind="auth_required", expires_in=600)
    client.force_login(approver)
    html = client.get("/").content.decode()
    assert html.index(f'id="request-{soon.id}"') < html.index(f'id="request-{late.id}"')
    # The badge and the list come from the same query (docs/dashboard.md).
    assert '<span id="inbox-count" class="badge badge-hot"' in html
    assert 'aria-label="2 waiting">2</span>' in html
    assert "请选择需要保持兼容的 Token 版本" in html


def test_it_shows_the_run_agent_step_kind_context_and_expiry(
    client: Client, approver: User
) -> None:
    run, _lease, _cp, req = interrupted(
        schema=CHOICE_SCHEMA,
        context={"service": "auth-gateway", "seen": {"v1": 3}},
        step_id="choose",
    )
    client.force_login(approver)
    card = card_html(client.get("/").content.decode(), req.id)
    assert run.id in card and "test-agent" in card and "<code><bdi>choose</bdi></code>" in card
    assert '<span class="chip chip-input">Input</span>' in card
    # A small object reads as a table, not JSON (issue 15).
    assert (
        "auth-gateway" in card and '<th scope="row"><bdi>v1</bdi></th><td><bdi>3</bdi></td>' in card
    )
    assert "data-countdown" in card and "Expires in 59m" in card
    assert "If unanswered by" in card and "the run fails." in card
    # The form: checkboxes for an enum array, a number with bounds and its default.
    assert 'type="checkbox" name="answer/versions" value="0"' in card
    assert 'name="answer/grace_days" value="14"' in card
    assert 'max="90"' in card and 'min="1"' in card
    assert "旧版本仍被接受" in card
    assert hidden(card, "checkpoint_id") == req.checkpoint_id
    assert hidden(card, "idempotency_key").startswith("form-")


@pytest.mark.parametrize(
    ("now", "shanghai", "utc"),
    [
        # Asked at 10:00 in Shanghai: the hour's deadline is today there, shown as a time.
        (dt.datetime(2026, 6, 1, 2, 0, tzinfo=dt.UTC), "11:00 CST", "03:00 UTC"),
        # Asked at 23:30 in Shanghai: the deadline is tomorrow there, so it has a date.
        (dt.datetime(2026, 6, 1, 15, 30, tzinfo=dt.UTC), "Jun 2, 00:30 CST", "16:30 UTC"),
    ],
)
def test_it_uses_the_users_time_zone(
    client: Client, approver: User, now: dt.datetime, shanghai: str, utc: str
) -> None:
    with time_machine.travel(now, tick=False):
        _run, _lease, _cp, req = interrupted(expires_in=3600)
        client.force_login(approver)
        client.cookies["tz"] = "Asia/Shanghai"
        card = card_html(client.get("/").content.decode(), req.id)
        assert f"If unanswered by {shanghai}" in card
        client.cookies["tz"] = "Not/AZone"
        card = card_html(client.get("/").content.decode(), req.id)
        assert f"If unanswered by {utc}" in card


def test_it_answers_and_resumes_the_run_without_javascript(client: Client, operator: User) -> None:
    run, _lease, _cp, req = interrupted(schema=CHOICE_SCHEMA)
    client.force_login(operator)
    response = answer(client, req, [("answer/versions", "1"), ("answer/grace_days", "30")])
    assert response.status_code == 303 and response["Location"] == "/"
    req.refresh_from_db()
    assert req.status == "answered"
    assert req.answer == {"versions": ["v2"], "grace_days": 30}
    assert req.answered_by == operator
    run.refresh_from_db()
    assert run.status == "queued"
    assert Attempt.objects.filter(run=run, reason="resume").count() == 1
    page = client.get(response["Location"]).content.decode()
    assert "Answer sent. The run resumes in a new attempt." in page
    assert f'id="request-{req.id}"' not in page  # the row left the inbox (docs/dashboard.md)


def test_it_swaps_in_the_answered_card_with_next_pending_and_a_fresh_count(
    client: Client, approver: User
) -> None:
    _r1, _l1, _c1, first = interrupted(expires_in=600)
    _r2, _l2, _c2, second = interrupted(expires_in=1200)
    client.force_login(approver)
    response = answer(client, first, [("answer/versions", "v1")], htmx=True)
    assert response.status_code == 200
    html = response.content.decode()
    assert html.startswith("\n<article") or html.lstrip().startswith("<article")
    assert f'id="request-{first.id}"' in html
    assert "Answer sent." in html
    assert "Answered by alice at" in html
    assert f'href="/#request-{second.id}">Next pending →</a>' in html
    assert 'id="inbox-count" class="badge badge-hot" hx-swap-oob="true"' in html
    assert 'aria-label="1 waiting">1</span>' in html


def test_it_shows_schema_errors_inline_and_sends_nothing(client: Client, operator: User) -> None:
    run, _lease, _cp, req = interrupted(schema=CHOICE_SCHEMA)
    client.force_login(operator)
    before = snapshot(run.id)
    key = "one-key"
    for htmx in (True, False):
        response = answer(client, req, [("answer/grace_days", "365")], htmx=htmx, key=key)
        assert response.status_code == 422
        html = response.content.decode()
        assert "Check the highlighted fields. Nothing was sent to the run." in html
        assert "This field is required." in html
        assert "Must be at most 90." in html
        assert 'name="answer/grace_days" value="365"' in html  # the value is kept
        assert 'aria-invalid="true"' in html
        # A fresh key comes with the re-rendered form; the refused one was not spent.
        assert hidden(card_html(html, req.id), "idempotency_key") != key
    assert snapshot(run.id) == before


def test_it_tells_a_stale_tab_who_answered_and_when(
    client: Client, operator: User, approver: User
) -> None:
    run, _lease, _cp, req = interrupted()
    client.force_login(approver)
    assert answer(client, req, [("answer/versions", "v1")], key="tab-1").status_code == 303
    attempts = Attempt.objects.filter(run=run).count()
    answered_at = InputRequest.objects.get(pk=req.id).answered_at
    other = Client()
    other.force_login(operator)
    response = answer(other, req, [("answer/versions", "v9")], htmx=True, key="tab-2")
    assert response.status_code == 409
    html = response.content.decode()
    # No time zone cookie (no JavaScript): the time names its zone.
    when = timezone.localtime(answered_at).strftime("%H:%M %Z")
    assert f"Already answered by alice at {when}." in html
    assert "Answered by alice at" in html and "v1" in html  # the refreshed, read-only card
    assert "answer-form" not in html
    # Without JavaScript: a redirect and the same message, never a second resume.
    response = answer(other, req, [("answer/versions", "v9")], key="tab-3")
    assert response.status_code == 303
    assert f"Already answered by alice at {when}." in other.get("/").content.decode()
    assert Attempt.objects.filter(run=run).count() == attempts
    assert InputRequest.objects.get(pk=req.id).answer == {"versions": ["v1"]}


def test_it_refuses_an_expired_request_with_a_clear_message(client: Client, operator: User) -> None:
    run, _lease, _cp, req = interrupted(expires_in=60)
    client.force_login(operator)
    before = snapshot(run.id)
    InputRequest.objects.filter(pk=req.id).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    response = answer(client, req, [("answer/versions", "v1")], htmx=True)
    assert response.status_code == 409
    assert "This request expired at" in response.content.decode()
    assert "it can no longer be answered." in response.content.decode()
    assert snapshot(run.id)["attempts"] == before["attempts"]
    # Once the sweep has run, the card says what happened instead.
    services.requests_expire()
    response = answer(client, req, [("answer/versions", "v1")], htmx=True)
    assert response.status_code == 409
    assert "No response — it expired at" in response.content.decode()
    assert "the run failed." in response.content.decode()


def test_it_closes_a_cancelled_runs_request_and_says_why(client: Client, operator: User) -> None:
    run, _lease, _cp, req = interrupted()
    services.run_cancel(run_id=run.id, reason="not needed")
    client.force_login(operator)
    response = answer(client, req, [("answer/versions", "v1")], htmx=True)
    assert response.status_code == 409
    assert "Closed: run cancelled" in response.content.decode()
    expired_tab = client.get("/?tab=expired").content.decode()
    assert f'id="request-{req.id}"' in expired_tab and "Closed: run cancelled" in expired_tab


def test_it_refuses_a_form_without_its_key_or_ids(client: Client, operator: User) -> None:
    run, _lease, _cp, req = interrupted()
    client.force_login(operator)
    before = snapshot(run.id)
    url = f"/runs/{run.id}/requests/{req.id}/answer"
    response = client.post(url, {"request_id": req.id, "checkpoint_id": req.checkpoint_id}, **HTMX)
    assert response.status_code == 400
    assert "This form is out of date" in response.content.decode()
    response = answer(client, req, [("answer/versions", "v1")], key="k" * 256)
    assert response.status_code == 303
    assert snapshot(run.id) == before


def test_it_refuses_an_answer_on_a_checkpoint_the_run_moved_past(
    client: Client, operator: User
) -> None:
    _run, _lease, _cp, req = interrupted()
    client.force_login(operator)
    response = answer(client, req, [("answer/versions", "v1")], htmx=True, checkpoint_id="cp_old")
    assert response.status_code == 409
    assert "The run's state changed since this question was asked." in text(response)
    assert InputRequest.objects.get(pk=req.id).status == "pending"


def test_it_approves_and_denies_with_the_verb_and_target_on_the_buttons(
    client: Client, approver: User
) -> None:
    run, _lease, _cp, req = ask(
        kind="auth_required",
        action={
            "tool": "update_auth_config",
            "operation": "update",
            "target": "staging/auth/config",
            "reversibility": "irreversible",
            "before": {"ttl": 3600},
            "after": {"ttl": 1800},
        },
        reason="Token v1 must stop working.",
    )
    client.force_login(approver)
    card = card_html(client.get("/").content.decode(), req.id)
    assert (
        "<bdi>Update</bdi> <bdi>staging/auth/config</bdi> via <bdi>update_auth_config</bdi>" in card
    )
    assert '<span class="chip chip-danger">Cannot be undone</span>' in card
    assert "Approve <bdi>update_auth_config</bdi> — cannot be undone" in card
    assert "Deny <bdi>update_auth_config</bdi>" in card
    assert '<span class="diff-del"><bdi>-  &quot;ttl&quot;: 3600</bdi></span>' in card
    assert '<span class="diff-add"><bdi>+  &quot;ttl&quot;: 1800</bdi></span>' in card
    assert "Token v1 must stop working." in card
    # Deny needs a reason; nothing is sent without one.
    response = answer(client, req, {"decision": "deny"}, htmx=True)
    assert response.status_code == 422
    assert "Say why you deny it" in response.content.decode()
    assert InputRequest.objects.get(pk=req.id).status == "pending"
    response = answer(
        client, req, {"decision": "approve", "comment": "ok, ticket SEC-1"}, htmx=True
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "Approved. The run goes on and runs update_auth_config." in html
    assert "Approved by alice at" in html and "ok, ticket SEC-1" in html
    req.refresh_from_db()
    assert req.answer == {"decision": "approve", "comment": "ok, ticket SEC-1"}
    assert Run.objects.get(pk=run.id).status == "queued"
    # A second approver's stale tab learns who decided.
    second = Client()
    second.force_login(User.objects.create_user("bob"))
    second_user = User.objects.get(username="bob")
    second_user.groups.add(*User.objects.get(username="alice").groups.all())
    response = answer(second, req, {"decision": "deny", "comment": "no"}, htmx=True)
    assert response.status_code == 409
    assert "Already approved by alice at" in response.content.decode()


def test_it_denies_with_a_reason(client: Client, approver: User) -> None:
    # The config store can restore a version: the server knows it can be undone.
    _run, _lease, _cp, req = ask(kind="auth_required", action={"tool": "config_store"})
    client.force_login(approver)
    card = card_html(client.get("/").content.decode(), req.id)
    assert "Approve and run <bdi>config_store</bdi>" in card and "btn-primary" in card
    assert "Can be undone" in card
    response = answer(client, req, {"decision": "deny", "comment": "wrong week"})
    assert response.status_code == 303
    req.refresh_from_db()
    assert req.answer == {"decision": "deny", "comment": "wrong week"}
    assert "Denied. The run is told not to run config_store." in client.get("/").content.decode()
    answered = client.get("/?tab=answered").content.decode()
    assert "Denied by alice at" in answered and "wrong week" in answered


def test_it_answers_a_small_choice_with_one_click(client: Client, operator: User) -> None:
    schema = {
        "type": "object",
        "properties": {"go": {"type": "string", "enum": ["ship", "hold"], "title": "Ship it?"}},
        "required": ["go"],
    }
    _run, _lease, _cp, req = interrupted(schema=schema)
    client.force_login(operator)
    card = card_html(client.get("/").content.decode(), req.id)
    assert 'name="answer/go" value="0" class="btn btn-primary btn-choice"' in card
    assert "Submit response" not in card
    assert answer(client, req, {"answer/go": "1"}).status_code == 303
    assert InputRequest.objects.get(pk=req.id).answer == {"go": "hold"}


def test_it_still_shows_a_request_it_cannot_render(client: Client, operator: User) -> None:
    run, _lease, _cp, req = interrupted()
    # A schema this dashboard cannot read (rows are written only by services; this one is
    # corrupted on purpose to prove the card degrades instead of vanishing).
    InputRequest.objects.filter(pk=req.id).update(accepted_schema=["not", "an", "object"])
    client.force_login(operator)
    html = client.get("/").content.decode()
    card = card_html(html, req.id)
    assert "请选择需要保持兼容的 Token 版本" in card
    assert f'href="/runs/{run.id}/"' in card
