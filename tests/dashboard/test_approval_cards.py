"""Issue 24, points 7-9 and 11: the approval card for each person.

- A card rendered for a live push's person after a decision (the TypeError of point 7).
- Each decision with its comment and the edit it made; a changed decision says so (8).
- Earlier decisions say Sent back; an edit shows one diff; the Approve button says what the
  click does (9).
- A card that cannot be rendered says so in words, not with a Python class (11).
"""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.pages.cards import build_card
from live.roles import Person, Role
from runs import services
from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy, InputRequest
from tests.conftest import _user
from tests.dashboard.support import answer, card_html
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
ACTION = {
    "tool": "config_store",
    "target": "staging/auth/config",
    "action": "update_auth_config",
    "change": {"ttl": {"from": 7200, "to": 3600}},
    "reversibility": "reversible",
}


def policy(**fields: Any) -> None:
    AgentApprovalPolicy.objects.update_or_create(
        agent=AGENT, defaults={"policy": parse_policy(fields)}
    )


def approval(started_by: User | None = None, **action: Any) -> InputRequest:
    _run, _lease, _cp, req = interrupted(
        kind="auth_required", action={**ACTION, **action}, started_by=started_by
    )
    return req


def decide(req: InputRequest, user: User, **value: Any) -> None:
    services.run_resume(
        run_id=req.run_id,
        request_id=req.id,
        checkpoint_id=req.checkpoint_id,
        value=value,
        user=user,
    )


def fresh(req: InputRequest) -> InputRequest:
    return InputRequest.objects.select_related("run", "answered_by").get(pk=req.id)


