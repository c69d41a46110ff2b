"""The audit trail: decisions and control operations across runs, newest first.

Read from ``RunEvent``, the append-only history (docs/security.md, "Audit"): one row per
event of ``runs.audit.AUDIT_EVENT_TYPES``, with who (``actor``), how (``via``,
``identity``: ``runs/audit.py``), what (a bounded ``summary`` and ``comment``) and where
(run, agent, request). Changes to an agent as a whole that no run holds (its tool rules)
come from ``AgentEvent`` (``runs.audit.AGENT_AUDIT_EVENT_TYPES``), merged in: their rows
have no run. Paged by a keyset on ``(created_at, source, id)`` (``source`` orders the
two tables' rows of one instant: a run's first), each table read in the order of its
indexes (``event_audit_idx`` and ``event_audit_actor_idx``; ``agent_event_audit_idx``
and ``agent_event_audit_actor_idx``): a page costs the same at the first event as at
the millionth, and events that arrive while someone pages land before the first page,
never shifting the next ones.

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

from runs.audit import AGENT_AUDIT_EVENT_TYPES, AUDIT_EVENT_TYPES
from runs.models import AgentEvent, RunEvent

SUMMARY_MAX = 200
COMMENT_MAX = 500
PAGE_MAX = 200

# Which table a row of the trail comes from. Of two rows of the same instant, the run's
# event comes first (newest first: the higher source).
RUN_SOURCE = 1
AGENT_SOURCE = 0

# A position in the trail: the (created_at, source, id) of the last row a page showed.
Key = tuple[dt.datetime, int, int]


class AuditRow(TypedDict):
    at: dt.datetime
    run_id: str | None
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


def _filtered(events: QuerySet[Any], where: AuditFilter) -> QuerySet[Any]:
    """``events`` (runs' or agents') narrowed by the filters both kinds share: type,
    time window and actor."""
    if where.type:
        events = events.filter(type=where.type)
    if where.since is not None:
        events = events.filter(created_at__gte=where.since)
    if where.until is not None:
        events = events.filter(created_at__lt=where.until)
    if where.actor:
        events = events.filter(actor=actor_of(where.actor))
    return events


def audit_events(where: AuditFilter, *, before: Key | None = None) -> QuerySet[RunEvent]:
    """The runs' events of the trail under ``where``, newest first, older than ``before``."""
    # The type list is the partial indexes' condition: with it the planner may use them.
    if where.type in AGENT_AUDIT_EVENT_TYPES:
        return RunEvent.objects.none()
    events = _filtered(RunEvent.objects.filter(type__in=AUDIT_EVENT_TYPES), where)
    if where.run_id:
        events = events.filter(run_id=where.run_id)
    if before is not None:
        events = events.filter(_older(before, RUN_SOURCE))
    return events.order_by("-created_at", "-id")


def agent_audit_events(where: AuditFilter, *, before: Key | None = None) -> QuerySet[AgentEvent]:
    """The agents' events of the trail under ``where``, newest first, older than ``before``:
    none when ``where`` asks for one run (they belong to no run) or a run's event type."""
    if where.run_id or (where.type and where.type not in AGENT_AUDIT_EVENT_TYPES):
        return AgentEvent.objects.none()
    events = _filtered(AgentEvent.objects.all(), where)
    if before is not None:
        events = events.filter(_older(before, AGENT_SOURCE))
    return events.order_by("-created_at", "-id")


def _older(before: Key, source: int) -> Q:
    """The rows of table ``source`` that come after ``before`` (newest first): earlier, or
    of the same instant and after it in (source, id)."""
    at, before_source, pk = before
    # The first condition is the index's range; the second breaks ties on the same
    # instant (events of one transaction share it): by source, then by id.
    if source < before_source:
        same_instant = Q(created_at=at)
    elif source == before_source:
        same_instant = Q(id__lt=pk)
    else:
        same_instant = Q(pk__in=[])
    return Q(created_at__lte=at) & (Q(created_at__lt=at) | same_instant)


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


