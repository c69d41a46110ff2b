"""The approval card for a team (issue 18): edit before approving, send back, partial
approvals ("1 of 2 approvals: alice 10:02"), who else may decide, and why a person may not."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs import services
from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy, InputRequest
from tests.conftest import _user
from tests.dashboard.support import answer, card_html, text
from tests.runs.factory import AGENT, claim, epochs, interrupted

pytestmark = pytest.mark.django_db

EDITABLE = {
    "schema": {
        "type": "object",
        "properties": {
            "ttl": {"type": "integer", "title": "TTL", "minimum": 60},
            "note": {"type": "string", "title": "Note"},
        },
        "required": ["ttl"],
    },
    "value": {"ttl": 3600, "note": "rotate"},
}


def approval(policy: dict | None = None, **action):  # type: ignore[no-untyped-def]
    if policy is not None:
        AgentApprovalPolicy.objects.update_or_create(
            agent=AGENT, defaults={"policy": parse_policy(policy)}
        )
    _run, _lease, _cp, req = interrupted(
        kind="auth_required",
        action={
            "tool": "config_store",
            "target": "staging/auth/config",
            "action": "update_auth_config",
            "change": {"ttl": {"from": 7200, "to": 3600}},
            "reversibility": "reversible",
            **action,
        },
    )
    return req


def test_the_card_offers_the_edit_form_prefilled_and_send_back(
    client: Client, approver: User
) -> None:
    req = approval(editable=EDITABLE)
    client.force_login(approver)
    card = card_html(client.get("/").content.decode(), req.id)
    assert "Edit before approving" in card and "data-edit-args" in card
    assert 'name="answer/ttl" value="3600"' in card
    assert "data-edit-diff" in card
    assert 'value="respond"' in card and "Send back with a comment" in card


def test_approving_with_an_edit_from_the_card_records_it_and_shows_the_diff(
    client: Client, approver: User
) -> None:
    req = approval(editable=EDITABLE)
    client.force_login(approver)
    response = answer(
        client,
        req,
        {"decision": "approve", "answer/ttl": "1800", "answer/note": "rotate"},
        htmx=True,
    )
    assert response.status_code == 200, text(response)
    body = text(response)
    assert "Approved with edits." in body
    assert "Approved with edits by alice" in body
    # One diff: the change as it was approved (7200 → 1800), and the edit in a line.
    assert "data-edit-decided" in body and "ttl: 3600 → 1800" in body
    assert "+ ttl: 1800" in body and body.count('class="diff"') == 1
    req.refresh_from_db()
    assert req.answer == {"decision": "approve", "edited": {"ttl": 1800, "note": "rotate"}}


def test_an_unchanged_edit_form_is_a_plain_approval_and_a_bad_edit_is_shown_inline(
    client: Client, approver: User
) -> None:
    req = approval(editable=EDITABLE)
    client.force_login(approver)
    response = answer(client, req, {"decision": "approve", "answer/ttl": "5"}, htmx=True)
    assert response.status_code == 422
    assert "Check the highlighted fields" in text(response)
    assert InputRequest.objects.get(pk=req.id).status == "pending"
    response = answer(
        client, req, {"decision": "approve", "answer/ttl": "3600", "answer/note": "rotate"}
    )
    assert response.status_code == 303
    req.refresh_from_db()
    assert req.answer == {"decision": "approve"}


def test_send_back_needs_a_comment_and_says_what_happens(client: Client, approver: User) -> None:
    req = approval()
    client.force_login(approver)
    response = answer(client, req, {"decision": "respond"}, htmx=True)
    assert response.status_code == 422
    assert "Write what the agent should change" in text(response)
    response = answer(client, req, {"decision": "respond", "comment": "use 1800"}, htmx=True)
    assert response.status_code == 200
    assert "Sent back. The run gets your comment" in text(response)
    assert "Sent back by alice" in text(response)


def test_the_card_counts_approvals_and_names_who_else_may_decide(
    client: Client, approver: User
) -> None:
    bob = _user("bob", "approver")
    req = approval({"required": 2})
    client.force_login(approver)
    card = card_html(client.get("/").content.decode(), req.id)
    assert "0 of 2 approvals" in card
    assert "Who may approve: <bdi>alice, bob</bdi>" in card
    response = answer(client, req, {"decision": "approve", "comment": "ok"}, htmx=True)
    assert response.status_code == 200
    body = text(response)
    assert "Approval recorded. It needs 1 more approval" in body
    assert "1 of 2 approvals" in body and "You approved " in body and "“<bdi>ok</bdi>”" in body
    # Alice may not approve twice; the card says why, and who may, and offers no button.
    assert "You already approved this" in body and "Who may approve: bob" in body
    assert "data-approve-blocked" in body and 'value="approve"' not in body
    client.force_login(bob)
    card = text_of(card_html(client.get("/").content.decode(), req.id))
    assert "1 of 2 approvals" in card and "alice approved " in card and "“<bdi>ok</bdi>”" in card
    assert "data-approve-blocked" not in card


def test_a_person_the_policy_keeps_out_sees_why(client: Client, approver: User) -> None:
    run = services.run_start(agent=AGENT, input={"n": 1}, user=approver)
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="send", state={})
    req = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="auth_required",
        prompt="Send?",
        action={"tool": "email", "target": "ops@example.com", "reversibility": "irreversible"},
    )
    _user("bob", "approver")
    client.force_login(approver)
    card = card_html(client.get(f"/runs/{run.id}/").content.decode(), req.id)
    assert "You started this run or answered its last question" in text_of(card)
    assert "Who may approve: bob" in text_of(card)
    response = answer(client, req, {"decision": "approve"}, origin="run", htmx=True)
    assert response.status_code == 403
    assert InputRequest.objects.get(pk=req.id).status == "pending"


def test_a_member_of_no_allowed_group_sees_disabled_buttons_and_the_groups(
    client: Client, approver: User
) -> None:
    req = approval({"groups": ["release-managers"]})
    client.force_login(approver)
    # Not theirs to decide: under All pending, not Needs me.
    assert req.id not in client.get("/").content.decode()
    card = text_of(card_html(client.get("/?tab=all").content.decode(), req.id))
    assert "Only members of release-managers may decide this approval." in card


def test_a_live_push_for_one_person_says_why_too(approver: User) -> None:
    """A live push renders the card for a ``live.roles.Person`` (pk and permissions, no
    ``groups``): it says why as the page does, instead of "could not be shown"."""
    from django.contrib.auth.models import Group

    from dashboard.pages.cards import build_card
    from live.roles import Person, Role

    dave = _user("dave", "approver")
    dave.groups.add(Group.objects.get_or_create(name="release-managers")[0])
    req = approval({"groups": ["release-managers"]})
    role = Role(frozenset(approver.get_all_permissions()))
    card = build_card(req, user=Person(approver.pk, role), origin="inbox")
    assert card.broken == ""
    assert "Only members of release-managers may decide this approval." in card.who_can
    card = build_card(req, user=Person(dave.pk, role), origin="inbox")
    assert card.broken == "" and card.can_answer
    # Shared by everyone with these permissions (the run page's push): nobody in particular.
    card = build_card(req, user=role, origin="run")
    assert card.broken == ""


def text_of(html: str) -> str:
    import html as html_module

    return html_module.unescape(html)


# --- People are told (issue 18) ---------------------------------------------------------------


def test_the_profile_page_switches_channels_off_and_on(client: Client, approver: User) -> None:
    from runs.models import NotificationPreference

    client.force_login(approver)
    page = client.get("/profile/").content.decode()
    assert 'name="email" value="on" checked' in page and 'name="browser" value="on" checked' in page
    assert 'data-notify-browser="on"' in page
    response = client.post("/profile/", {"browser": "on"})
    assert response.status_code == 303
    pref = NotificationPreference.objects.get(user=approver)
    assert (pref.email, pref.browser) == (False, True)
    client.post("/profile/", {"email": "on"})
    pref.refresh_from_db()
    assert (pref.email, pref.browser) == (True, False)
    assert 'data-notify-browser="off"' in client.get("/profile/").content.decode()
    assert client.put("/profile/").status_code == 405


def test_the_card_says_who_was_notified_and_when(client: Client, approver: User, settings) -> None:  # type: ignore[no-untyped-def]
    from ledger.notifications import notifications_send

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    approver.email = "alice@example.com"
    approver.save()
    bob = _user("bob", "approver")
    bob.email = "bob@example.com"
    bob.save()
    req = approval()
    client.force_login(approver)
    assert "data-notified" not in card_html(client.get("/").content.decode(), req.id)
    notifications_send()
    card = card_html(client.get("/").content.decode(), req.id)
    assert "Notified 2 people" in card
    # No group has a webhook: the e-mails' blank group is no "1 group webhook".
    assert "webhook" not in card


def test_the_profile_page_is_throttled_and_takes_hostile_input_calmly(
    client: Client, approver: User, settings
) -> None:  # type: ignore[no-untyped-def]
    from tests.security.test_no_server_errors import NASTY

    client.force_login(approver)
    for name, nasty in NASTY.items():
        if name == "lone-surrogate":
            continue  # a form post cannot carry one (it is not UTF-8); the JSON fuzz sends it
        response = client.post("/profile/", {"email": nasty, "browser": nasty, name: nasty})
        # Refused at the boundary (a NUL: 400) or taken as "on": never a server error.
        assert response.status_code in (303, 400), name
    settings.HOLDPOINT_THROTTLE_USER = "3/min"
    codes = [client.post("/profile/", {"email": "on"}).status_code for _ in range(3)]
    assert codes[-1] == 429
    assert client.get("/profile/", {"x": "\x00"}).status_code in (200, 400)


def test_the_timeline_says_each_approval_and_the_edit(client: Client, approver: User) -> None:
    bob = _user("bob", "approver")
    req = approval({"required": 2}, editable=EDITABLE)
    client.force_login(approver)
    answer(client, req, {"decision": "approve", "answer/ttl": "1800", "answer/note": "rotate"})
    client.force_login(bob)
    answer(client, req, {"decision": "approve", "answer/ttl": "1800", "answer/note": "rotate"})
    page = text(client.get(f"/runs/{req.run_id}/"))
    assert "Approved by alice: 1 of 2 approvals." in page
    assert 'With an edit: {"ttl": 1800, "note": "rotate"}' in page
    assert (
        'Approved with edits: {"ttl": 3600, "note": "rotate"} → {"ttl": 1800, "note": "rotate"}.'
        in page
    )