def words(markup: str) -> str:
    """What a person reads: the text without tags, entities decoded, spaces collapsed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", markup))).strip()


def approve_button(card: str) -> str:
    match = re.search(
        r'<button type="submit" name="decision" value="approve"[^>]*>(.*?)</button>', card, re.S
    )
    return match.group(0) if match else ""


# --- Point 7: a card pushed to one person ----------------------------------------------------


def test_a_card_rendered_for_a_live_person_after_a_decision_is_a_card(approver: User) -> None:
    """The inbox socket renders each card for a ``live.roles.Person`` (pk and permissions).
    After the first approval the rule looked the person's votes up with the Person itself:
    TypeError, and the card fell back to raw JSON for everyone."""
    bob = _user("bob", "approver")
    policy(required=2)
    req = approval()
    decide(req, approver, decision="approve", comment="checked")
    role = Role(frozenset(bob.get_all_permissions()))
    for who, person in (("bob", bob), ("alice", approver)):
        card = build_card(fresh(req), user=Person(person.pk, role), origin="inbox")
        assert card.broken == "", who
        assert card.team is not None and len(card.team.given) == 1
    bobs = build_card(fresh(req), user=Person(bob.pk, role), origin="inbox")
    assert bobs.can_answer and not bobs.approve_blocked and not bobs.approved_already
    alices = build_card(fresh(req), user=Person(approver.pk, role), origin="inbox")
    assert alices.approved_already and "You already approved this" in alices.approve_blocked


def test_the_person_who_approved_is_offered_no_second_approval(
    client: Client, approver: User
) -> None:
    _user("bob", "approver")
    policy(required=2)
    req = approval()
    client.force_login(approver)
    response = answer(client, req, {"decision": "approve", "comment": "ok"}, htmx=True)
    assert response.status_code == 200
    card = response.content.decode()
    assert approve_button(card) == ""
    assert "You already approved this at " in words(card)
    # Changing one's mind stays possible: deny and send back.
    assert 'value="deny"' in card and 'value="respond"' in card


# --- Point 8: each approval with its comment and edit -----------------------------------------


def test_the_second_approver_sees_why_the_first_one_edited(client: Client, approver: User) -> None:
    bob = _user("bob", "approver")
    policy(required=2)
    req = approval(editable=EDITABLE)
    decide(
        req,
        approver,
        decision="approve",
        comment="3600 is longer than the staging session",
        edited={"ttl": 1800, "note": "rotate"},
    )
    client.force_login(bob)
    card = card_html(client.get("/").content.decode(), req.id)
    text = words(card)
    assert "1 of 2 approvals" in text
    assert "alice approved with an edit" in text
    assert "“3600 is longer than the staging session”" in text
    assert "Edited by alice: ttl: 3600 → 1800." in text


def test_a_changed_decision_reads_as_a_change(client: Client, approver: User) -> None:
    bob = _user("bob", "approver")
    _user("carol", "approver")
    policy(required=2, any_deny_closes=False)
    req = approval()
    decide(req, bob, decision="approve", comment="fine by me")
    decide(req, bob, decision="deny", comment="the runbook says 7200")
    client.force_login(approver)
    text = words(card_html(client.get("/").content.decode(), req.id))
    assert re.search(
        r"bob approved \d\d:\d\d \w+, then objected \d\d:\d\d \w+ — “the runbook says 7200” "
        r"\(before: “fine by me”\)",
        text,
    ), text
    assert "0 of 2 approvals" in text


def test_the_decided_card_lists_each_approval_with_its_comment(
    client: Client, approver: User
) -> None:
    bob = _user("bob", "approver")
    policy(required=2)
    req = approval(editable=EDITABLE)
    decide(req, approver, decision="approve", comment="shorter", edited={"ttl": 1800, "note": ""})
    decide(req, bob, decision="approve", comment="agreed")
    client.force_login(approver)
    text = words(card_html(client.get(f"/runs/{req.run_id}/").content.decode(), req.id))
    assert "Approved with edits by alice and bob at " in text
    assert "“shorter”" in text and "“agreed”" in text
    assert "Edited by alice: ttl: 3600 → 1800; note: rotate → —." in text


# --- Point 9: sent back, one diff, a button that says what it does ----------------------------


def test_an_earlier_sent_back_decision_reads_sent_back(client: Client, approver: User) -> None:
    _run, _lease, _cp, first = interrupted(kind="auth_required", action=ACTION)
    decide(first, approver, decision="respond", comment="use 1800")
    # The run asks again about the same tool and target.
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="ask", state={})
    again = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="auth_required",
        prompt="Approve?",
        action=ACTION,
    )
    client.force_login(approver)
    card = card_html(client.get("/").content.decode(), again.id)
    earlier = words(card[card.index("data-earlier") :].split("</section>")[0])
    assert "Sent back by alice" in earlier and "use 1800" in earlier
    assert "Denied" not in earlier


def test_an_edit_on_the_table_shows_one_diff(client: Client, approver: User) -> None:
    bob = _user("bob", "approver")
    policy(required=2)
    req = approval(editable=EDITABLE)
    decide(req, approver, decision="approve", edited={"ttl": 1800, "note": "rotate"})
    client.force_login(bob)
    card = card_html(client.get("/").content.decode(), req.id)
    assert card.count('class="diff"') == 1
    # The one diff is the change as the edit makes it: what will happen now.
    diff = words(card[card.index("data-change-diff") :].split("</figure>")[0])
    assert "Planned change, as edited" in diff
    assert "- ttl: 7200" in diff and "+ ttl: 1800" in diff and "3600" not in diff


def test_an_edit_the_change_cannot_show_is_the_plan_against_the_edit(
    client: Client, approver: User
) -> None:
    bob = _user("bob", "approver")
    policy(required=2)
    # The planned change is a text: it cannot take the edit, so the diff is of the arguments.
    req = approval(editable=EDITABLE, change="rotate the signing key")
    decide(req, approver, decision="approve", edited={"ttl": 1800, "note": "rotate"})
    client.force_login(bob)
    card = card_html(client.get("/").content.decode(), req.id)
    assert card.count('class="diff"') == 1
    diff = words(card[card.index("data-change-diff") :].split("</figure>")[0])
    assert '"ttl": 3600' in diff and '"ttl": 1800' in diff
    assert "arguments (planned)" in diff and "arguments (edited)" in diff


def test_the_approve_button_says_what_the_click_does(client: Client, approver: User) -> None:
    bob = _user("bob", "approver")
    policy(required=2)
    req = approval()
    client.force_login(approver)
    first = approve_button(card_html(client.get("/").content.decode(), req.id))
    assert words(first) == "Approve update_auth_config (1 of 2)"
    assert "btn-primary" in first
    decide(req, approver, decision="approve")
    client.force_login(bob)
    second = approve_button(card_html(client.get("/").content.decode(), req.id))
    assert words(second) == "Approve and run update_auth_config"


def test_the_red_button_is_for_the_approval_that_runs_what_cannot_be_undone(
    client: Client, approver: User
) -> None:
    bob = _user("bob", "approver")
    policy(required=2)
    req = approval(tool="email", action="send_email", reversibility="irreversible")
    client.force_login(approver)
    first = approve_button(card_html(client.get("/").content.decode(), req.id))
    assert words(first) == "Approve send_email (1 of 2)" and "btn-danger" not in first
    decide(req, approver, decision="approve")
    client.force_login(bob)
    last = approve_button(card_html(client.get("/").content.decode(), req.id))
    assert words(last) == "Approve send_email — cannot be undone" and "btn-danger" in last


def test_one_approval_of_one_still_approves_and_runs(client: Client, approver: User) -> None:
    req = approval()
    client.force_login(approver)
    button = approve_button(card_html(client.get("/").content.decode(), req.id))
    assert words(button) == "Approve and run update_auth_config"


# --- Point 11: a card that cannot be rendered --------------------------------------------------


def test_a_card_that_cannot_be_rendered_names_no_python_class(
    client: Client, approver: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard.pages import cards

    req = approval()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("boom")

    monkeypatch.setattr(cards, "earlier_decisions", broken)
    client.force_login(approver)
    card = card_html(client.get("/").content.decode(), req.id)
    assert "could not be shown as a form" in card
    assert "TypeError" not in card and "(TypeError)" not in card
    # The raw request is still there, with a link to its run (UX rule 3).
    assert "Raw request" in card and f"/runs/{req.run_id}/" in card


# --- Point 8: the run's report ------------------------------------------------------------------


def test_the_report_shows_each_approval_with_its_comment_and_the_edit(
    client: Client, approver: User
) -> None:
    from ledger import services as ledger

    bob = _user("bob", "approver")
    policy(required=2)
    req = approval(editable=EDITABLE)
    decide(
        req,
        approver,
        decision="approve",
        comment="1800 matches staging",
        edited={"ttl": 1800, "note": "rotate"},
    )
    decide(req, bob, decision="approve", comment="agreed with alice")
    # The run goes on and writes the config under that approval.
    lease = claim()
    begun = ledger.side_effect_begin(
        **epochs(lease),
        step_id="write",
        tool="config_store",
        target="staging/auth/config",
        request={"document": "staging/auth/config", "content": {"ttl": 1800}},
    )
    ledger.side_effect_record_outcome(
        operation_id=begun.operation_id, status="confirmed", external_reference="v2"
    )
    client.force_login(approver)
    page = client.get(f"/side-effects/runs/{req.run_id}/").content.decode()
    found = re.search(r"<dd data-approval>(.*?)</dd>", page, re.S)
    assert found, "no approval on the report"
    approved = words(found.group(1))
    assert re.search(r"alice · \S+.* — “1800 matches staging” · made the edit", approved), approved
    assert re.search(r"bob · \S+.* — “agreed with alice”", approved), approved


def test_edits_that_came_back_to_the_plan_show_the_plan(client: Client, approver: User) -> None:
    bob = _user("bob", "approver")
    carol = _user("carol", "approver")
    policy(required=3)
    req = approval(editable=EDITABLE)
    decide(req, approver, decision="approve", edited={"ttl": 1800, "note": "rotate"})
    decide(req, bob, decision="approve", edited={"ttl": 3600, "note": "rotate"})
    client.force_login(carol)
    card = card_html(client.get("/").content.decode(), req.id)
    assert "data-edit-shown" not in card and card.count('class="diff"') == 1
    diff = words(card[card.index("data-change-diff") :].split("</figure>")[0])
    assert diff.startswith("> Planned change") or "Planned change" in diff
    assert "+ ttl: 3600" in diff and "1800" not in diff
