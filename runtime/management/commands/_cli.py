"""Shared by the command-line helpers: print a run's timeline as it grows."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import OutputWrapper

from runs.events import EventType
from runs.models import InputRequest, Run, RunEvent
from runs.states import ANSWERABLE, TERMINAL

DATA_SHOWN = 300


def log_data(data: Any) -> str:
    """The fields of ``ctx.log(message, **data)``: `` key=value`` each, JSON values."""
    if not isinstance(data, dict) or not data:
        return ""
    text = " ".join(
        f"{key}={json.dumps(value, ensure_ascii=False, default=str)}" for key, value in data.items()
    )
    return " " + (text if len(text) <= DATA_SHOWN else text[: DATA_SHOWN - 1] + "…")


def user_named(username: str | None) -> Any:
    """The user a command acts as (``--as NAME``), or None (the actor is ``cli``)."""
    from django.contrib.auth import get_user_model
    from django.core.management.base import CommandError

    if not username:
        return None
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"There is no user {username!r}.")
    return user


def describe(event: RunEvent) -> str:
    p: dict[str, Any] = event.payload or {}
    details: dict[str, Callable[[], str]] = {
        EventType.AGENT_LOG: lambda: (
            f"[{p.get('level')}] {p.get('step')}: {p.get('message')}" + log_data(p.get("data"))
        ),
        EventType.CHECKPOINT_SAVED: lambda: f"#{p.get('number')} next step {p.get('step')!r}",
        EventType.ATTEMPT_CLAIMED: lambda: (
            f"attempt #{p.get('number')} lease_epoch={p.get('lease_epoch')}"
        ),
        EventType.ATTEMPT_FAILED: lambda: f"{p.get('class')}: {p.get('type')}: {p.get('message')}",
        EventType.RUN_BACKING_OFF: lambda: f"retry in {p.get('delay_seconds')}s",
        EventType.RUN_INTERRUPTED: lambda: (
            f"{p.get('kind')} {p.get('request_id')} ({p.get('step_id')})"
        ),
        EventType.RUN_FAILED: lambda: f"{p.get('failure_class')}: {p.get('detail', '')}",
        EventType.REQUEST_ANSWERED: lambda: json.dumps(p.get("answer"), ensure_ascii=False),
    }
    detail = details.get(event.type)
    if event.type.startswith("side_effect."):
        ref = p.get("external_reference") or ""
        text = f"{p.get('tool')} on {p.get('target')}: {p.get('status')} {ref}".strip()
        if p.get("late"):
            text += " (late)"
    else:
        text = detail() if detail else ""
    return f"{event.seq:>4} {event.type:<20} {event.actor:<28} {text}".rstrip()


def print_request(out: OutputWrapper, request: InputRequest) -> None:
    out.write(f"\n{request.kind}: {request.prompt}\n")
    if request.action:
        out.write(f"  action:   {json.dumps(request.action, ensure_ascii=False)}\n")
    if request.context:
        out.write(f"  context:  {json.dumps(request.context, ensure_ascii=False)}\n")
    out.write(f"  schema:   {json.dumps(request.accepted_schema, ensure_ascii=False)}\n")
    out.write(f"  expires:  {request.expires_at.isoformat()}\n")
    example = "'<JSON answer>'"
    if request.kind == "auth_required":
        example = """'{"decision": "approve"}'"""
    elif request.kind == "pause":
        example = "null  (continue the paused run)"
    out.write(
        f"  answer:   python manage.py answerrun {request.run_id} {example}\n"
        f"  or POST /api/runs/{request.run_id}/resume "
        f'{{"request_id": "{request.id}", "checkpoint_id": "{request.checkpoint_id}", '
        '"value": ...}\n'
    )


def watch(out: OutputWrapper, run_id: str, *, through_holds: bool, timeout: float | None) -> Run:
    """Print the run's events until it is final (or waiting for a person, unless
    ``through_holds``). Return the run as it ended up."""
    seen = 0
    started = time.monotonic()
    shown_request = None
    while True:
        for event in RunEvent.objects.filter(run_id=run_id, seq__gt=seen).order_by("seq"):
            out.write(describe(event) + "\n")
            seen = event.seq
        out.flush()
        run = Run.objects.get(pk=run_id)
        if run.status in TERMINAL:
            return run
        if run.status in ANSWERABLE and run.pending_request_id != shown_request:
            shown_request = run.pending_request_id
            request = InputRequest.objects.get(pk=run.pending_request_id)
            print_request(out, request)
            out.flush()
            if not through_holds:
                return run
        if timeout is not None and time.monotonic() - started > timeout:
            return run
        time.sleep(0.3)
