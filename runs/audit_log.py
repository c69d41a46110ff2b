"""The audit trail: decisions and control operations across runs, newest first.

Read from ``RunEvent``, the append-only history (docs/security.md, "Audit"): one row per
event of ``runs.audit.AUDIT_EVENT_TYPES``, with who (``actor``), how (``via``,
``identity``: ``runs/audit.py``), what (a bounded ``summary`` and ``comment``) and where
(run, agent, request). Paged by a keyset on ``(created_at, id)``, the order of the
partial indexes ``event_audit_idx`` and ``event_audit_actor_idx`` (``runs.models``): a
page costs the same at the first event as at the millionth, and events that arrive
while someone pages land before the first page, never shifting the next ones.

Each row reads only bounded parts of its payload (the database cuts the texts), so an
answer of 256 KiB costs no more than a word. The permission (``runs.view_audit``) is
the caller's to check: the API refuses before calling here.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

from django.db.models import F, Q, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Substr

from runs.audit import AUDIT_EVENT_TYPES
from runs.models import RunEvent

SUMMARY_MAX = 200
COMMENT_MAX = 500
PAGE_MAX = 200

# A position in the trail: the (created_at, id) of the last row a page showed.
Key = tuple[dt.datetime, int]


class AuditRow(TypedDict):
    at: dt.datetime
    run_id: str
    agent: str
    type: str
    actor: str
    via: str
    identity: str
    request_id: str | None
    decision: str | None
    summary: str
    comment: str


@dataclass(frozen=True)
class AuditFilter:
    """What ``GET /api/audit`` narrows the trail to; every member optional. ``since`` is
    inclusive, ``until`` exclusive. ``actor`` is an event's actor (``user:olivia``,
    ``cli``, ``system``) or a user name (``olivia``, which means ``user:olivia``:
    ``actor_of``)."""

    since: dt.datetime | None = None
    until: dt.datetime | None = None
    actor: str = ""
    run_id: str = ""
    type: str = ""


# Actors that are not people, written bare (``runs.services.actor_for``, the commands).
BARE_ACTORS = frozenset({"system", "cli"})


def actor_of(name: str) -> str:
    """The actor a filter means: ``olivia`` is the person ``user:olivia``; ``cli``,
    ``system`` and anything with a colon (``user:olivia``, ``system:sweeper``) are
    themselves. One value, so the actor index gives the rows in order (no sort)."""
    return name if ":" in name or name in BARE_ACTORS else f"user:{name}"


def audit_events(where: AuditFilter, *, before: Key | None = None) -> QuerySet[RunEvent]:
    """The events of the trail under ``where``, newest first, older than ``before``."""
    # The type list is the partial indexes' condition: with it the planner may use them.
    events = RunEvent.objects.filter(type__in=AUDIT_EVENT_TYPES)
    if where.type:
        events = events.filter(type=where.type)
    if where.since is not None:
        events = events.filter(created_at__gte=where.since)
    if where.until is not None:
        events = events.filter(created_at__lt=where.until)
    if where.actor:
        events = events.filter(actor=actor_of(where.actor))
    if where.run_id:
        events = events.filter(run_id=where.run_id)
    if before is not None:
        at, pk = before
        # The first condition is the index's range; the second breaks ties on the same
        # instant (events of one transaction share it) by id.
        events = events.filter(created_at__lte=at).filter(Q(created_at__lt=at) | Q(id__lt=pk))
    return events.order_by("-created_at", "-id")


def _cut_text(path: str, limit: int) -> Substr:
    # One character more than shown, so that ``_cut`` can tell a text that was cut.
    return Substr(KT(path), 1, limit + 1)


def _bounded_values(events: QuerySet[RunEvent]) -> QuerySet[Any]:
    """The columns and the bounded parts of each payload a row shows."""
    return events.values("id", "created_at", "run_id", "type", "actor").annotate(
        agent=F("run__agent"),
        via=_cut_text("payload__via", 20),
        identity=_cut_text("payload__identity", 200),
        request_id=_cut_text("payload__request_id", 40),
        by=_cut_text("payload__by", 150),
        comment=_cut_text("payload__comment", COMMENT_MAX),
        reason=_cut_text("payload__reason", COMMENT_MAX),
        answer=_cut_text("payload__answer", SUMMARY_MAX),
        answer_decision=_cut_text("payload__answer__decision", 10),
        answer_comment=_cut_text("payload__answer__comment", COMMENT_MAX),
        answer_edited=_cut_text("payload__answer__edited", 1),
        edited=_cut_text("payload__edited", 1),
        changed_from=_cut_text("payload__from", 10),
        changed_to=_cut_text("payload__to", 10),
        approvals=_cut_text("payload__approvals", 10),
        required=_cut_text("payload__required", 10),
        steps=_cut_text("payload__steps", SUMMARY_MAX),
        from_checkpoint=_cut_text("payload__from_checkpoint", 40),
    )


def _cut(text: Any, limit: int) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _steps(text: str | None) -> str:
    try:
        steps = json.loads(text or "")
    except ValueError:  # cut by the database, or not a list
        return text or ""
    return ", ".join(str(s) for s in steps) if isinstance(steps, list) else str(steps)


def _what(v: dict[str, Any]) -> tuple[str | None, str, str]:
    """(decision, summary, comment) of one event's bounded values."""
    kind = v["type"]
    reason = v["reason"] or ""
    if kind == "request.answered":
        decision = v["answer_decision"]
        if decision:
            edited = " (edited)" if v["answer_edited"] else ""
            return decision, f"{decision}{edited}", v["answer_comment"] or ""
        return None, f"answer: {_cut(v['answer'], SUMMARY_MAX - 8)}", ""
    if kind == "approval.given":
        edited = " (edited)" if v["edited"] else ""
        summary = f"approve{edited}: {v['approvals'] or '?'} of {v['required'] or '?'}"
        return "approve", summary, v["comment"] or ""
    if kind == "approval.objected":
        return "deny", "deny (an objection; the request stays open)", v["comment"] or ""
    if kind == "approval.changed":
        to = v["changed_to"] or ""
        return to or None, f"changed {v['changed_from'] or '?'} to {to}", v["comment"] or ""
    if kind == "run.approved_at_start":
        return "approve", f"approve at start: {_steps(v['steps'])}", ""
    if kind == "run.retried":
        cp = v["from_checkpoint"]
        return None, f"retry from {cp}" if cp else "retry", reason
    if kind in ("agent.paused", "agent.unpaused"):
        verb = "pause" if kind == "agent.paused" else "unpause"
        return None, f"{verb} agent {v['agent']}", reason
    summaries = {
        "run.created": "start",
        "run.continued": "continue",
        "run.cancel_requested": "cancel",
        "run.pause_requested": "pause",
    }
    return None, summaries.get(kind, kind), reason