def _agent_values(events: QuerySet[AgentEvent]) -> QuerySet[Any]:
    """The columns and the bounded parts of each agent event's payload a row shows."""
    return events.values("id", "created_at", "agent", "type", "actor").annotate(
        via=_cut_text("payload__via", 20),
        identity=_cut_text("payload__identity", 200),
        server=_cut_text("payload__server", 64),
        tool=_cut_text("payload__tool", 128),
        rule=_cut_text("payload__rule", 10),
        changed_from=_cut_text("payload__from", 10),
        pattern_count=_cut_text("payload__pattern_count", 5),
        suggestion=_cut_text("payload__accepted_suggestion", 5),
        comment=_cut_text("payload__comment", COMMENT_MAX),
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


def _agent_row(v: dict[str, Any]) -> AuditRow:
    """A tool rule confirmed: "rule of files/write_file: approve, 2 patterns (was record)"."""
    patterns = v["pattern_count"] or "0"
    was = v["changed_from"] or "not confirmed"
    how = ", the suggestion" if v["suggestion"] == "true" else ""
    summary = (
        f"rule of {v['server'] or '?'}/{v['tool'] or '?'}: {v['rule'] or '?'}{how}, "
        f"{patterns} pattern{'' if patterns == '1' else 's'} (was {was})"
    )
    return {
        "at": v["created_at"],
        "run_id": None,
        "agent": v["agent"],
        "type": v["type"],
        "actor": v["actor"],
        "via": v["via"] or "",
        "identity": v["identity"] or "",
        "request_id": None,
        "decision": None,
        "summary": _cut(summary, SUMMARY_MAX),
        "comment": _cut(v["comment"], COMMENT_MAX),
    }


def _merged(where: AuditFilter, *, before: Key | None, limit: int) -> list[tuple[Key, AuditRow]]:
    """The first ``limit`` rows of the trail older than ``before``, with their keys: at
    most ``limit`` of each table (two index scans), merged newest first."""
    found = [
        ((v["created_at"], RUN_SOURCE, v["id"]), _row(v))
        for v in _bounded_values(audit_events(where, before=before))[:limit]
    ] + [
        ((v["created_at"], AGENT_SOURCE, v["id"]), _agent_row(v))
        for v in _agent_values(agent_audit_events(where, before=before))[:limit]
    ]
    found.sort(key=lambda item: item[0], reverse=True)
    return found[:limit]


def audit_page(
    where: AuditFilter, *, before: Key | None, limit: int
) -> tuple[list[AuditRow], Key | None]:
    """One page of at most ``limit`` rows older than ``before``, and the key to ask for the
    next page with (None on the last page)."""
    if not 1 <= limit <= PAGE_MAX:
        raise ValueError(f"limit must be 1 to {PAGE_MAX}")
    found = _merged(where, before=before, limit=limit + 1)
    more = len(found) > limit
    found = found[:limit]
    return [row for _key, row in found], found[-1][0] if more else None


def _download_bound(where: AuditFilter, *, before: Key | None, max_rows: int) -> Key | None:
    """The key of the ``max_rows``-th row older than ``before``, None when fewer match."""
    agents = agent_audit_events(where, before=before)
    if not agents.exists():
        # The runs' events alone: one index scan finds the bound.
        keys = list(
            audit_events(where, before=before).values_list("created_at", "id")[
                max_rows - 1 : max_rows + 1
            ]
        )
        return (keys[0][0], RUN_SOURCE, keys[0][1]) if len(keys) == 2 else None
    # Agent events are few (people's changes); merge the keys of both, at most max_rows + 1 each.
    merged = sorted(
        [
            (at, RUN_SOURCE, pk)
            for at, pk in audit_events(where, before=before).values_list("created_at", "id")[
                : max_rows + 1
            ]
        ]
        + [
            (at, AGENT_SOURCE, pk)
            for at, pk in agents.values_list("created_at", "id")[: max_rows + 1]
        ],
        reverse=True,
    )
    return merged[max_rows - 1] if len(merged) > max_rows else None


def audit_download(
    where: AuditFilter, *, before: Key | None, max_rows: int, chunk: int = 1000
) -> tuple[Iterator[list[AuditRow]], Key | None]:
    """The rows of a download, as an iterator of lists of rows (each list one query per
    table), and the key to continue from when more than ``max_rows`` rows match (None:
    they all fit).

    The bound is found first: the key of the ``max_rows``-th row. The iterator then walks
    down to that key and stops, so a download holds at most ``max_rows`` rows counted when
    it starts (events arriving meanwhile come on top), and the next download, from the
    returned key, starts exactly after it."""
    bound = _download_bound(where, before=before, max_rows=max_rows)

    def chunks() -> Iterator[list[AuditRow]]:
        position = before
        while True:
            found = _merged(where, before=position, limit=chunk)
            if not found:
                return
            kept = [item for item in found if bound is None or item[0] >= bound]
            if kept:
                yield [row for _key, row in kept]
            if len(found) < chunk or len(kept) < len(found):
                return
            position = found[-1][0]

    return chunks(), bound


# --- Cursors ------------------------------------------------------------------------------------


def cursor_encode(key: Key) -> str:
    """An opaque cursor for ``key``: URL-safe, no padding. A run event's is ``[time, id]``
    (as before agent events were), an agent event's ``[time, id, 0]``."""
    at, source, pk = key
    members: list[Any] = [at.isoformat(), pk] if source == RUN_SOURCE else [at.isoformat(), pk, 0]
    text = json.dumps(members, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def cursor_decode(cursor: str) -> Key | None:
    """The key of a cursor ``cursor_encode`` made, or None for anything else."""
    if not cursor or len(cursor) > 200:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        members = json.loads(raw)
        if not isinstance(members, list) or len(members) not in (2, 3):
            return None
        at_text, pk = members[0], members[1]
        source = members[2] if len(members) == 3 else RUN_SOURCE
        at = dt.datetime.fromisoformat(at_text)
    except (binascii.Error, ValueError, TypeError):
        return None
    if not isinstance(pk, int) or isinstance(pk, bool) or not 0 < pk < 2**63:
        return None
    if source not in (RUN_SOURCE, AGENT_SOURCE) or isinstance(source, bool):
        return None
    if len(members) == 3 and source != AGENT_SOURCE:
        return None
    if at.tzinfo is None:
        return None
    return at, source, pk
