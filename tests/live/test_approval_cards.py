"""Issue 24, point 7: the approval card, pushed live, is rendered for each person.

Two approvers and the person who started the run watch the same approval (a policy of two
approvers, no self-approval) on the inbox and on the run page. When the first approver
approves, every open card updates to "1 of 2", says who approved and why, and still lets
each person do exactly what they may: the second approver approve, the starter only deny
or send back (saying why), the first approver nothing more. Each badge counts what that
person can act on now. Through the real ASGI stack and channel layer.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from runs import services
from runs.approvals import parse_policy
from runs.groups import ensure_default_groups
from runs.models import AgentApprovalPolicy, Run
from tests.live.conftest import db, pushed, run, session_cookie, silent, socket
from tests.live.test_consumers import inbox_url
from tests.runs.factory import AGENT, interrupted

pytestmark = pytest.mark.django_db(transaction=True)

ACTION = {
    "tool": "config_store",
    "action": "update_auth_config",
    "target": "staging/auth/config",
    "change": {"ttl": {"from": 7200, "to": 3600}},
    "reversibility": "reversible",
}


def person(username: str, *groups: str) -> User:
    ensure_default_groups()
    user = User.objects.create_user(username=username, password="pw")
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return user


def card_in(frames: list[str], request_id: str) -> str:
    """The pushed card of ``request_id`` (the last one sent), or ""."""
    found = ""
    for frame in frames:
        start = frame.find(f'id="request-{request_id}"')
        if start >= 0:
            found = frame[start : frame.find("</article>", start)]
    return found


def approve_button(card: str) -> str:
    match = re.search(r'<button type="submit" name="decision" value="approve"[^>]*>', card)
    return match.group(0) if match else ""


def badge_in(frames: list[str]) -> int | None:
    for frame in frames:
        match = re.search(r'id="inbox-count"[^>]*>(\d+)<', frame)
        if match:
            return int(match.group(1))
    return None


async def frames_of(communicator: Any, *, within: float = 5.0) -> list[str]:
    """The frames of one push, or [] when none came ``within`` seconds (asserted on after)."""
    if await communicator.receive_nothing(timeout=within):
        return []
    return await pushed(communicator)


def run_page(target: Run) -> str:
    target.refresh_from_db()
    return f"/ws/runs/{target.id}/?v={target.last_event_seq}"


def test_a_decision_updates_every_open_card_for_each_person() -> None:
    alice = person("alice", "approver")
    bob = person("bob", "approver")
    sam = person("sam", "operator", "approver")
    AgentApprovalPolicy.objects.create(
        agent=AGENT, policy=parse_policy({"required": 2, "self_approval": False})
    )
    target, _lease, _cp, req = interrupted(kind="auth_required", action=ACTION, started_by=sam)
    cookies = {user.username: session_cookie(user) for user in (alice, bob, sam)}

    async def scenario() -> dict[str, list[str]]:
        sockets = {
            "bob inbox": socket(await db(inbox_url)(bob), cookie=cookies["bob"]),
            "bob run": socket(await db(run_page)(target), cookie=cookies["bob"]),
            "sam inbox": socket(await db(inbox_url)(sam, "all"), cookie=cookies["sam"]),
            "sam run": socket(await db(run_page)(target), cookie=cookies["sam"]),
            "alice badge": socket("/ws/live/?v=new", cookie=cookies["alice"]),
        }
        for communicator in sockets.values():
            assert (await communicator.connect())[0]
            await pushed(communicator)  # the snapshot
        await db(
            lambda: services.run_resume(
                run_id=target.id,
                request_id=req.id,
                checkpoint_id=req.checkpoint_id,
                value={"decision": "approve", "comment": "TTL checked against the runbook"},
                user=alice,
            )
        )()
        frames = {name: await frames_of(communicator) for name, communicator in sockets.items()}
        # Nothing more follows (each part once).
        for communicator in sockets.values():
            assert await silent(communicator, 0.5)
            await communicator.disconnect()
        return frames

    frames = run(scenario)

    for name in ("bob inbox", "bob run", "sam inbox", "sam run"):
        card = card_in(frames[name], req.id)
        assert card, f"{name}: no card pushed"
        assert "could not be shown" not in card, name
        assert "1 of 2 approvals" in card, name
        # Who approved, and why, on every card.
        assert "alice approved" in card and "TTL checked against the runbook" in card, name
    # Bob may give the second approval, and the button says it runs the action.
    for name in ("bob inbox", "bob run"):
        button = approve_button(card_in(frames[name], req.id))
        assert button and "disabled" not in button, name
        assert "Approve and run" in card_in(frames[name], req.id), name
    # Sam started the run: he is told why, and his Approve stays disabled.
    for name in ("sam inbox", "sam run"):
        card = card_in(frames[name], req.id)
        assert "disabled" in approve_button(card), name
        assert "You started this run or answered its last question" in card, name
    # Alice's badge no longer counts what she approved; Bob's still counts it (unchanged:
    # not sent again).
    assert badge_in(frames["alice badge"]) == 0
    assert badge_in(frames["bob inbox"]) is None


def test_the_badge_counts_per_person_and_once_per_role_when_nobody_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two approvers' badges: alike (counted once for their role) until one approves a
    request that needs two; then each counts what they can act on."""
    from live import consumers

    alice = person("alice", "approver")
    bob = person("bob", "approver")
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    cookies = {user.username: session_cookie(user) for user in (alice, bob)}
    counted: list[Any] = []
    real = consumers.inbox_for_user

    def counting(*, user: Any, **kwargs: Any) -> Any:
        counted.append(user)
        return real(user=user, **kwargs)

    monkeypatch.setattr(consumers, "inbox_for_user", counting)

    async def scenario() -> dict[str, list[list[str]]]:
        sockets = {
            name: socket("/ws/live/?v=new", cookie=cookies[name]) for name in ("alice", "bob")
        }
        for communicator in sockets.values():
            assert (await communicator.connect())[0]
            await pushed(communicator)
        counted.clear()
        _target, _lease, _cp, req = await db(
            lambda: interrupted(kind="auth_required", action=ACTION)
        )()
        asked = {name: await pushed(c) for name, c in sockets.items()}
        per_role = list(counted)
        counted.clear()
        await db(
            lambda: services.run_resume(
                run_id=req.run_id,
                request_id=req.id,
                checkpoint_id=req.checkpoint_id,
                value={"decision": "approve"},
                user=alice,
            )
        )()
        approved = {"alice": await frames_of(sockets["alice"])}
        assert await silent(sockets["bob"], 0.6)  # Bob's count did not change
        per_person = list(counted)
        for communicator in sockets.values():
            await communicator.disconnect()
        return {
            "asked": [asked["alice"], asked["bob"], per_role],
            "approved": [approved["alice"], per_person],
        }

    got = run(scenario)
    asked_alice, asked_bob, per_role = got["asked"]
    assert badge_in(asked_alice) == 1 and badge_in(asked_bob) == 1
    # Nothing judged per person yet: one check and one count for the role.
    assert len(per_role) == 2 and all(user.pk is None for user in per_role)
    approved_alice, per_person = got["approved"]
    assert badge_in(approved_alice) == 0
    # Now the role's list holds an approval with a decision: each person is counted.
    assert sorted(user.pk for user in per_person if user.pk is not None) == sorted(
        [alice.pk, bob.pk]
    )
