"""How runs, requests, actions and events read on the page.

Everything here returns plain text or small dataclasses; templates escape all of
it. Agent-provided text is never marked safe: the only HTML made here is ``isolate``'s
``<bdi>`` around text escaped by ``format_html``.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.utils import formats, timezone
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, pgettext

from ledger.events import SideEffectEvent
from runs.events import EventType
from runs.models import InputRequest, Run, RunEvent
from runs.selectors import WaitingReason
from runs.states import FailureClass, RequestKind, RequestStatus, RunStatus

# --- Times ---------------------------------------------------------------------------------


def zone_is_the_users() -> bool:
    """Whether a zone was activated for this request or push (the browser's, from the
    ``tz`` cookie app.js sets). Without JavaScript there is none: times are in the server's
    zone, and then every time says which zone it is in."""
    return getattr(timezone._active, "value", None) is not None  # type: ignore[attr-defined]


def actor_name(actor: str) -> str:
    """Who did it, as a person reads it: ``user:olivia`` is ``olivia``; a system actor
    (``worker``, ``sweeper``) stays as it is."""
    return actor.split(":", 1)[1] if actor.startswith("user:") else actor


def clock(value: dt.datetime | None, *, zone: bool = False) -> str:
    """``14:02`` today, ``Nov 28, 14:02`` on another day, in the active (the user's) zone;
    with the zone's name when asked, or when the zone is not the user's."""
    if value is None:
        return ""
    zone = zone or not zone_is_the_users()
    local = timezone.localtime(value)
    today = timezone.localtime(timezone.now()).date()
    # Date formats are translatable: Chinese reads "11月28日 14:02", not "十一月 28, 14:02".
    fmt = "H:i" if local.date() == today else pgettext("date and time format", "M j, H:i")
    if zone:
        fmt += " T"
    return formats.date_format(local, fmt)


def absolute(value: dt.datetime | None) -> str:
    if value is None:
        return ""
    return formats.date_format(timezone.localtime(value), "Y-m-d H:i:s T")


def span(seconds: float) -> str:
    """A compact duration: ``2h 14m``, ``3m 05s``, ``42s``, ``3d 4h``."""
    seconds = int(abs(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    # The same words as app.js's countdown (it ticks what this renders).
    if days:
        return _("%(d)sd %(h)sh") % {"d": days, "h": hours}
    if hours:
        return _("%(h)sh %(m)sm") % {"h": hours, "m": minutes}
    if minutes:
        return _("%(m)sm %(s)ss") % {"m": minutes, "s": f"{secs:02d}"}
    return _("%(s)ss") % {"s": secs}


def expires_text(expires_at: dt.datetime, now: dt.datetime | None = None) -> str:
    left = (expires_at - (now or timezone.now())).total_seconds()
    if left <= 0:
        return _("Expired")
    return _("Expires in %(span)s") % {"span": span(left)}


def ago_text(value: dt.datetime, now: dt.datetime | None = None) -> str:
    return _("%(span)s ago") % {"span": span(((now or timezone.now()) - value).total_seconds())}


# --- Status words (docs/dashboard.md) ------------------------------------------------------------------

FAILURE_WORDS = {
    FailureClass.TRANSIENT: gettext_lazy("retry budget spent"),
    FailureClass.DETERMINISTIC: gettext_lazy("needs new information"),
    FailureClass.REPEATED_ERROR: gettext_lazy("same error again and again"),
    FailureClass.LEASE_LOST: gettext_lazy("worker kept disappearing"),
    FailureClass.SIDE_EFFECT_UNKNOWN: gettext_lazy("side effect unknown"),
    FailureClass.INPUT_EXPIRED: gettext_lazy("no answer in time"),
    FailureClass.DENIED: gettext_lazy("approval denied"),
    FailureClass.CANCELLED: gettext_lazy("cancelled"),
}


def run_status_text(run: Run) -> str:
    if run.status == RunStatus.WAITING and run.not_before:
        return _("Backing off (retry at %(time)s)") % {"time": clock(run.not_before)}
    if run.status == RunStatus.FAILED and run.failure_class:
        why = FAILURE_WORDS.get(run.failure_class, run.failure_class)  # type: ignore[call-overload]
        return _("Failed (%(why)s)") % {"why": why}
    return str(RunStatus(run.status).label) if run.status in RunStatus.values else run.status


def waiting_text(waiting: dict[str, Any] | None) -> SafeString:
    """Why a queued run is not running, in words (``runs.selectors.waiting_for_runs``);
    the names and the reason people and agents gave are escaped and isolated."""
    if waiting is None:
        return mark_safe("")
    reason = waiting["reason"]
    if reason == WaitingReason.AGENT_PAUSED:
        who = isolate(waiting["by"] or _("someone"))
        if waiting["detail"]:
            text = _("Held: agent paused by %(who)s, %(reason)s")
            return format_html(_fill(text), who=who, reason=isolate(waiting["detail"]))
        return format_html(_fill(_("Held: agent paused by %(who)s")), who=who)
    if reason == WaitingReason.BACKING_OFF:
        return format_html(_fill(_("Backing off until %(time)s")), time=clock(waiting["until"]))
    if reason == WaitingReason.NO_WORKER:
        agent = isolate(waiting["agent"])
        if waiting["since"] is None:
            return format_html(_fill(_("No worker has served %(agent)s yet")), agent=agent)
        return format_html(
            _fill(_("No live worker serves %(agent)s since %(time)s (last: %(worker)s)")),
            agent=agent,
            time=clock(waiting["since"]),
            worker=isolate(waiting["by"]),
        )
    return format_html("{}", _("Waiting for a free worker"))


def _fill(translated: str) -> str:
    """A translated ``%(name)s`` sentence as a ``format_html`` template ``{name}``."""
    return re.sub(r"%\((\w+)\)s", r"{\1}", translated.replace("{", "{{").replace("}", "}}"))


STATUS_TONE = {
    RunStatus.QUEUED: "neutral",
    RunStatus.RUNNING: "active",
    RunStatus.INPUT_REQUIRED: "input",
    RunStatus.AUTH_REQUIRED: "approval",
    RunStatus.WAITING: "warn",
    RunStatus.CANCEL_REQUESTED: "warn",
    RunStatus.PAUSE_REQUESTED: "warn",
    RunStatus.PAUSED: "warn",
    RunStatus.SUCCEEDED: "good",
    RunStatus.FAILED: "bad",
    RunStatus.CANCELLED: "neutral",
}


def status_tone(status: str) -> str:
    return STATUS_TONE.get(status, "neutral")  # type: ignore[call-overload]


# --- Approvals: what will be done ----------------------------------------------------------


@dataclass(frozen=True)
class DiffLine:
    kind: str  # add, del, hunk, meta, ctx
    text: str


def isolate(value: Any) -> SafeString:
    """``value`` escaped inside ``<bdi>``: a bidi isolate, so a right-to-left override in
    agent text cannot reorder the words around it (a tool shown after the target, "— cannot
    be undone"), and the text takes the direction of its own first strong character."""
    return format_html("<bdi>{}</bdi>", value)


@dataclass
class ActionView:
    title: str
    # The same title as HTML, each agent-given part (target, name, verb) isolated.
    title_html: SafeString
    name: str  # what is done: the action's name (update_auth_config), else the tool's
    tool: str
    target: str
    reversibility: str  # reversible | compensable | irreversible | "" (not said)
    compensation: str
    diff: list[DiffLine]
    change_text: str
    arguments: list[tuple[str, str]]

    @property
    def cannot_be_undone(self) -> bool:
        return self.reversibility == "irreversible"


_TITLE_KEYS = ("title", "summary")
_VERB_KEYS = ("operation", "verb")
_COMPENSATION_KEYS = ("compensating_action", "compensation", "undo")
_CHANGE_KEYS = ("planned_change", "change", "changes")
_ARGUMENT_KEYS = ("arguments", "args", "request", "params", "input")
_SHOWN_KEYS = {
    "tool",
    "action",
    "target",
    "reversibility",
    "diff",
    "before",
    "after",
    *_TITLE_KEYS,
    *_VERB_KEYS,
    *_COMPENSATION_KEYS,
    *_CHANGE_KEYS,
    *_ARGUMENT_KEYS,
    # The form to edit the plan (issue 18) shows it; not a raw argument too.
    "editable",
}
_PAIRS = (("before", "after"), ("from", "to"), ("old", "new"))


def as_text(value: Any) -> str:
    """A JSON value as a person reads it: strings as they are, the rest as indented JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _diff_lines(diff: str) -> list[DiffLine]:
    lines = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            kind = "meta"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        lines.append(DiffLine(kind, line))
    return lines


def parse_time(value: Any) -> dt.datetime | None:
    """An ISO time stored in JSON (an approval's ``at``) as a datetime, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        return None


def before_after_diff(
    before: Any, after: Any, name: str, *, labels: tuple[str, str] | None = None
) -> list[DiffLine]:
    """A unified diff of two JSON values as a person reads them (``now`` → ``after``, or
    the two ``labels``: "planned" → "edited")."""
    return _before_after_diff(before, after, name, labels=labels)


def _before_after_diff(
    before: Any, after: Any, name: str, *, labels: tuple[str, str] | None = None
) -> list[DiffLine]:
    old = as_text(before).splitlines() if before is not None else []
    new = as_text(after).splitlines() if after is not None else []
    first, second = labels or ("now", "after")
    diff = difflib.unified_diff(
        old, new, f"{name} ({first})", f"{name} ({second})", lineterm="", n=3
    )
    return _diff_lines("\n".join(diff))


def _pair(value: Any) -> tuple[Any, Any] | None:
    """``{"from": a, "to": b}`` (or before/after, old/new) as (a, b)."""
    if isinstance(value, dict):
        for old, new in _PAIRS:
            if set(value) == {old, new}:
                return value[old], value[new]
    return None


def _first(mapping: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if mapping.get(key) not in (None, "", {}, []):
            return mapping[key]
    return None


def describe_action(action: Any) -> ActionView:
    """Read an approval's ``action`` (tool, target, planned change, reversibility) leniently:
    agents name things differently, and nothing they send may be hidden."""
    data = action if isinstance(action, dict) else {"action": action}
    tool = str(data.get("tool") or "")
    name = str(data.get("action") or tool)
    target = str(data.get("target") or "")
    verb = _first(data, _VERB_KEYS)
    if verb is None and "_" in name:
        # update_auth_config -> "Update staging/auth/config via update_auth_config" (docs/dashboard.md).
        verb = name.split("_", 1)[0]
    title = _first(data, _TITLE_KEYS)
    template, parts = "%(title)s", {"title": str(title or "")}
    if title:
        pass
    elif verb and target:
        template = _("%(verb)s %(target)s via %(name)s")
        parts = {"verb": str(verb).capitalize(), "target": target, "name": name}
    elif target:
        template = _("%(name)s on %(target)s")
        parts = {"name": name, "target": target}
    else:
        template = _("Run %(name)s")
        parts = {"name": name}
    title = template % parts
    # The words of the translation are ours and escaped; each part the agent gave is isolated.
    title_html = mark_safe(  # noqa: S308 - every piece is escaped above
        conditional_escape(template) % {key: isolate(value) for key, value in parts.items()}
    )
    reversibility = str(data.get("reversibility") or "")
    compensation = _first(data, _COMPENSATION_KEYS)
    change = _first(data, _CHANGE_KEYS)
    diff: list[DiffLine] = []
    change_text = ""
    arguments: list[tuple[str, str]] = []
    if isinstance(data.get("diff"), str):
        diff = _diff_lines(data["diff"])
    elif "before" in data and "after" in data:
        diff = _before_after_diff(data["before"], data["after"], target or name)
    if isinstance(change, dict) and isinstance(change.get("diff"), str) and not diff:
        diff = _diff_lines(change["diff"])
    elif isinstance(change, dict) and _pair(change) and not diff:
        before, after = _pair(change)  # type: ignore[misc]
        diff = _before_after_diff(before, after, target or name)
    elif isinstance(change, dict):
        # Field by field: {"accepted_versions": {"from": [...], "to": [...]}, "base": 3}.
        for key, value in change.items():
            pair = _pair(value)
            if pair is not None and pair[0] != pair[1]:
                diff += [
                    DiffLine("del", f"- {key}: {_compact(pair[0])}"),
                    DiffLine("add", f"+ {key}: {_compact(pair[1])}"),
                ]
            else:
                arguments.append((str(key), as_text(value)))
    elif change is not None:
        change_text = as_text(change)
    args = _first(data, _ARGUMENT_KEYS)
    if isinstance(args, dict):
        arguments += [(str(k), as_text(v)) for k, v in args.items()]
    elif args is not None:
        arguments.append((_("arguments"), as_text(args)))
    # Whatever else the agent said is shown too, never dropped.
    arguments += [(str(k), as_text(v)) for k, v in data.items() if k not in _SHOWN_KEYS]
    return ActionView(
        title=title,
        title_html=title_html,
        name=name,
        tool=tool,
        target=target,
        reversibility=reversibility,
        compensation=as_text(compensation) if compensation is not None else "",
        diff=diff,
        change_text=change_text,
        arguments=arguments,
    )


def with_edit(action: Any, planned: Any, edited: Any) -> dict[str, Any] | None:
    """``action`` as an approved edit makes it: each argument the edit changed from the
    ``planned`` ones put in place, in the planned change's ``to`` (``{"ttl": {"from":
    7200, "to": 3600}}`` becomes ``… "to": 1800``) and in the arguments. So the card shows
    one change, the one that will happen. None when the change does not name each changed
    argument field by field (then the card shows the plan against the edit instead)."""
    if not isinstance(action, dict) or not isinstance(edited, dict) or not edited:
        return None
    plan = planned if isinstance(planned, dict) else {}
    changed = {k: v for k, v in edited.items() if k not in plan or plan[k] != v}
    out = dict(action)
    key = next((k for k in _CHANGE_KEYS if isinstance(action.get(k), dict)), None)
    if key is None or not changed:
        return None
    change = dict(action[key])
    for name, value in changed.items():
        pair = change.get(name)
        names = next(
            (p for p in _PAIRS if isinstance(pair, dict) and set(pair) == set(p)),
            None,
        )
        if names is None:
            return None
        change[name] = {names[0]: pair[names[0]], names[1]: value}  # type: ignore[index]
    out[key] = change
    for args_key in _ARGUMENT_KEYS:
        args = action.get(args_key)
        if isinstance(args, dict):
            out[args_key] = {**args, **{k: v for k, v in changed.items() if k in args}}
    return out


def edit_summary(planned: Any, edited: Any) -> str:
    """What an edit changed, in one line: ``ttl: 3600 → 1800; note: rotate → —``."""
    if isinstance(planned, dict) and isinstance(edited, dict):
        names = [k for k in {**planned, **edited} if planned.get(k) != edited.get(k)]
        return "; ".join(
            f"{k}: {_argument_text(planned.get(k))} → {_argument_text(edited.get(k))}"
            for k in names
        )
    return f"{_argument_text(planned)} → {_argument_text(edited)}"


def _argument_text(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return ", ".join(str(v) for v in value) or "—"
    return _compact(value)


# --- Requests -------------------------------------------------------------------------------


def request_title(req: InputRequest) -> str:
    if req.kind == RequestKind.AUTH_REQUIRED:
        return describe_action(req.action).title
    return req.prompt


def request_title_html(req: InputRequest) -> SafeString:
    """``request_title`` as HTML, with the agent's text isolated (``isolate``)."""
    if req.kind == RequestKind.AUTH_REQUIRED:
        return describe_action(req.action).title_html
    return isolate(req.prompt)


def decision_of(req: InputRequest) -> str:
    if isinstance(req.answer, dict):
        return str(req.answer.get("decision") or "")
    return ""


def who(req: InputRequest) -> str:
    return req.answered_by.get_username() if req.answered_by else _("someone")


def request_outcome_text(req: InputRequest) -> str:
    """Why a request can no longer be answered, naming who answered and when (docs/dashboard.md)."""
    if req.status == RequestStatus.ANSWERED:
        when = clock(req.answered_at)
        decision = decision_of(req)
        if req.kind == RequestKind.AUTH_REQUIRED and decision == "approve":
            return _("Already approved by %(who)s at %(when)s.") % {"who": who(req), "when": when}
        if req.kind == RequestKind.AUTH_REQUIRED and decision == "deny":
            return _("Already denied by %(who)s at %(when)s.") % {"who": who(req), "when": when}
        return _("Already answered by %(who)s at %(when)s.") % {"who": who(req), "when": when}
    if req.status == RequestStatus.EXPIRED:
        return _("No response — it expired at %(when)s and the run failed.") % {
            "when": clock(req.expires_at, zone=True)
        }
    if req.status == RequestStatus.CANCELLED:
        # The services store their reasons in English (gettext_noop); show them translated.
        return _(req.closed_reason) if req.closed_reason else _("Closed: the run moved on.")
    if req.expires_at <= timezone.now():
        return _("This request expired at %(when)s; it can no longer be answered.") % {
            "when": clock(req.expires_at, zone=True)
        }
    return ""


def answer_summary(req: InputRequest) -> str:
    """What was submitted, as text (docs/dashboard.md)."""
    if req.answer is None:
        return ""
    if req.kind == RequestKind.AUTH_REQUIRED and isinstance(req.answer, dict):
        return str(req.answer.get("comment") or "")
    return as_text(req.answer)


def answer_rows(req: InputRequest) -> list[tuple[str, str]]:
    """An input answer as (label, value) rows, labelled like the form that asked for it."""
    if req.kind != RequestKind.INPUT_REQUIRED or not isinstance(req.answer, dict):
        return []
    schema: dict[str, Any] = req.accepted_schema if isinstance(req.accepted_schema, dict) else {}
    found = schema.get("properties")
    properties: dict[str, Any] = found if isinstance(found, dict) else {}
    rows = []
    for key, value in req.answer.items():
        entry = properties.get(key)
        field: dict[str, Any] = entry if isinstance(entry, dict) else {}
        label = str(field.get("title") or key.replace("_", " ").capitalize())
        if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            text = ", ".join(str(v) for v in value) or "—"
        elif isinstance(value, bool):
            text = _("yes") if value else _("no")
        else:
            text = as_text(value)
        rows.append((label, text))
    return rows


@dataclass(frozen=True)
class ContextItem:
    key: str
    text: str
    structured: bool
    # A small object of plain values reads as a table of rows (key, value), not JSON.
    rows: tuple[tuple[str, str], ...] = ()

    @property
    def lines(self) -> int:
        return self.text.count("\n") + 1

    @property
    def long(self) -> bool:
        """Long structured values start folded, so the question stays in view."""
        return self.structured and self.lines > 8


def _scalar_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and 0 < len(value) <= 20
        and all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value)
    )


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return _("yes") if value else _("no")
    if value is None:
        return "—"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _flat_object(value: Any) -> bool:
    """An object of up to 20 plain values (or short lists of them): shown as a table."""
    return (
        isinstance(value, dict)
        and 0 < len(value) <= 20
        and all(
            v is None or isinstance(v, str | int | float | bool) or _scalar_list(v)
            for v in value.values()
        )
    )


def value_rows(value: Any) -> list[tuple[str, str]]:
    """A flat JSON object (a run's input or result) as (key, value) rows for a table; []
    when it is not flat (then it is shown as indented JSON)."""
    if not _flat_object(value):
        return []
    return [(str(k), _plain(v)) for k, v in value.items()]


def context_items(context: Any) -> list[ContextItem]:
    """The context an agent gave with its question; a short list reads as ``v1, v2, v3``."""
    if not isinstance(context, dict):
        return [ContextItem("", as_text(context), True)] if context else []
    items = []
    for key, value in context.items():
        if _scalar_list(value):
            items.append(ContextItem(str(key), ", ".join(str(v) for v in value), False))
        elif _flat_object(value):
            rows = tuple((str(k), _plain(v)) for k, v in value.items())
            items.append(ContextItem(str(key), as_text(value), False, rows=rows))
        else:
            items.append(ContextItem(str(key), as_text(value), not isinstance(value, str)))
    return items


# --- Timeline -------------------------------------------------------------------------------

TIMELINE_FILTERS = {
    "failures": (
        gettext_lazy("Failures"),
        (EventType.ATTEMPT_FAILED, EventType.ATTEMPT_LOST, EventType.RUN_FAILED),
    ),
    "decisions": (
        gettext_lazy("Human decisions"),
        (
            EventType.RUN_INTERRUPTED,
            EventType.REQUEST_ANSWERED,
            EventType.APPROVAL_GIVEN,
            EventType.APPROVAL_OBJECTED,
            EventType.APPROVAL_CHANGED,
            EventType.REQUEST_CLOSED,
            EventType.RUN_RESUMED,
            EventType.RUN_CANCEL_REQUESTED,
            EventType.RUN_CANCELLED,
            EventType.RUN_RETRIED,
            EventType.RUN_CREATED,
            EventType.RUN_APPROVED_AT_START,
            EventType.RUN_PAUSE_REQUESTED,
            EventType.RUN_PAUSED,
            EventType.RUN_CONTINUED,
            EventType.AGENT_PAUSED,
            EventType.AGENT_UNPAUSED,
        ),
    ),
    "side_effects": (gettext_lazy("Side effects"), ("side_effect.",)),
}


def event_matches(event: RunEvent, name: str) -> bool:
    if name not in TIMELINE_FILTERS:
        return True
    return any(
        event.type == t or (t.endswith(".") and event.type.startswith(t))
        for t in TIMELINE_FILTERS[name][1]
    )


def event_tone(event: RunEvent) -> str:
    if event_matches(event, "failures"):
        return "bad"
    if event.type == "agent.log":
        level = event.payload.get("level") if isinstance(event.payload, dict) else ""
        return "bad" if level in ("error", "critical") else "log"
    if event_matches(event, "decisions"):
        return "human"
    if event.type.startswith("side_effect"):
        return "effect"
    return "neutral"


def _reason(p: dict[str, Any]) -> str:
    return str(p.get("reason") or "—")


def _closed(p: dict[str, Any]) -> str:
    reason = p.get("reason", "")
    return _("Question closed: %(reason)s") % {
        "reason": _(reason) if isinstance(reason, str) and reason else reason
    }


def _answered(p: dict[str, Any]) -> str:
    answer = p.get("answer")
    if p.get("kind") == RequestKind.AUTH_REQUIRED and isinstance(answer, dict):
        decision = answer.get("decision")
        if decision == "approve" and "edited" in answer:
            return _("Approved with edits: %(original)s → %(edited)s.") % {
                "original": _short(p.get("original")),
                "edited": _short(answer["edited"]),
            }
        if decision == "respond":
            return _("Sent back with a comment: %(comment)s") % {
                "comment": answer.get("comment", "")
            }
        return _("Approved.") if decision == "approve" else _("Denied.")
    return _("Answered.")


def _short(value: Any, limit: int = 300) -> str:
    """A JSON value on one line, cut to ``limit`` characters for a timeline sentence."""
    text = _compact(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _approval_given(p: dict[str, Any]) -> str:
    text = _("Approved by %(who)s: %(n)s of %(total)s approvals.") % {
        "who": p.get("by") or "—",
        "n": p.get("approvals", "?"),
        "total": p.get("required", "?"),
    }
    if p.get("edited") is not None:
        text += " " + _("With an edit: %(edited)s; earlier approvals no longer count.") % {
            "edited": _short(p.get("edited"))
        }
    return text


def _interrupted(p: dict[str, Any]) -> str:
    kind = _("an approval") if p.get("kind") == RequestKind.AUTH_REQUIRED else _("input")
    return _("Stopped to ask for %(kind)s at step %(step)s.") % {
        "kind": kind,
        "step": p.get("step_id") or "—",
    }


def _approved_at_start(p: dict[str, Any]) -> str:
    steps = p.get("steps")
    return _("Approved at start by %(who)s: %(steps)s.") % {
        "who": p.get("by") or "—",
        "steps": ", ".join(str(s) for s in steps) if isinstance(steps, list) else "",
    }


def _pause_requested(p: dict[str, Any]) -> str:
    if p.get("lease_live"):
        return _(
            "Pause requested: the running step finishes, then the run pauses. Reason: %(reason)s"
        ) % {"reason": _reason(p)}
    return _("Pause requested. Reason: %(reason)s") % {"reason": _reason(p)}


def _paused(p: dict[str, Any]) -> str:
    if p.get("breakpoint"):
        return _("Paused at the breakpoint before step %(step)s.") % {"step": p.get("breakpoint")}
    if p.get("step"):
        return _("Paused before step %(step)s, its checkpoint saved.") % {"step": p.get("step")}
    return _("Paused before its first step.")


def _agent_log(p: dict[str, Any]) -> str:
    step = p.get("step")
    message = str(p.get("message", ""))
    found = p.get("data")
    data: dict[str, Any] = found if isinstance(found, dict) else {}
    if data.get("event") == "approval_skipped":
        # Written by the SDK, not the agent: said in the reader's language.
        message = _(
            "Did not ask for approval of %(action)s on %(target)s: the planned change "
            "is empty (nothing would change)."
        ) % {"action": data.get("action", ""), "target": data.get("target", "")}
    return f"{step}: {message}" if step else message


_DECISION_WORDS = {
    "approve": gettext_lazy("approved"),
    "deny": gettext_lazy("denied"),
    "respond": gettext_lazy("sent back"),
}


def _approval_changed(p: dict[str, Any]) -> str:
    before = _DECISION_WORDS.get(str(p.get("from")), str(p.get("from", "")))
    after = _DECISION_WORDS.get(str(p.get("to")), str(p.get("to", "")))
    text = _("%(who)s changed their decision: %(before)s, now %(after)s.") % {
        "who": p.get("by") or "—",
        "before": before,
        "after": after,
    }
    if p.get("comment"):
        text += " " + _("Comment: %(comment)s") % {"comment": p["comment"]}
    return text


E = EventType
# The timeline's sentence for each event of the run store, from its payload. The ledger's
# events name themselves (ledger/events.py); an unknown type reads as itself.
SENTENCES: dict[str, Callable[[dict[str, Any]], str]] = {
    E.RUN_CREATED: lambda p: _("Run created for agent %(agent)s.") % {"agent": p.get("agent", "")},
    E.RUN_APPROVED_AT_START: _approved_at_start,
    E.ATTEMPT_CLAIMED: lambda p: (
        _("Attempt %(n)s started on a worker.") % {"n": p.get("number", "?")}
    ),
    E.CHECKPOINT_SAVED: lambda p: (
        _("Checkpoint #%(n)s saved; next step: %(step)s.")
        % {"n": p.get("number", "?"), "step": p.get("step", "")}
    ),
    E.RUN_INTERRUPTED: _interrupted,
    E.REQUEST_ANSWERED: _answered,
    E.APPROVAL_GIVEN: _approval_given,
    E.APPROVAL_OBJECTED: lambda p: (
        _("%(who)s objected (the request stays open): %(comment)s")
        % {"who": p.get("by") or "—", "comment": p.get("comment", "")}
    ),
    E.APPROVAL_CHANGED: _approval_changed,
    E.REQUEST_CLOSED: _closed,
    E.RUN_RESUMED: lambda p: _("Resumed in a new attempt."),
    E.RUN_CANCEL_REQUESTED: lambda p: (
        _("Cancel requested. Reason: %(reason)s") % {"reason": _reason(p)}
    ),
    E.RUN_CANCELLED: lambda p: _("Cancelled."),
    E.RUN_PAUSE_REQUESTED: _pause_requested,
    E.RUN_PAUSED: _paused,
    E.RUN_CONTINUED: lambda p: _("Continued in a new attempt."),
    E.RUN_HELD: lambda p: _(
        "Stopped at a step boundary: its agent is paused; it waits in the queue."
    ),
    E.AGENT_PAUSED: lambda p: (
        _("Agent %(agent)s paused. Reason: %(reason)s")
        % {"agent": p.get("agent", ""), "reason": _reason(p)}
    ),
    E.AGENT_UNPAUSED: lambda p: _("Agent %(agent)s unpaused.") % {"agent": p.get("agent", "")},
    E.RUN_RETRIED: lambda p: (
        _("Retry queued. Reason: %(reason)s") % {"reason": p.get("reason", "")}
    ),
    E.ATTEMPT_FAILED: lambda p: (
        _("Attempt failed (%(cls)s): %(type)s: %(message)s")
        % {"cls": p.get("class", ""), "type": p.get("type", ""), "message": p.get("message", "")}
    ),
    E.RUN_FAILED: lambda p: (
        _("Run failed (%(cls)s). %(detail)s")
        % {"cls": p.get("failure_class", ""), "detail": p.get("detail", "")}
    ),
    E.RUN_BACKING_OFF: lambda p: (
        _("Backing off %(delay)ss before the next attempt.")
        % {"delay": p.get("delay_seconds", "?")}
    ),
    E.RUN_QUEUED: lambda p: _("Backoff over; queued again."),
    E.RUN_REQUEUED: lambda p: _("Queued again after the worker lost its lease."),
    E.ATTEMPT_LOST: lambda p: (
        _("Worker %(worker)s lost its lease.") % {"worker": p.get("worker_id", "")}
    ),
    E.ATTEMPT_RELEASED: lambda p: (
        _("Worker let go of the attempt (%(reason)s).") % {"reason": p.get("reason", "")}
    ),
    E.RUN_SUCCEEDED: lambda p: _("Succeeded."),
    E.AGENT_LOG: _agent_log,
}


def _side_effect_sentence(event_type: str, p: dict[str, Any]) -> str:
    what = SideEffectEvent(event_type).label if event_type in SideEffectEvent.values else event_type
    extra = ""
    if event_type == SideEffectEvent.RECONCILED:
        extra = _(" as happened") if p.get("outcome") == "confirmed" else _(" as not happened")
    return _("%(what)s%(extra)s: %(tool)s → %(target)s") % {
        "what": what,
        "extra": extra,
        "tool": p.get("tool", ""),
        "target": p.get("target", ""),
    }


def describe_event(event: RunEvent) -> str:
    """The timeline's sentence for ``event``, in the reader's language."""
    p = event.payload if isinstance(event.payload, dict) else {}
    sentence = SENTENCES.get(event.type)
    if sentence is not None:
        return sentence(p)
    if event.type.startswith("side_effect."):
        return _side_effect_sentence(event.type, p)
    return event.type
