"""Issue 24, point 10: "Needs me" is what this person can act on now.

The tab, the nav badge, the tab count (and so the browser's title count and notification,
which read the badge) come from one query (``runs.selectors.inbox_for_user``): an approval
the person already approved in this round, one whose policy's groups they are not in, and
one of their own run under no self-approval are not theirs to act on. The row that opens
first is one they can act on.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy, InputRequest
from runs.selectors import inbox_for_user
from tests.conftest import _user
from tests.dashboard.support import card_html
from tests.runs.factory import AGENT, interrupted

pytestmark = pytest.mark.django_db

ACTION = {
    "tool": "config_store",
    "target": "staging/auth/config",
    "action": "update_auth_config",
    "change": {"ttl": {"from": 7200, "to": 3600}},
    "reversibility": "reversible",
    "editable": {
        "schema": {"type": "object", "properties": {"ttl": {"type": "integer"}}},
        "value": {"ttl": 3600},
    },
}


def policy(**fields: Any) -> None:
    AgentApprovalPolicy.objects.update_or_create(
        agent=AGENT, defaults={"policy": parse_policy(fields)}
    )


def approval(*, started_by: User | None = None, expires_in: float = 3600) -> InputRequest:
    _run, _lease, _cp, req = interrupted(
        kind="auth_required", action=ACTION, started_by=started_by, expires_in=expires_in
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


def listed(client: Client, tab: str = "needs") -> list[str]:
    page = client.get(f"/?tab={tab}").content.decode()
    return re.findall(r'<article class="card request-card[^"]*" id="request-(req_\w+)"', page)


def counts(client: Client) -> tuple[int, int]:
    """The nav badge and the Needs me tab's count, as the page shows them."""
    page = client.get("/?tab=all").content.decode()
    badge = re.search(r'id="inbox-count"[^>]*>(\d+)<', page)
    tab = re.search(r'id="inbox-tab-count"[^>]*>(\d+)<', page)
    assert badge and tab
    return int(badge.group(1)), int(tab.group(1))


@pytest.fixture
def people(approver: User) -> dict[str, User]:
    sam = _user("sam", "operator")
    sam.groups.add(Group.objects.get(name="approver"))
    managers, _ = Group.objects.get_or_create(name="release-managers")
    dave = _user("dave", "approver")
    dave.groups.add(managers)
    return {"alice": approver, "bob": _user("bob", "approver"), "sam": sam, "dave": dave}


def test_needs_me_counts_and_lists_only_what_each_person_can_act_on_now(
    client: Client, people: dict[str, User]
) -> None:
    alice, sam = people["alice"], people["sam"]
    policy(required=2)
    two = approval()
    policy(groups=["release-managers"])
    managers_only = approval()
    policy(self_approval=False)
    sams_own = approval(started_by=sam)
    decide(two, alice, decision="approve")

    expected = {
        # Alice approved ``two`` already; she is no release manager.
        "alice": {sams_own.id},
        "bob": {two.id, sams_own.id},
        # Sam started ``sams_own``, whose policy needs someone else.
        "sam": {two.id},
        "dave": {two.id, managers_only.id, sams_own.id},
    }
    for name, user in people.items():
        client.force_login(user)
        assert set(listed(client)) == expected[name], name
        assert counts(client) == (len(expected[name]),) * 2, name
        assert {r.id for r in inbox_for_user(user=user)} == expected[name], name
        # The API's mine=true is the same query.
        api = client.get("/api/input-requests?status=pending&mine=true").json()["results"]
        assert {r["request_id"] for r in api} == expected[name], name
        # All pending still shows every one, with the card saying why (not hidden).
        assert set(listed(client, "all")) == {two.id, managers_only.id, sams_own.id}, name


def test_an_edit_puts_the_approval_back_in_needs_me_for_who_approved_before(
    client: Client, people: dict[str, User]
) -> None:
    alice, bob = people["alice"], people["bob"]
    policy(required=2)
    req = approval()
    decide(req, alice, decision="approve")
    client.force_login(alice)
    assert listed(client) == []
    # Bob approves an edit: a new round, and Alice's approval no longer counts.
    decide(req, bob, decision="approve", edited={"ttl": 1800})
    assert listed(client) == [req.id]
    client.force_login(bob)
    assert listed(client) == []


def test_the_row_that_opens_first_is_one_the_person_can_act_on(
    client: Client, people: dict[str, User]
) -> None:
    alice = people["alice"]
    policy(required=2, self_approval=False)
    first = approval(expires_in=300)  # the most urgent: Alice approved it (1 of 2)
    own = approval(started_by=alice, expires_in=900)  # hers: she may not approve it
    theirs = approval(expires_in=1200)
    decide(first, alice, decision="approve")
    assert InputRequest.objects.get(pk=first.id).status == "pending"
    client.force_login(alice)
    assert listed(client) == [theirs.id]
    page = client.get("/?tab=all").content.decode()
    assert listed(client, "all") == [first.id, own.id, theirs.id]
    opened = re.findall(
        r'id="request-(req_\w+)".{0,900}?<details class="row-details" data-row open', page, re.S
    )
    assert opened == [theirs.id]
    for req in (first, own):
        assert "data-row open" not in card_html(page, req.id)


def test_needs_me_is_one_statement_for_the_list_and_one_for_the_count(
    client: Client, people: dict[str, User]
) -> None:
    """However many approvals wait, and whoever decided them, the selection is one
    statement for the list and one for the count (the badge and the tab count share it):
    never a statement per request."""
    alice, bob = people["alice"], people["bob"]
    policy(required=2)
    client.force_login(alice)

    def selections() -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/").status_code == 200
        # The "Needs me" selection is the one statement that asks for this person's
        # standing decisions (NOT EXISTS over the votes).
        return [
            q["sql"]
            for q in queries.captured_queries
            if "runs_approvalvote" in q["sql"] and "NOT EXISTS" in q["sql"].upper()
        ]

    for n in (3, 6):
        while InputRequest.objects.filter(status="pending").count() < n:
            req = approval()
            decide(req, bob, decision="approve")
        found = selections()
        assert len(found) == 2, (n, found)
        assert sum("COUNT(" in sql.upper() for sql in found) == 1
        assert len(listed(client)) == n


def test_a_superuser_outside_the_policys_groups_is_told_so_and_not_counted(
    client: Client, people: dict[str, User]
) -> None:
    """Policy groups bind superusers too (runs.approvals): Needs me, the card and its
    "who may approve" agree."""
    root = User.objects.create_superuser("root", password="pw-root")
    policy(groups=["release-managers"])
    req = approval()
    client.force_login(root)
    assert listed(client) == [] and counts(client) == (0, 0)
    card = card_html(client.get("/?tab=all").content.decode(), req.id)
    assert "Only members of release-managers may decide this approval." in card
    assert "Who may approve: dave." in card
    assert 'name="decision" value="approve" class="btn btn-primary" disabled' in card
