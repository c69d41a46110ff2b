"""Issue 28, at the seam with live pushes: a decision made in Slack or from an e-mail's link
reaches every open dashboard card at once, rendered for each person, like a decision
made on the dashboard. Through the real ASGI stack and channel layer; Slack is the local
stand-in (``runtime/slack_standin.py``), its signed payload sent to the real endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from ledger.notifications import notifications_send
from runs.action_links import ActionLink, sign_link
from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy, ApprovalVote
from runs.services.slack import SlackAccount, slack_link
from runtime.slack_standin import TEAM, Workspace
from tests.live.conftest import db, pushed, run, session_cookie, silent, socket
from tests.live.test_approval_cards import ACTION, card_in, frames_of, person, run_page
from tests.runs.factory import AGENT, interrupted
from tests.slack_support import slack_standin

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def slack_space(settings: Any) -> Iterator[Workspace]:
    with slack_standin(settings, {"approver": "C0APPROVERS"}) as space:
        yield space


@pytest.mark.parametrize("door", ["slack", "email"])
def test_a_decision_from_slack_or_an_email_link_is_pushed_to_every_open_card(
    slack_space: Workspace, door: str
) -> None:
    alice = person("alice", "approver")
    bob = person("bob", "approver")
    slack_link(user=alice, account=SlackAccount(TEAM, "U0ALICE"), how="profile")
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    target, _lease, _cp, req = interrupted(kind="auth_required", action=ACTION)
    notifications_send()
    cookie = session_cookie(bob)

    def decide() -> None:
        if door == "slack":
            [message] = slack_space.messages["C0APPROVERS"]
            slack_space.click("U0ALICE", "C0APPROVERS", message["ts"], "hp:approve")
            return
        path = "/act/" + sign_link(ActionLink(req.id, alice.pk, "approve", 0, "live-nonce"))
        browser = Client()
        browser.force_login(alice)
        page = browser.get(path).content.decode()
        key = page.split('name="idempotency_key" value="')[1].split('"')[0]
        browser.post(path, {"idempotency_key": key})

    async def scenario() -> list[str]:
        communicator = socket(await db(run_page)(target), cookie=cookie)
        assert (await communicator.connect())[0]
        await pushed(communicator)  # the snapshot
        await db(decide)()
        frames = await frames_of(communicator)
        assert await silent(communicator, 0.5)
        await communicator.disconnect()
        return frames

    frames = run(scenario)
    [vote] = ApprovalVote.objects.filter(request=req)
    assert vote.via == door and vote.user == alice
    card = card_in(frames, req.id)
    assert card, "no card pushed"
    assert "1 of 2 approvals" in card and "alice approved" in card
    # Bob may still give the second approval from the pushed card.
    assert 'value="approve"' in card
