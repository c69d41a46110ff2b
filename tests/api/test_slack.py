"""Deciding from Slack (issue 28): messages with the card and buttons, clicks that decide
through the same service as the dashboard, every message rewritten when the request
changes wherever it was decided, and a signed, replay-proof endpoint.

**The one fake is Slack itself**, played by ``runtime/slack_standin.py`` over real HTTP on
127.0.0.1. Its contract, which these tests hold it to: it answers the six Web API methods
Holdpoint calls (``chat.postMessage``, ``chat.update``, ``chat.postEphemeral``,
``views.open``, ``conversations.history``, ``users.info``) with Slack's documented shapes
(``{"ok": true, …}`` or ``{"ok": false, "error": …}``), refuses a call without the bot
token, records every call, and builds the ``block_actions`` and ``view_submission``
payloads Slack sends, form-encoded and signed by ``slack_sdk``'s ``SignatureVerifier``
with the app's signing secret. Holdpoint's endpoint, database and outbound guard are the
real ones.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from slack_sdk.signature import SignatureVerifier

from ledger.notifications import notifications_send
from ledger.slack import slack_sync
from runs import services
from runs.approvals import parse_policy
from runs.models import (
    AgentApprovalPolicy,
    ApprovalVote,
    InputRequest,
    Notification,
    RunEvent,
    SlackIdentity,
    SlackMessage,
)
from runs.services.slack import SlackAccount, link_token, slack_link
from runtime.slack_standin import SIGNING_SECRET, TEAM, TOKEN, Workspace
from tests.conftest import _user
from tests.dashboard.support import answer
from tests.runs.factory import AGENT, interrupted
from tests.slack_support import URL, slack_standin

pytestmark = pytest.mark.django_db

CHANNELS = {"approver": "C0APPROVERS", "admin": "C0ADMINS"}
EDITABLE = {
    "schema": {
        "type": "object",
        "properties": {"ttl": {"type": "integer", "title": "TTL", "minimum": 60}},
        "required": ["ttl"],
    },
    "value": {"ttl": 3600},
}


@pytest.fixture
def space(settings: Any) -> Iterator[Workspace]:
    settings.HOLDPOINT_PUBLIC_URL = "https://holdpoint.example"
    with slack_standin(settings, CHANNELS) as space:
        yield space


def linked(name: str, group: str, slack_id: str) -> User:
    user = _user(name, group)
    user.email = f"{name}@example.com"
    user.save()
    slack_link(user=user, account=SlackAccount(TEAM, slack_id), how="profile")
    return user


def approval(policy: dict[str, Any] | None = None, **action: Any) -> InputRequest:
    if policy is not None:
        AgentApprovalPolicy.objects.update_or_create(
            agent=AGENT, defaults={"policy": parse_policy(policy)}
        )
    return interrupted(
        kind="auth_required",
        action={
            "tool": "config_store",
            "action": "update_auth_config",
            "target": "staging/auth/config",
            "reversibility": "reversible",
            **action,
        },
    )[3]


def posted(space: Workspace, channel: str) -> dict[str, Any]:
    [message] = space.messages[channel]
    return message


def buttons(message: dict[str, Any]) -> list[str]:
    return [
        e.get("action_id")
        for b in message["blocks"]
        if b.get("type") == "actions"
        for e in b.get("elements", [])
    ]


def shown(message: dict[str, Any]) -> str:
    return json.dumps(message["blocks"], ensure_ascii=False)


def methods(space: Workspace) -> list[str]:
    return [m for m, _ in space.calls]


def ephemerals(space: Workspace, slack_id: str) -> list[str]:
    return [e["text"] for e in space.ephemeral.get(slack_id, [])]


def test_a_pending_approval_is_posted_to_each_deciding_groups_channel(space: Workspace) -> None:
    linked("alice", "approver", "U0ALICE")
    req = approval()
    question = interrupted(kind="input_required")[3]  # approvers and admins may answer it
    notifications_send()
    keys = [m["metadata"]["event_payload"]["key"] for m in space.messages["C0APPROVERS"]]
    assert keys == [f"{req.id}:slack:approver:pending", f"{question.id}:slack:approver:pending"]
    message = space.messages["C0APPROVERS"][0]
    assert {"hp:approve", "hp:deny", "hp:respond", "hp:open"} <= set(buttons(message))
    assert "Approve update_auth_config on staging/auth/config" in shown(message)
    assert "0 of 1 approvals" in shown(message) and "Time left" in shown(message)
    # The admin group decides too: its own channel, its own message; viewers have none.
    assert len(space.messages["C0ADMINS"]) == 2
    assert SlackMessage.objects.filter(request=req).count() == 2
    # Nothing is posted twice: the sweep again posts nothing.
    notifications_send()
    assert methods(space).count("chat.postMessage") == 4


def test_a_click_decides_as_the_linked_person_and_every_message_is_rewritten(
    space: Workspace,
) -> None:
    alice = linked("alice", "approver", "U0ALICE")
    req = approval()
    notifications_send()
    message = posted(space, "C0APPROVERS")
    status, _body = space.click("U0ALICE", "C0APPROVERS", message["ts"], "hp:approve")
    assert status == 200
    req.refresh_from_db()
    assert req.status == "answered" and req.answered_by == alice
    [vote] = ApprovalVote.objects.filter(request=req)
    assert vote.via == "slack" and vote.user == alice
    assert (
        RunEvent.objects.get(run_id=req.run_id, type="request.answered").payload["via"] == "slack"
    )
    assert ephemerals(space, "U0ALICE") == ["You approved it."]
    # Both channels' messages now say who decided, and offer nothing more.
    for channel in CHANNELS.values():
        rewritten = posted(space, channel)
        assert rewritten["edited"] == 1 and "Approved* by alice" in shown(rewritten)
        assert buttons(rewritten) == []
    assert set(SlackMessage.objects.values_list("final", flat=True)) == {True}


def test_two_approvers_one_in_slack_one_on_the_dashboard(space: Workspace, client: Client) -> None:
    linked("alice", "approver", "U0ALICE")
    bob = linked("bob", "approver", "U0BOB")
    req = approval({"required": 2})
    notifications_send()
    message = posted(space, "C0APPROVERS")
    space.click("U0ALICE", "C0APPROVERS", message["ts"], "hp:approve")
    assert "It waits for more approvals" in ephemerals(space, "U0ALICE")[0]
    for channel in CHANNELS.values():
        assert "1 of 2 approvals: alice" in shown(posted(space, channel))
        assert "hp:approve" in buttons(posted(space, channel))
    client.force_login(bob)
    answer(client, req, {"decision": "approve"})
    assert slack_sync() == 2  # the sweep: the dashboard's decision reaches every message
    for channel in CHANNELS.values():
        assert "Approved* by bob" in shown(posted(space, channel))
        assert buttons(posted(space, channel)) == []
    assert sorted(ApprovalVote.objects.values_list("via", flat=True)) == ["dashboard", "slack"]


def test_an_unlinked_clicker_is_told_how_to_link_and_nothing_is_decided(
    space: Workspace, client: Client
) -> None:
    carol = _user("carol", "approver")
    req = approval()
    notifications_send()
    message = posted(space, "C0APPROVERS")
    space.click("U0CAROL", "C0APPROVERS", message["ts"], "hp:approve")
    [said] = space.ephemeral["U0CAROL"]
    assert "not linked" in said["text"] and "/profile/slack/" in said["text"]
    assert InputRequest.objects.get(pk=req.id).status == "pending"
    # The link Slack showed only them: signed in, they confirm, and the click then counts.
    path = said["text"].split("https://holdpoint.example")[1].split("|")[0]
    client.force_login(carol)
    page = client.get(path).content.decode()
    assert "U0CAROL" in page and "data-slack-link" in page
    client.post(path)
    assert SlackIdentity.objects.get(user=carol).slack_user_id == "U0CAROL"
    space.click("U0CAROL", "C0APPROVERS", message["ts"], "hp:approve")
    assert InputRequest.objects.get(pk=req.id).status == "answered"
    # A forged or stale link links nothing.
    assert (
        client.get(
            "/profile/slack/" + link_token(SlackAccount(TEAM, "U0X"))[:-3] + "abc"
        ).status_code
        == 404
    )


def test_a_slack_account_linked_to_someone_else_is_not_taken_over(
    space: Workspace, client: Client
) -> None:
    linked("alice", "approver", "U0ALICE")
    mallory = _user("mallory", "approver")
    client.force_login(mallory)
    response = client.post(
        "/profile/slack/" + link_token(SlackAccount(TEAM, "U0ALICE")), follow=True
    )
    assert "linked to another person" in response.content.decode()
    assert SlackIdentity.objects.get(slack_user_id="U0ALICE").user.username == "alice"


def test_linking_by_a_confirmed_email_when_an_administrator_allows_it(
    space: Workspace, settings: Any
) -> None:
    settings.HOLDPOINT_SLACK_LINK_BY_EMAIL = True
    approver = _user("approver", "approver")
    approver.email = "approver@example.com"  # the stand-in's U0APPROVER
    approver.save()
    req = approval()
    notifications_send()
    space.click("U0APPROVER", "C0APPROVERS", posted(space, "C0APPROVERS")["ts"], "hp:approve")
    assert SlackIdentity.objects.get(user=approver).linked_by == "email"
    assert InputRequest.objects.get(pk=req.id).answered_by == approver


def test_an_address_slack_has_not_confirmed_links_nobody(space: Workspace, settings: Any) -> None:
    settings.HOLDPOINT_SLACK_LINK_BY_EMAIL = True
    approver = _user("approver", "approver")
    approver.email = "approver@example.com"
    approver.save()
    space.unconfirmed.add("U0APPROVER")
    req = approval()
    notifications_send()
    space.click("U0APPROVER", "C0APPROVERS", posted(space, "C0APPROVERS")["ts"], "hp:approve")
    assert not SlackIdentity.objects.exists()
    assert "not linked" in ephemerals(space, "U0APPROVER")[0]
    assert InputRequest.objects.get(pk=req.id).status == "pending"


def test_someone_who_may_not_decide_is_told_why_privately(space: Workspace) -> None:
    linked("vera", "viewer", "U0VERA")
    linked("sam", "approver", "U0SAM")
    req = approval({"groups": ["admin"]})
    notifications_send()
    message = posted(space, "C0ADMINS")
    space.click("U0VERA", "C0ADMINS", message["ts"], "hp:approve")
    assert "You cannot decide this" in ephemerals(space, "U0VERA")[0]
    space.click("U0SAM", "C0ADMINS", message["ts"], "hp:approve")
    assert "Nothing was decided" in ephemerals(space, "U0SAM")[0]
    assert "admin" in ephemerals(space, "U0SAM")[0]
    assert ApprovalVote.objects.filter(request=req).count() == 0


def test_deny_asks_for_the_reason_in_a_modal(space: Workspace) -> None:
    linked("alice", "approver", "U0ALICE")
    req = approval()
    notifications_send()
    space.click("U0ALICE", "C0APPROVERS", posted(space, "C0APPROVERS")["ts"], "hp:deny")
    [(view_id, view)] = space.views.items()
    assert view["callback_id"] == "hp:decide"
    status, body = space.submit(view_id, {"hp:comment": {"type": "plain_text_input", "value": ""}})
    assert json.loads(body)["response_action"] == "errors"
    assert InputRequest.objects.get(pk=req.id).status == "pending"
    status, body = space.submit(
        view_id, {"hp:comment": {"type": "plain_text_input", "value": "wrong target"}}
    )
    assert (status, body) == (200, b"")
    req.refresh_from_db()
    assert req.answer == {"decision": "deny", "comment": "wrong target"}
    assert "Denied* by alice" in shown(posted(space, "C0APPROVERS"))


def test_edit_and_approve_shows_the_generated_form_and_its_errors(space: Workspace) -> None:
    linked("alice", "approver", "U0ALICE")
    req = approval(editable=EDITABLE)
    notifications_send()
    space.click("U0ALICE", "C0APPROVERS", posted(space, "C0APPROVERS")["ts"], "hp:edit")
    [(view_id, view)] = space.views.items()
    [ttl] = [b for b in view["blocks"] if b["block_id"] == "ttl"]
    assert ttl["element"]["type"] == "number_input" and ttl["element"]["initial_value"] == "3600"
    _status, body = space.submit(view_id, {"ttl": {"type": "number_input", "value": "5"}})
    errors = json.loads(body)["errors"]
    assert list(errors) == ["ttl"] and "60" in errors["ttl"]  # the schema's own check
    assert ApprovalVote.objects.filter(request=req).count() == 0
    status, body = space.submit(view_id, {"ttl": {"type": "number_input", "value": "120"}})
    assert (status, body) == (200, b"")
    req.refresh_from_db()
    assert req.answer["decision"] == "approve" and req.answer["edited"] == {"ttl": 120}


def test_a_message_that_showed_an_older_version_decides_nothing(
    space: Workspace, client: Client
) -> None:
    alice = linked("alice", "approver", "U0ALICE")
    carol = linked("carol", "approver", "U0CAROL")
    req = approval({"required": 2}, editable=EDITABLE)
    notifications_send()
    old = json.loads(json.dumps(posted(space, "C0APPROVERS")))
    client.force_login(carol)
    answer(client, req, {"decision": "approve", "answer/ttl": "60"})  # an edit: a new round
    # Slack still shows alice the old message (the stand-in keeps it as she saw it).
    space.messages["C0APPROVERS"][0]["blocks"] = old["blocks"]
    space.click("U0ALICE", "C0APPROVERS", old["ts"], "hp:approve")
    assert "edited since this message was posted" in ephemerals(space, "U0ALICE")[0]
    assert not ApprovalVote.objects.filter(request=req, user=alice).exists()
    # Rewritten with the edit: its buttons now decide round 1.
    [approve] = [
        e
        for b in posted(space, "C0APPROVERS")["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == "hp:approve"
    ]
    assert json.loads(approve["value"])["v"] == 1


def test_a_simple_question_is_answered_with_one_click(space: Workspace) -> None:
    linked("olga", "operator", "U0OLGA")
    req = interrupted(
        kind="input_required",
        schema={
            "type": "object",
            "properties": {"go": {"type": "string", "enum": ["canary", "all", "stop"]}},
            "required": ["go"],
        },
    )[3]
    notifications_send()
    message = next(m for ms in space.messages.values() for m in ms)
    assert [b for b in buttons(message) if b == "hp:choose"] == ["hp:choose"] * 3
    # The stand-in presses the first button with the label it has; press "all" by its value.
    for block in message["blocks"]:
        if block.get("type") == "actions":
            block["elements"] = [
                e
                for e in block["elements"]
                if '"c": "all"' in e.get("value", "") or e["action_id"] != "hp:choose"
            ]
    channel = next(c for c, ms in space.messages.items() if message in ms)
    space.click("U0OLGA", channel, message["ts"], "hp:choose")
    req.refresh_from_db()
    assert req.answer == {"go": "all"} and req.answered_by.username == "olga"


def test_a_richer_question_opens_its_form_in_a_modal(space: Workspace) -> None:
    linked("olga", "operator", "U0OLGA")
    req = interrupted(kind="input_required", schema={"versions": "string[]", "note": "string?"})[3]
    notifications_send()
    channel, [message] = next(iter(space.messages.items()))
    space.click("U0OLGA", channel, message["ts"], "hp:form")
    [(view_id, view)] = space.views.items()
    assert sorted(b["block_id"] for b in view["blocks"]) == ["note", "versions"]
    _s, body = space.submit(view_id, {"versions": {"type": "plain_text_input", "value": ""}})
    assert "versions" in json.loads(body)["errors"]
    space.submit(view_id, {"versions": {"type": "plain_text_input", "value": "v1\nv2\n"}})
    req.refresh_from_db()
    assert req.answer == {"versions": ["v1", "v2"]}


def test_an_expired_or_cancelled_request_is_shown_closed(space: Workspace) -> None:
    req = approval()
    notifications_send()
    services.run_cancel(run_id=req.run_id, reason="not needed")
    assert slack_sync() == 2
    for channel in CHANNELS.values():
        assert "Closed" in shown(posted(space, channel)) and buttons(posted(space, channel)) == []
    assert slack_sync() == 0  # final: not rewritten again


def test_a_post_in_doubt_is_found_in_the_channel_not_posted_twice(space: Workspace) -> None:
    """A sender that died after Slack took the message: the next try finds it by the key
    in its metadata (conversations.history) and records it."""
    req = approval({"groups": ["approver"]})
    row = Notification.objects.get(channel="slack", request=req)
    space.call(
        "chat.postMessage",
        TOKEN,
        {
            "channel": "C0APPROVERS",
            "text": "posted before the crash",
            "blocks": [],
            "metadata": {"event_type": "holdpoint_request", "event_payload": {"key": row.key}},
        },
    )
    Notification.objects.filter(pk=row.pk).update(attempts=1)  # the try that died
    notifications_send()
    assert methods(space).count("chat.postMessage") == 1  # only the one before the crash
    assert "conversations.history" in methods(space)
    assert SlackMessage.objects.get(request=req).ts == posted(space, "C0APPROVERS")["ts"]


def test_slack_errors_are_retried_by_the_outbox(space: Workspace) -> None:
    req = approval({"groups": ["approver"]})
    space.fail_next("chat.postMessage", "ratelimited")
    notifications_send()
    row = Notification.objects.get(channel="slack", request=req)
    assert row.status == "pending" and "ratelimited" in row.last_error
    assert SlackMessage.objects.count() == 0


def _signed(
    body: bytes, *, secret: str = SIGNING_SECRET, stamp: int | None = None
) -> dict[str, Any]:
    stamp = int(time.time()) if stamp is None else stamp
    signature = SignatureVerifier(secret).generate_signature(timestamp=str(stamp), body=body)
    return {"HTTP_X_SLACK_REQUEST_TIMESTAMP": str(stamp), "HTTP_X_SLACK_SIGNATURE": signature}


def test_only_requests_signed_by_slack_now_and_once_are_heard(space: Workspace) -> None:
    alice = linked("alice", "approver", "U0ALICE")
    req = approval()
    notifications_send()
    message = posted(space, "C0APPROVERS")
    [approve] = [
        e
        for b in message["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == "hp:approve"
    ]
    payload = {
        "type": "block_actions",
        "team": {"id": TEAM},
        "user": {"id": "U0ALICE"},
        "channel": {"id": "C0APPROVERS"},
        "actions": [{"action_id": "hp:approve", "value": approve["value"], "action_ts": "1.1"}],
    }
    body = urlencode({"payload": json.dumps(payload)}).encode()
    form = "application/x-www-form-urlencoded"
    client = Client()
    for headers in (
        {},  # unsigned
        _signed(body, secret="another-apps-secret"),
        _signed(body, stamp=int(time.time()) - 600),  # outside the five minutes
        {**_signed(body), "HTTP_X_SLACK_SIGNATURE": "v0=" + "0" * 64},
    ):
        response = client.post(URL, body, content_type=form, **headers)
        assert response.status_code == 401, headers
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "authentication_failed"
    tampered = body.replace(b"hp%3Aapprove", b"hp%3Adeny")
    assert client.post(URL, tampered, content_type=form, **_signed(body)).status_code == 401
    assert InputRequest.objects.get(pk=req.id).status == "pending"
    headers = _signed(body)
    assert client.post(URL, body, content_type=form, **headers).status_code == 200
    replay = client.post(URL, body, content_type=form, **headers)
    assert replay.status_code == 401 and "replay" in replay.json()["detail"]
    assert ApprovalVote.objects.filter(request=req, user=alice).count() == 1


def test_without_slack_settings_the_endpoint_is_not_there(settings: Any, client: Client) -> None:
    settings.HOLDPOINT_SLACK_CHANNELS = {}
    response = client.post(URL, b"payload=%7B%7D", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_malformed_payloads_are_400_and_decide_nothing(space: Workspace) -> None:
    req = approval()
    client = Client()
    rng = random.Random(28)
    bodies = [b"", b"payload=", b"payload=not-json", b"payload=%5B%5D", b"a=1&a=2"]
    for _ in range(40):
        junk: Any = rng.choice(
            [
                {
                    "type": "block_actions",
                    "user": {"id": "U0" + "A" * rng.randint(0, 60)},
                    "team": {"id": TEAM},
                },
                {
                    "type": "block_actions",
                    "team": {"id": TEAM},
                    "user": {"id": "U0X"},
                    "actions": rng.choice(
                        [None, [], [{}], [{"action_id": "hp:approve", "value": '{"r": 1}'}]]
                    ),
                },
                {
                    "type": "view_submission",
                    "team": {"id": TEAM},
                    "user": {"id": "U0X"},
                    "view": rng.choice(
                        [None, {}, {"callback_id": "hp:form", "private_metadata": "{"}]
                    ),
                },
                {"type": rng.choice(["shortcut", "message_action", 7, None])},
            ]
        )
        if isinstance(junk, dict):
            junk = {**junk, "n": len(bodies)}  # each body once: the same one again is a replay
        bodies.append(urlencode({"payload": json.dumps(junk)}).encode())
    for body in bodies:
        response = client.post(
            URL, body, content_type="application/x-www-form-urlencoded", **_signed(body)
        )
        assert response.status_code in (200, 400), (body, response.status_code)
        if response.status_code == 400:
            assert response.json()["code"] == "malformed_request"
    # Bytes that are not UTF-8 cannot even be checked (slack_sdk decodes them): refused.
    garbage = client.post(
        URL,
        b"\xff\xfe",
        content_type="application/x-www-form-urlencoded",
        HTTP_X_SLACK_REQUEST_TIMESTAMP=str(int(time.time())),
        HTTP_X_SLACK_SIGNATURE="v0=" + "a" * 64,
    )
    assert garbage.status_code == 401
    assert InputRequest.objects.get(pk=req.id).status == "pending"
    assert ApprovalVote.objects.count() == 0


def test_the_endpoint_is_throttled_per_slack_user(space: Workspace, settings: Any) -> None:
    settings.HOLDPOINT_THROTTLE_USER = "2/min"
    client = Client()
    payload = {
        "type": "block_actions",
        "team": {"id": TEAM},
        "user": {"id": "U0FLOOD"},
        "actions": [],
    }
    codes = []
    for i in range(4):
        payload["n"] = i
        body = urlencode({"payload": json.dumps(payload)}).encode()
        codes.append(
            client.post(
                URL, body, content_type="application/x-www-form-urlencoded", **_signed(body)
            ).status_code
        )
    assert codes[2:] == [429, 429]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_slack_click_and_a_dashboard_click_at_once_decide_once_on_postgres(
    space: Workspace,
) -> None:
    """Alice in Slack and Bob on the dashboard press Approve together, many times: the run's
    lock orders them, one decides, the other is told, and nothing is recorded twice."""
    from tests.runs.test_races import ROUNDS, race

    linked("alice", "approver", "U0ALICE")
    bob = linked("bob", "approver", "U0BOB")
    Group.objects.get(name="approver")
    winners = []
    for i in range(ROUNDS // 5):
        space.messages.clear()
        req = approval({"groups": ["approver"]})
        notifications_send()
        message = posted(space, "C0APPROVERS")
        dashboard = Client()
        dashboard.force_login(bob)
        race(
            lambda: space.click("U0ALICE", "C0APPROVERS", message["ts"], "hp:approve"),
            lambda: answer(dashboard, req, {"decision": "approve"}, key=f"bob-{i}"),
        )
        req.refresh_from_db()
        assert req.status == "answered"
        assert ApprovalVote.objects.filter(request=req).count() == 1
        assert RunEvent.objects.filter(run_id=req.run_id, type="request.answered").count() == 1
        winners.append(req.answered_by.username)
        slack_sync()
        assert buttons(posted(space, "C0APPROVERS")) == []
        services.run_cancel(run_id=req.run_id, reason="next round")
    assert set(winners) <= {"alice", "bob"}


def test_the_profile_page_shows_the_link_and_unlinks_it(space: Workspace, client: Client) -> None:
    alice = linked("alice", "approver", "U0ALICE")
    client.force_login(alice)
    page = client.get("/profile/").content.decode()
    assert "data-profile-slack" in page and "U0ALICE" in page
    client.post("/profile/slack/unlink")
    assert not SlackIdentity.objects.filter(user=alice).exists()
    assert "Not linked" in client.get("/profile/").content.decode()
    assert client.get("/profile/slack/unlink").status_code == 405


def test_a_message_slack_no_longer_has_is_given_up_after_the_outboxs_tries(
    space: Workspace,
) -> None:
    from ledger.notifications import MAX_ATTEMPTS

    req = approval({"groups": ["approver"]})
    notifications_send()
    space.messages["C0APPROVERS"].clear()  # deleted in Slack
    services.run_cancel(run_id=req.run_id, reason="not needed")
    for _ in range(MAX_ATTEMPTS):
        assert slack_sync() == 0
    message = SlackMessage.objects.get(request=req)
    assert message.final and "message_not_found" in message.last_error
    assert methods(space).count("chat.update") == MAX_ATTEMPTS
    slack_sync()
    assert methods(space).count("chat.update") == MAX_ATTEMPTS  # given up: not tried again
