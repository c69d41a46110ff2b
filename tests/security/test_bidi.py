"""Issue 13, finding 11: a right-to-left override in agent text cannot reorder what a person
reads around it. Every page that shows agent text shows it inside a bidi isolate (``<bdi>``);
the browser half is tests/browser/test_bidi.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs import services
from runs.models import InputRequest, Run
from tests.ledger.helpers import begin
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db

RLO = "\u202e"
# Shown as "Update koob/moc.elpmaxe via update_hook" when isolated; without isolation the
# override also reverses " via update_hook" and the reader sees another target.
TARGET = RLO + "example.com/hook"
STEP = "notify" + RLO + ".email"
PROMPT = "Approve " + RLO + "gifnoc/htua/dorp now?"


def approval(target: str = TARGET, step: str = STEP) -> tuple[Run, InputRequest]:
    run = start()
    lease = claim()
    begin(
        lease,
        step=step,
        target=target,
        reversibility="compensable",
        compensating_action={"url": "http://127.0.0.1:9/undo"},
    )
    cp = services.checkpoint_save(**epochs(lease), step=step, state={"seen": 1})
    request = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="auth_required",
        prompt=PROMPT,
        accepted_schema={"decision": "string"},
        expires_in=3600,
        action={
            "tool": "webhook",
            "action": "update_hook",
            "target": target,
            "reversibility": "irreversible",
            "arguments": {"to" + RLO: "all" + RLO + "@corp.example"},
        },
    )
    run.refresh_from_db()
    return run, request


FSI, PDI = "\u2068", "\u2069"


def not_isolated(html: str, text: str) -> list[str]:
    """The places where ``text`` appears outside a ``<bdi>``, or (where no element can be:
    attributes, SVG text and titles, the run's timeline) outside the text form of one,
    U+2068 FIRST STRONG ISOLATE … U+2069 POP DIRECTIONAL ISOLATE."""
    found = []
    for match in re.finditer(re.escape(text), html):
        before = html[: match.start()]
        opened, closed = before.count("<bdi>"), before.count("</bdi>")
        in_isolate = before.count(FSI) > before.count(PDI)
        if opened <= closed and not in_isolate:
            found.append(html[max(0, match.start() - 80) : match.end() + 20])
    return found


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


def test_it_isolates_agent_text_on_every_page(approver: User) -> None:
    run, _request = approval()
    client = Client()
    client.force_login(approver)
    pages = {
        "inbox": page(client, "/"),
        "run": page(client, f"/runs/{run.id}/"),
        "side effects": page(client, "/side-effects/"),
        "report": page(client, f"/side-effects/runs/{run.id}/"),
    }
    shown = 0
    for name, html in pages.items():
        for text in (TARGET, STEP, "gifnoc/htua/dorp", "to" + RLO, "all" + RLO):
            shown += html.count(text)
            assert not_isolated(html, text) == [], (name, text)
    assert shown >= 8
    # The run's timeline names the step in its marks' accessible names and titles (SVG:
    # no <bdi> there), isolated as text.
    assert f"{FSI}{STEP}{PDI}" in pages["run"]
    # The approval's title isolates the target, not the words the dashboard adds.
    title = re.search(r'<h2 class="request-title"[^>]*>(.*?)</h2>', pages["inbox"], re.S)
    assert title is not None
    assert title.group(1) == (f"<bdi>Update</bdi> <bdi>{TARGET}</bdi> via <bdi>update_hook</bdi>")


def test_it_isolates_a_prompt_and_its_form(approver: User) -> None:
    start()
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="ask", state={})
    services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="input_required",
        prompt=PROMPT,
        accepted_schema={
            "type": "object",
            "properties": {
                "env": {
                    "type": "string",
                    "title": "Env" + RLO + "x",
                    "description": "help" + RLO,
                    "enum": ["a" + RLO, "b"],
                }
            },
        },
        expires_in=3600,
    )
    client = Client()
    client.force_login(approver)
    html = page(client, "/")
    for text in ("gifnoc/htua/dorp", "Env" + RLO, "help" + RLO):
        assert html.count(text) >= 1, text
        assert not_isolated(html, text) == [], text


def test_the_stylesheet_isolates_bdi_and_code(settings: Any) -> None:
    css = (settings.BASE_DIR / "static" / "holdpoint" / "app.css").read_text()
    rule = re.search(r"bdi,\s*code,[^{]*\{\s*unicode-bidi:\s*isolate;", css)
    assert rule is not None
