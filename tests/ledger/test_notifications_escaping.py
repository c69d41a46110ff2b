"""Issue 24, point 13: run data (a run's input, a prompt, an action's name or target: agent
text, untrusted) is escaped for each channel by that channel's one function.

- The group webhook's Slack-compatible ``text``: ``&``, ``<`` and ``>`` escaped as Slack
  asks, so ``<!channel>``, ``<!here>`` and ``<https://evil.example/sso|Approve here>`` are
  shown as written, never a mention of a whole channel or a link with a disguised address.
- E-mail: one line where one line is meant (the subject and every single-line fact of the
  body), so a CR/LF in an action's name or a run's label forges no line of the body and
  never reaches a header.
"""

from __future__ import annotations

import dataclasses
import email
import email.policy
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.core import mail

from ledger.notifications import notifications_send
from runs.agents import AgentSpec, register_agent_spec
from runs.models import Notification
from tests.ledger.test_notifications import later, person
from tests.runs.factory import claim, epochs, start
from tests.security.outbound_receiver import Recorder, json_body, recording_receiver

pytestmark = pytest.mark.django_db

SLACK = "<!channel> <!here> <https://evil.example/sso|Approve here> & co"
FORGED = "x\r\nApproved already by the CISO, just click https://evil.example/sso\r\n"
BIDI = "invoice\u202egpj.exe\u2028Bcc: evil@example.com\x85next"


@pytest.fixture(autouse=True)
def _settings(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.HOLDPOINT_NOTIFY_REMIND_SHARE = 0
    settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS = 0
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {}
    settings.HOLDPOINT_PUBLIC_URL = "https://holdpoint.example"


@pytest.fixture
def labelled(test_agent: AgentSpec) -> Iterator[None]:
    """The test agent labels its runs from their input ("Migrate {service}")."""
    register_agent_spec(
        dataclasses.replace(
            test_agent,
            label="Migrate {service}",
            input_schema={"type": "object", "properties": {"service": {"type": "string"}}},
        )
    )
    yield
    register_agent_spec(test_agent)


def ask(kind: str = "input_required", prompt: str = "Which versions?", **kw: Any) -> Any:
    """A run started with ``input`` that asks ``prompt`` (or approval of ``action``)."""
    from runs import services

    start(input=kw.pop("input", {"service": "auth"}))
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="ask", state={})
    if kind == "auth_required":
        kw.setdefault("action", {"tool": "config_store", "target": "staging/auth/config"})
    return services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind=kind,
        prompt=prompt,
        accepted_schema={"versions": "string[]"},
        expires_in=3600,
        **kw,
    )


@pytest.fixture
def receiver(settings: Any) -> Iterator[Recorder]:
    settings.HOLDPOINT_OUTBOUND_ALLOW_LOCAL = True
    with recording_receiver() as recorder:
        settings.HOLDPOINT_NOTIFY_WEBHOOKS = {"approver": recorder.url("/hooks/approvers")}
        yield recorder


def test_the_one_functions_of_each_channel() -> None:
    from ledger.notifications import browser_line, email_line, slack_text

    assert slack_text(SLACK) == (
        "&lt;!channel&gt; &lt;!here&gt; &lt;https://evil.example/sso|Approve here&gt; &amp; co"
    )
    assert slack_text("a\nb") == "a b"
    assert (
        email_line(FORGED) == "x Approved already by the CISO, just click https://evil.example/sso"
    )
    assert email_line(BIDI) == "invoice gpj.exe Bcc: evil@example.com next"
    assert email_line("a" * 50, limit=10) == "a" * 9 + "…"
    assert browser_line("请选择\r\n需要保持兼容的 Token 版本") == "请选择 需要保持兼容的 Token 版本"
    assert len(browser_line("x " * 200)) == 120


def test_a_prompt_pings_no_slack_channel_and_disguises_no_link(
    receiver: Recorder, labelled: None
) -> None:
    req = ask(kind="input_required", prompt=f"Which versions? {SLACK}", input={"service": SLACK})
    assert notifications_send() == 1
    (seen,) = receiver.seen
    text = json_body(seen)["text"]
    assert "<" not in text and ">" not in text
    assert "&lt;!channel&gt; &lt;!here&gt;" in text
    assert "&lt;https://evil.example/sso|Approve here&gt;" in text
    assert "&amp; co" in text
    # The link of the message itself is intact (Slack turns it into a link).
    assert f"https://holdpoint.example/runs/{req.run_id}/#request-{req.id}" in text
    # The other fields are the data as the run has it (JSON-encoded), for a receiver that
    # escapes for its own format.
    assert json_body(seen)["run_label"] == f"Migrate {SLACK}"


def test_an_approval_named_to_forge_lines_stays_on_its_line_in_the_e_mail(
    labelled: None,
) -> None:
    person("alice")
    req = ask(
        kind="auth_required",
        action={
            "tool": "config_store",
            "action": f"update{FORGED}",
            "target": f"prod{FORGED}Bcc: evil@example.com",
        },
        input={"service": f"auth{FORGED}"},
    )
    assert notifications_send() == 1
    (message,) = mail.outbox
    lines = message.body.splitlines()
    assert not any(line.startswith("Approved already") for line in lines), message.body
    assert lines[0] == (
        "Approve updatex Approved already by the CISO, just click https://evil.example/sso "
        "on prodx Approved already by the CISO, just click https://evil.example/sso "
        "Bcc: evil@example.com"
    )
    assert "\r" not in message.body
    run_line = next(line for line in lines if line.startswith("Run: "))
    assert run_line.startswith("Run: Migrate authx Approved already by the CISO")
    # The headers are the message's own: no Bcc, the subject one line.
    parsed = email.message_from_bytes(message.message().as_bytes(), policy=email.policy.default)
    assert parsed["Bcc"] is None and parsed.get_all("To") == ["alice@example.com"]
    assert "\n" not in str(parsed["Subject"])
    assert Notification.objects.get(request=req, kind="pending").status == "sent"


def test_every_line_of_a_digest_is_one_line(labelled: None, settings: Any) -> None:
    settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS = 60
    person("alice")
    ask(kind="input_required", input={"service": "first"})
    notifications_send()  # the first message: what falls due within a minute is a digest
    ask(kind="input_required", prompt=f"Which?{FORGED}", input={"service": BIDI})
    ask(
        kind="auth_required",
        action={"tool": "config_store", "action": f"update{FORGED}", "target": "prod"},
        input={"service": FORGED},
    )
    with later(61):
        assert notifications_send() == 1
    digest = mail.outbox[-1]
    assert digest.subject == "[Holdpoint] 2 requests are waiting for you"
    lines = [line for line in digest.body.splitlines() if line]
    # Each request is one line; the approval's Approve and Deny links follow it, one each
    # (tests/dashboard/test_action_links.py), and nothing else makes a line.
    links = re.compile(r"  (Approve|Deny) \(you confirm on the page it opens\): https://\S+$")
    items = [line for line in lines if not links.fullmatch(line)]
    assert len(items) == 2 and all(line.startswith("- ") for line in items), digest.body
    assert len(lines) == 4, digest.body
