"""Approve and Deny from the e-mail (issue 28): signed links, bound to the recipient and
the request's version, single-use, expiring with the request; opening one never decides
(a mail scanner fetches every link), the confirm page's POST does, through the same
service as the dashboard, and says how it was decided ("via": "email")."""

from __future__ import annotations

import datetime as dt
import random
import re
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ledger.notifications import ACT_PATH, notifications_send
from runs import services
from runs.action_links import ActionLink, read_link, sign_link
from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy, ApprovalVote, InputRequest, RunEvent
from tests.dashboard.support import answer, hidden
from tests.ledger.test_notifications import person
from tests.runs.factory import AGENT, interrupted, snapshot

pytestmark = pytest.mark.django_db

LINK = re.compile(r"(Approve|Deny) \(you confirm on the page it opens\): (\S+)")


@pytest.fixture(autouse=True)
def _mail(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {}
    settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS = 60
    settings.HOLDPOINT_PUBLIC_URL = "https://holdpoint.example"


def approval(policy: dict[str, Any] | None = None, **kw: Any) -> InputRequest:
    if policy is not None:
        AgentApprovalPolicy.objects.update_or_create(
            agent=AGENT, defaults={"policy": parse_policy(policy)}
        )
    return interrupted(kind="auth_required", **kw)[3]


def links_for(user: User) -> dict[str, str]:
    """The paths of the Approve and Deny links in ``user``'s newest e-mail."""
    body = [m for m in mail.outbox if m.to == [user.email]][-1].body
    found = {label.lower(): url for label, url in LINK.findall(body)}
    assert all(url.startswith("https://holdpoint.example" + ACT_PATH) for url in found.values())
    return {k: v.removeprefix("https://holdpoint.example") for k, v in found.items()}


def confirm(client: Client, path: str, comment: str = "") -> Any:
    """Open the confirm page and press its button, as a person does."""
    page = client.get(path)
    assert page.status_code == 200, page.content.decode()
    html = page.content.decode()
    return client.post(
        path,
        {"idempotency_key": hidden(html, "idempotency_key"), "comment": comment},
    )


def votes(req: InputRequest) -> list[ApprovalVote]:
    return list(ApprovalVote.objects.filter(request=req))


def test_the_e_mail_carries_approve_and_deny_links_only_for_an_approval_one_may_decide() -> None:
    alice = person("alice")
    req = approval()
    question = interrupted(kind="input_required")[3]
    notifications_send()
    [digest] = mail.outbox  # both in one message: the approval's two links, none for the question
    assert question.id in digest.body and len(LINK.findall(digest.body)) == 2
    found = links_for(alice)
    assert set(found) == {"approve", "deny"}
    assert reverse("act", args=["x"]).startswith(ACT_PATH)
    a, d = (read_link(p.removeprefix(ACT_PATH)) for p in (found["approve"], found["deny"]))
    assert a is not None and d is not None
    assert (a.request_id, a.user_id, a.decision, a.edit_round) == (req.id, alice.pk, "approve", 0)
    assert d.decision == "deny" and d.nonce == a.nonce  # one message's links decide once


def test_who_may_only_look_gets_no_links_and_the_not_applied_message_none() -> None:
    """An escalation to a group that may only look says so, with no decision links."""
    alice = person("alice")
    vera = person("vera", "viewer")
    from django.contrib.auth.models import Group

    Group.objects.get_or_create(name="on-call")[0].user_set.add(vera)
    approval({"escalation": {"after_minutes": 1, "group": "on-call"}})
    notifications_send()
    with time_machine.travel(timezone.now() + dt.timedelta(minutes=3), tick=False):
        notifications_send()
    [to_vera] = [m for m in mail.outbox if m.to == [vera.email]]
    assert "can look at this request but not decide it" in to_vera.body
    assert ACT_PATH not in to_vera.body
    assert len(LINK.findall(links_body(alice))) == 2


def links_body(user: User) -> str:
    return [m for m in mail.outbox if m.to == [user.email]][-1].body


def test_opening_the_link_decides_nothing_signed_in_or_not(client: Client) -> None:
    alice = person("alice")
    req = approval()
    notifications_send()
    path = links_for(alice)["approve"]
    before = snapshot(req.run_id)
    # A mail scanner (no session) is sent to the sign-in page, which comes back here.
    scanner = client.get(path)
    assert scanner.status_code == 302
    assert scanner["Location"].startswith("/login/?next=" + "/act/")
    client.force_login(alice)
    page = client.get(path)
    html = page.content.decode()
    assert page.status_code == 200
    assert "Nothing has been decided" in html and "data-act-form" in html
    assert f'id="request-{req.id}"' in html  # the card: what will happen, where
    assert 'class="answer-form"' not in html  # only the link's one form
    client.head(path)
    assert snapshot(req.run_id) == before and votes(req) == []


def test_the_confirm_post_decides_once_through_the_service_and_says_how(client: Client) -> None:
    alice = person("alice")
    req = approval()
    notifications_send()
    found = links_for(alice)
    client.force_login(alice)
    response = confirm(client, found["approve"], comment="ok from my phone")
    assert response.status_code == 303
    req.refresh_from_db()
    assert req.status == "answered" and req.answer["decision"] == "approve"
    [vote] = votes(req)
    assert (vote.via, vote.user_id, vote.comment) == ("email", alice.pk, "ok from my phone")
    assert vote.link == read_link(found["approve"].removeprefix(ACT_PATH)).nonce  # type: ignore[union-attr]
    answered = RunEvent.objects.get(run_id=req.run_id, type="request.answered")
    assert answered.payload["via"] == "email" and answered.actor == "user:alice"
    after = client.get(found["approve"]).content.decode()
    assert "Already approved by alice" in after and "data-act-form" not in after


def test_a_used_link_and_its_sibling_decide_nothing_more(client: Client) -> None:
    alice = person("alice")
    req = approval({"required": 2})
    person("bob")
    notifications_send()
    found = links_for(alice)
    client.force_login(alice)
    confirm(client, found["approve"])
    req.refresh_from_db()
    assert req.status == "pending" and len(votes(req)) == 1
    # The same link again, and the Deny link of the same e-mail: used, nothing recorded.
    for path in (found["approve"], found["deny"]):
        page = client.get(path).content.decode()
        assert "This e-mail&#x27;s links were used at" in page and "alice approved it" in page
        assert "data-act-form" not in page
    key = f"test-{req.id}-again"
    response = client.post(found["deny"], {"idempotency_key": key, "comment": "no"}, follow=True)
    assert "links were used" in response.content.decode()
    assert len(votes(req)) == 1 and votes(req)[0].decision == "approve"


def test_a_double_click_replays_the_first_outcome(client: Client) -> None:
    alice = person("alice")
    req = approval({"required": 2})
    notifications_send()
    path = links_for(alice)["approve"]
    client.force_login(alice)
    html = client.get(path).content.decode()
    key = hidden(html, "idempotency_key")
    first = client.post(path, {"idempotency_key": key}, follow=True)
    second = client.post(path, {"idempotency_key": key}, follow=True)
    assert "It waits for more approvals" in first.content.decode()
    assert "It waits for more approvals" in second.content.decode()
    assert len(votes(req)) == 1


def test_another_persons_link_shows_nothing_and_decides_nothing(client: Client) -> None:
    alice, bob = person("alice"), person("bob")
    req = approval()
    notifications_send()
    path = links_for(alice)["approve"]
    client.force_login(bob)
    page = client.get(path)
    assert page.status_code == 403
    html = page.content.decode()
    assert "sent to someone else" in html and "signed in as bob" in html
    assert req.id not in html and "data-act-form" not in html
    refused = client.post(path, {"idempotency_key": "k-bob", "comment": ""})
    assert refused.status_code == 403 and votes(req) == []


@pytest.mark.parametrize("mangle", ["truncate", "flip", "forge", "huge", "other_salt"])
def test_a_token_that_is_not_ours_is_a_clear_404(client: Client, mangle: str) -> None:
    alice = person("alice")
    req = approval()
    notifications_send()
    token = links_for(alice)["approve"].removeprefix(ACT_PATH)
    bad = {
        "truncate": token[:-6],
        "flip": token[:-1] + ("A" if token[-1] != "A" else "B"),
        "forge": sign_link(ActionLink(req.id, alice.pk, "approve", 0, "n")).replace(":", ".", 1),
        "huge": token * 5,
        "other_salt": __import__("django.core.signing").core.signing.dumps(
            {"r": req.id, "u": alice.pk, "d": "approve", "v": 0, "n": "x"}
        ),
    }[mangle]
    client.force_login(alice)
    for method in (client.get, client.post):
        response = method(ACT_PATH + bad)
        assert response.status_code == 404
        assert "This link is not valid" in response.content.decode()
    assert votes(req) == []


def test_an_edit_since_the_e_mail_makes_its_links_refuse(client: Client) -> None:
    alice, carol = person("alice"), person("carol")
    editable = {
        "schema": {"type": "object", "properties": {"ttl": {"type": "integer"}}},
        "value": {"ttl": 3600},
    }
    req = approval({"required": 2}, action={"tool": "config_store", "editable": editable})
    notifications_send()
    path = links_for(alice)["approve"]
    # carol approves with an edit: a new round, the arguments alice was told of are gone.
    client.force_login(carol)
    answer(client, req, {"decision": "approve", "answer/ttl": "60"})
    req.refresh_from_db()
    assert req.edit_round == 1
    client.force_login(alice)
    page = client.get(path).content.decode()
    assert "edited after the e-mail was sent" in page and "data-act-form" not in page
    response = client.post(path, {"idempotency_key": "k-alice"}, follow=True)
    assert "edited after the e-mail was sent" in response.content.decode()
    assert [v.user_id for v in votes(req)] == [carol.pk]


def test_the_service_refuses_an_outdated_or_used_link_under_the_lock() -> None:
    """The page checks first; the service checks again under the run's lock, where an
    edit or the other link may have won since the page was shown."""
    from runs.errors import HoldpointError

    alice = person("alice")
    req = approval({"required": 2})
    person("bob")
    link = ActionLink(req.id, alice.pk, "approve", 0, "nonce-1")

    def resume(value: Any, the_link: ActionLink) -> Any:
        return services.run_resume(
            run_id=req.run_id,
            request_id=req.id,
            checkpoint_id=req.checkpoint_id,
            value=value,
            user=alice,
            via="email",
            link=the_link,
        )

    for value, code in [
        ({"decision": "deny", "comment": "x"}, "invalid_input"),  # not what the link says
        ({"decision": "approve", "edited": {"ttl": 1}}, "invalid_input"),  # never an edit
    ]:
        with pytest.raises(HoldpointError) as refused:
            resume(value, link)
        assert refused.value.code == code
    with pytest.raises(HoldpointError) as outdated:
        resume({"decision": "approve"}, ActionLink(req.id, alice.pk, "approve", 1, "nonce-1"))
    assert outdated.value.extra["reason"] == "edited"
    bob = User.objects.get(username="bob")
    with pytest.raises(HoldpointError) as stranger:
        services.run_resume(
            run_id=req.run_id,
            request_id=req.id,
            checkpoint_id=req.checkpoint_id,
            value={"decision": "approve"},
            user=bob,
            link=link,
        )
    assert stranger.value.extra["reason"] == "not_the_recipient"
    assert votes(req) == []
    resume({"decision": "approve"}, link)
    with pytest.raises(HoldpointError) as used:
        resume({"decision": "approve"}, link)
    assert used.value.extra["reason"] == "link_used"
    assert len(votes(req)) == 1


def test_a_request_decided_elsewhere_or_expired_says_who_and_when(client: Client) -> None:
    alice, bob = person("alice"), person("bob")
    req = approval()
    notifications_send()
    path = links_for(alice)["approve"]
    client.force_login(bob)
    answer(client, req, {"decision": "approve"})
    client.force_login(alice)
    page = client.get(path).content.decode()
    assert "Already approved by bob" in page and "data-act-form" not in page

    late = approval(expires_in=600)
    mail.outbox.clear()
    with time_machine.travel(timezone.now() + dt.timedelta(minutes=2), tick=False):
        notifications_send()
    path = links_for(alice)["deny"]
    with time_machine.travel(timezone.now() + dt.timedelta(minutes=11), tick=False):
        page = client.get(path).content.decode()
        assert "expired" in page and "data-act-form" not in page
        client.post(path, {"idempotency_key": "k-late", "comment": "too late"})
    assert votes(late) == []


def test_deny_needs_a_reason_like_the_card(client: Client) -> None:
    alice = person("alice")
    req = approval()
    notifications_send()
    path = links_for(alice)["deny"]
    client.force_login(alice)
    html = client.get(path).content.decode()
    key = hidden(html, "idempotency_key")
    refused = client.post(path, {"idempotency_key": key, "comment": ""})
    assert refused.status_code == 422
    assert "Say why you deny it" in refused.content.decode() and votes(req) == []
    client.post(path, {"idempotency_key": key + "2", "comment": "wrong target"})
    req.refresh_from_db()
    assert req.status == "answered" and req.answer["decision"] == "deny"
    assert votes(req)[0].via == "email"


def test_a_person_the_policy_does_not_let_decide_is_told_why(client: Client) -> None:
    """The link is no way around the policy: the starter of a run may not approve it."""
    alice = person("alice")
    AgentApprovalPolicy.objects.update_or_create(
        agent=AGENT, defaults={"policy": parse_policy({"self_approval": False})}
    )
    req = interrupted(kind="auth_required", started_by=alice)[3]
    token = sign_link(ActionLink(req.id, alice.pk, "approve", 0, "n-self"))
    client.force_login(alice)
    page = client.get(ACT_PATH + token).content.decode()
    assert "data-act-blocked" in page and "data-act-form" not in page
    client.post(ACT_PATH + token, {"idempotency_key": "k-self"})
    assert votes(req) == []


def test_the_confirm_page_is_throttled_per_person(client: Client, settings: Any) -> None:
    settings.HOLDPOINT_THROTTLE_USER = "3/min"
    alice = person("alice")
    approval()
    notifications_send()
    path = links_for(alice)["approve"]
    client.force_login(alice)
    codes = [client.get(path).status_code for _ in range(5)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]


def test_random_tokens_never_break_the_page(client: Client) -> None:
    alice = person("alice")
    req = approval()
    client.force_login(alice)
    rng = random.Random(28)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:.%"
    for _ in range(60):
        token = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 600)))
        response = client.post(ACT_PATH + token, {"idempotency_key": "k", "comment": "x" * 3000})
        assert response.status_code == 404, (token, response.status_code)
    assert votes(req) == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_link_and_a_dashboard_click_at_once_decide_once_on_postgres() -> None:
    """Alice's e-mail link and Bob's card, pressed together, ROUNDS times: the run's lock
    orders them; one decides the approval, the other is told who did, and nothing is
    recorded twice. Alice's Approve and Deny links pressed together: one vote."""
    from tests.runs.test_races import ROUNDS, race

    alice, bob = person("alice"), person("bob")

    def links(req: InputRequest, nonce: str) -> dict[str, str]:
        """What the e-mail would carry (one message a minute: the rounds do not wait)."""
        return {
            d: ACT_PATH + sign_link(ActionLink(req.id, alice.pk, d, req.edit_round, nonce))
            for d in ("approve", "deny")
        }

    for i in range(ROUNDS // 5):
        req = approval()
        found = links(req, f"n-{i}")
        a, b = Client(), Client()
        a.force_login(alice)
        b.force_login(bob)
        page = a.get(found["approve"]).content.decode()
        key = hidden(page, "idempotency_key")
        results = race(
            lambda: a.post(found["approve"], {"idempotency_key": key}, follow=True),
            lambda: answer(b, req, {"decision": "approve"}, key=f"bob-{i}"),
        )
        assert [getattr(r, "status_code", r) for r in results] == [200, 303], results
        req.refresh_from_db()
        assert req.status == "answered"
        assert len(votes(req)) == 1, votes(req)
        assert RunEvent.objects.filter(run_id=req.run_id, type="request.answered").count() == 1
        winner = votes(req)[0]
        if winner.user_id == bob.pk:
            assert "Already approved by bob" in results[0].content.decode()
        services.run_cancel(run_id=req.run_id, reason="next round")

    AgentApprovalPolicy.objects.update_or_create(
        agent=AGENT, defaults={"policy": parse_policy({"required": 2})}
    )
    for i in range(ROUNDS // 5):
        req = approval()
        found = links(req, f"m-{i}")
        a, c = Client(), Client()
        a.force_login(alice)
        c.force_login(alice)
        race(
            lambda: a.post(found["approve"], {"idempotency_key": f"a-{i}"}),
            lambda: c.post(found["deny"], {"idempotency_key": f"d-{i}", "comment": "no"}),
        )
        assert len(votes(req)) == 1, votes(req)
        services.run_cancel(run_id=req.run_id, reason="next round")


def test_the_runs_starter_may_still_deny_from_the_e_mail(client: Client) -> None:
    """Self-approval keeps the starter from approving, not from stopping their own run."""
    alice = person("alice")
    AgentApprovalPolicy.objects.update_or_create(
        agent=AGENT, defaults={"policy": parse_policy({"self_approval": False})}
    )
    req = interrupted(kind="auth_required", started_by=alice)[3]
    token = sign_link(ActionLink(req.id, alice.pk, "deny", 0, "n-deny"))
    client.force_login(alice)
    page = client.get(ACT_PATH + token).content.decode()
    assert "data-act-form" in page and "data-act-blocked" not in page
    html = page
    client.post(
        ACT_PATH + token, {"idempotency_key": hidden(html, "idempotency_key"), "comment": "stop"}
    )
    req.refresh_from_db()
    assert req.status == "answered" and req.answer["decision"] == "deny"
