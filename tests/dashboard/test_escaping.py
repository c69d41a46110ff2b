"""Agent-provided text is escaped everywhere: prompts, context, actions, errors, state, input."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger import services as ledger
from runs import services
from tests.dashboard.support import HTMX, answer, ask
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db

SCRIPT = "<script>alert('xss')</script>"
IMG = "<img src=x onerror=alert(1)>"
QUOTE = '" onmouseover="alert(2)'
EVIL = f"{SCRIPT}{IMG}{QUOTE}"


def assert_inert(html: str, *, shown: bool = True) -> None:
    assert SCRIPT not in html
    assert IMG not in html
    assert 'onmouseover="alert(2)' not in html
    assert "onerror=alert" not in html.replace("onerror=alert(1)&gt;", "")
    # Every <script> on the page is one of ours, loaded from a file (or the JavaScript
    # catalog of app.js's words, a script file too).
    for tag in re.findall(r"<script[^>]*>", html):
        assert re.search(r'src="/(static/|jsi18n/\?lang=[a-z-]+")', tag), tag
    if shown:
        assert "&lt;script&gt;alert(&#x27;xss&#x27;)&lt;/script&gt;" in html


def test_it_escapes_agent_text_on_every_page(client: Client, approver: User) -> None:
    input_run, _l, _c, question = ask(
        prompt=EVIL,
        schema={
            "type": "object",
            "title": EVIL,
            "properties": {
                "pick": {
                    "type": "string",
                    "title": EVIL,
                    "description": EVIL,
                    "enum": [EVIL, "ok", "fine", "other"],
                },
                "free": {"type": "string", "pattern": QUOTE, "default": EVIL},
                EVIL: {"type": "integer"},
            },
            "required": ["pick"],
        },
        context={EVIL: EVIL, "nested": {"html": EVIL}},
        reason=EVIL,
        step_id="step-x",
        state={EVIL: [EVIL]},
        input={"n": 1},
    )
    approval_run, _l, _c, approval = ask(
        kind="auth_required",
        prompt=EVIL,
        action={
            "tool": EVIL,
            "target": EVIL,
            "operation": EVIL,
            "reversibility": "compensable",
            "compensating_action": EVIL,
            "before": EVIL,
            "after": EVIL + "!",
            "arguments": {EVIL: EVIL},
            EVIL: EVIL,
        },
        reason=EVIL,
    )
    failed = start()
    lease = claim()
    services.checkpoint_save(**epochs(lease), step="render", state={"html": EVIL})
    services.attempt_fail(
        **epochs(lease), error={"type": "ValueError", "message": EVIL, "step": "render"}
    )
    effects_run = start(approvals=["notify"])
    lease = claim()
    begun = ledger.side_effect_begin(
        **epochs(lease),
        step_id="notify",
        tool="webhook",
        target=EVIL,
        request={"url": "http://127.0.0.1:9/x", "body": {EVIL: EVIL}},
    )
    ledger.side_effect_record_outcome(
        operation_id=begun.operation_id, status="unknown", error={"message": EVIL}
    )
    client.force_login(approver)
    for url in [
        "/side-effects/",
        "/side-effects/?tab=all",
        f"/side-effects/runs/{effects_run.id}/",
    ]:
        assert_inert(client.get(url).content.decode())
    for url in [
        "/",
        "/?tab=all",
        f"/runs/{input_run.id}/",
        f"/runs/{approval_run.id}/",
        f"/runs/{failed.id}/",
    ]:
        assert_inert(client.get(url).content.decode())
    assert_inert(client.get("/runs/").content.decode(), shown=False)
    timeline = client.get(f"/runs/{failed.id}/timeline?events=failures", **HTMX)
    assert_inert(timeline.content.decode())
    # The answer is escaped where it is shown back, and so is a deny comment.
    response = answer(client, question, {"answer/pick": "0"}, htmx=True)
    assert response.status_code == 200
    assert_inert(response.content.decode())
    response = answer(client, approval, {"decision": "deny", "comment": EVIL}, htmx=True)
    assert response.status_code == 200
    assert_inert(response.content.decode())
    assert_inert(client.get("/?tab=answered").content.decode())
