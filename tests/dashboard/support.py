"""Helpers for dashboard tests: runs stopped at hold points, forms as a browser submits them."""

from __future__ import annotations

import html
import re
from typing import Any

from django.test import Client

from runs import services
from tests.runs.factory import AGENT, claim, epochs

HTMX = {"HTTP_HX_REQUEST": "true"}


def hidden(html: str, name: str) -> str:
    """The value of the first hidden input called ``name`` in ``html``."""
    match = re.search(rf'<input type="hidden" name="{re.escape(name)}" value="([^"]*)"', html)
    assert match, f"no hidden {name} in the page"
    return match.group(1)


def card_html(html: str, request_id: str) -> str:
    start = html.index(f'id="request-{request_id}"')
    end = html.find("</article>", start)
    return html[start:end]


def answer(
    client: Client,
    req: Any,
    fields: list[tuple[str, str]] | dict[str, Any],
    *,
    htmx: bool = False,
    key: str | None = None,
    origin: str = "inbox",
    checkpoint_id: str | None = None,
) -> Any:
    """POST an answer the way the card's form does (with a fresh key unless one is given)."""
    data: dict[str, Any] = {
        "idempotency_key": key or f"test-{req.id}-{id(fields)}",
        "run_id": req.run_id,
        "request_id": req.id,
        "checkpoint_id": checkpoint_id or req.checkpoint_id,
        "origin": origin,
    }
    if isinstance(fields, dict):
        data.update(fields)
    else:
        for name, value in fields:
            data.setdefault(name, [])
            if not isinstance(data[name], list):
                data[name] = [data[name]]
            data[name].append(value)
    url = f"/runs/{req.run_id}/requests/{req.id}/answer"
    return client.post(url, data, **(HTMX if htmx else {}))


def text(response: Any) -> str:
    """The response body with HTML entities decoded, for asserting on what a person reads."""
    return html.unescape(response.content.decode())


def ask(
    *,
    kind: str = "input_required",
    schema: Any = None,
    action: Any = None,
    prompt: str = "请选择需要保持兼容的 Token 版本",
    expires_in: float = 3600,
    state: Any = None,
    input: Any = None,
    **kw: Any,
) -> tuple[Any, Any, Any, Any]:
    """A run stopped at a hold point through the real services: (run, lease, checkpoint, request).

    The claim takes the oldest due attempt, so call this while no other run is queued.
    """
    run = services.run_start(agent=AGENT, input=input if input is not None else {"n": 1})
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="ask", state=state or {"seen": 1})
    if kind == "auth_required" and action is None:
        action = {"tool": "config_store", "target": "staging/auth/config"}
    request = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind=kind,
        prompt=prompt,
        accepted_schema=schema if schema is not None else {"versions": "string[]"},
        expires_in=expires_in,
        action=action,
        **kw,
    )
    run.refresh_from_db()
    return run, lease, cp, request


def more_pending(req: Any, count: int, *, first_in: float = 7200, step: float = 60) -> list[Any]:
    """``count`` more pending requests like ``req`` (on its run), expiring ``step`` seconds
    apart from ``first_in`` seconds on: many cards without starting a run for each."""
    import datetime as dt

    from django.utils import timezone

    from runs.ids import new_request_id
    from runs.models import InputRequest

    now = timezone.now()
    return InputRequest.objects.bulk_create(
        InputRequest(
            id=new_request_id(),
            run_id=req.run_id,
            attempt_id=req.attempt_id,
            checkpoint_id=req.checkpoint_id,
            kind=req.kind,
            prompt=f"{req.prompt} #{i}",
            accepted_schema=req.accepted_schema,
            action=req.action,
            expires_at=now + dt.timedelta(seconds=first_in + i * step),
        )
        for i in range(count)
    )