def _row(v: dict[str, Any]) -> AuditRow:
    decision, summary, comment = _what(v)
    return {
        "at": v["created_at"],
        "run_id": v["run_id"],
        "agent": v["agent"],
        "type": v["type"],
        "actor": v["actor"],
        "via": v["via"] or "",
        "identity": v["identity"] or "",
        "request_id": v["request_id"] or None,
        "decision": decision,
        "summary": _cut(summary, SUMMARY_MAX),
        "comment": _cut(comment, COMMENT_MAX),
    }


def audit_page(
    where: AuditFilter, *, before: Key | None, limit: int
) -> tuple[list[AuditRow], Key | None]:
    """One page of at most ``limit`` rows older than ``before``, and the key to ask for the
    next page with (None on the last page)."""
    if not 1 <= limit <= PAGE_MAX:
        raise ValueError(f"limit must be 1 to {PAGE_MAX}")
    found = list(_bounded_values(audit_events(where, before=before))[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    rows = [_row(v) for v in found]
    last = found[-1] if more else None
    return rows, (last["created_at"], last["id"]) if last is not None else None


def audit_download(
    where: AuditFilter, *, before: Key | None, max_rows: int, chunk: int = 1000
) -> tuple[Iterator[list[AuditRow]], Key | None]:
    """The rows of a download, as an iterator of lists of rows (each list one query), and
    the key to continue from when more than ``max_rows`` rows match (None: they all fit).

    The bound is found first: the key of the ``max_rows``-th row, by one index scan. The
    iterator then walks down to that key and stops, so a download holds at most
    ``max_rows`` rows counted when it starts (events arriving meanwhile come on top), and
    the next download, from the returned key, starts exactly after it."""
    keys = list(
        audit_events(where, before=before).values_list("created_at", "id")[
            max_rows - 1 : max_rows + 1
        ]
    )
    bound: Key | None = keys[0] if len(keys) == 2 else None

    def chunks() -> Iterator[list[AuditRow]]:
        position = before
        while True:
            events = audit_events(where, before=position)
            if bound is not None:
                at, pk = bound
                events = events.filter(created_at__gte=at).filter(
                    Q(created_at__gt=at) | Q(id__gte=pk)
                )
            found = list(_bounded_values(events)[:chunk])
            if not found:
                return
            yield [_row(v) for v in found]
            if len(found) < chunk:
                return
            position = (found[-1]["created_at"], found[-1]["id"])

    return chunks(), bound


# --- Cursors ------------------------------------------------------------------------------------


def cursor_encode(key: Key) -> str:
    """An opaque cursor for ``key``: URL-safe, no padding."""
    at, pk = key
    text = json.dumps([at.isoformat(), pk], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def cursor_decode(cursor: str) -> Key | None:
    """The key of a cursor ``cursor_encode`` made, or None for anything else."""
    if not cursor or len(cursor) > 200:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at_text, pk = json.loads(raw)
        at = dt.datetime.fromisoformat(at_text)
    except (binascii.Error, ValueError, TypeError):
        return None
    if not isinstance(pk, int) or isinstance(pk, bool) or not 0 < pk < 2**63:
        return None
    if at.tzinfo is None:
        return None
    return at, pk
