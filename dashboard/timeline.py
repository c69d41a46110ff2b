"""The run's timeline drawn on a time axis: one lane per attempt that ran, its steps as
bars, hold points, pauses and backoffs as spans, side effects as marks coloured (and
patterned) by outcome, lease losses, failures and cancels as breaks.

Two halves. ``chart_layout`` is a pure function from the run's events and attempts to a
layout model: every item with its place in SVG user units, its words and the event it
links to. ``run_chart`` reads what it needs from the database (one query for the
attempts, one for the events) and calls it. The run page renders the model as SVG in
``dashboard/run_detail.html#run-chart`` (auto-escaped: step names, tools, targets and
people's names come from agents and people, never ``mark_safe``); the live socket
renders the same partial after every push of the run's events.

Nearby things are grouped so a long run stays a bounded drawing: side effects closer than
``MERGE_PX`` in a lane become one mark with a count, and steps narrower than
``MIN_STEP_PX`` join their neighbours into one bar ("12 steps"). Why the server draws
it (and no charting library in the browser): docs/architecture.md, "The run's timeline".
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import get_language, gettext, ngettext

from dashboard.present import actor_name, clock, describe_event, span
from runs.models import Run

# The drawing's size in SVG user units (CSS pixels at 100 %). The box around it scrolls
# sideways on a narrow screen, so its width does not depend on the screen's.
WIDTH = 960
LABEL_W = 92  # the lanes' names, left of the plot
RIGHT_PAD = 14
PLOT_W = WIDTH - LABEL_W - RIGHT_PAD
AXIS_H = 26  # the time ticks, above the lanes
LANE_H = 30
BAR_H = 14
MARK_W = 7
MARK_H = 22
# Side effects closer than this in one lane are one mark with a count.
MERGE_PX = 8.0
# A step narrower than this joins its neighbours in one bar.
MIN_STEP_PX = 3.0
# A span (a hold, a pause, a backoff) is drawn at least this wide, so it can be seen,
# pointed at and focused.
MIN_SPAN_PX = 3.0
# A visible label goes inside a span only when the span is this wide.
LABEL_MIN_PX = 70.0
# The chart reads at most this many events (the newest): enough for any run a person
# reads as a picture, and a bound on the cost of drawing one.
EVENT_LIMIT = 5000
# Agents' log lines are not drawn: they are the event list's.
NOT_DRAWN = ("agent.log",)

EFFECT_EVENTS = frozenset(
    {
        "side_effect.confirmed",
        "side_effect.failed",
        "side_effect.unknown",
        "side_effect.reused",
        "side_effect.reconciled",
        "side_effect.compensated",
        "side_effect.compensation_failed",
        "side_effect.late_outcome",
    }
)
OUTCOMES = ("unknown", "compensation_failed", "failed", "compensated", "confirmed")
# A mark that groups several effects shows the one a person must look at first.
_OUTCOME_RANK = {name: rank for rank, name in enumerate(OUTCOMES)}
BREAK_EVENTS = {
    "attempt.lost": "lease_lost",
    "attempt.failed": "failed",
    "run.cancelled": "cancelled",
}


@dataclass(frozen=True)
class ChartEvent:
    """What the chart needs of a ``RunEvent``."""

    seq: int
    type: str
    actor: str
    payload: dict[str, Any]
    created_at: dt.datetime


@dataclass(frozen=True)
class ChartAttempt:
    """What the chart needs of an ``Attempt``; ``first_step``: the step its checkpoint
    (``resume_from``) names, where it began."""

    id: str
    number: int
    status: str
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    first_step: str = ""


@dataclass
class Lane:
    index: int
    number: int
    status: str
    y: float
    label: str

    @property
    def mid(self) -> str:
        return _n(self.y + LANE_H / 2)

    @property
    def text_y(self) -> str:
        return _n(self.y + LANE_H / 2 + 4)

    @property
    def top(self) -> str:
        return _n(self.y)


@dataclass
class Item:
    """One thing drawn: a span (``step``, ``hold``, ``pause``, ``backoff``), a side
    effect ``mark`` or a ``break``; ``seq`` is the event it links to, ``label`` what it
    says to a person (the accessible name, the tooltip), ``text`` a visible label."""

    kind: str
    lane: int
    x: float
    w: float
    seq: int
    label: str
    variant: str = ""
    count: int = 1
    text: str = ""
    y: float = 0.0
    h: float = 0.0

    @property
    def sx(self) -> str:
        return _n(self.x)

    @property
    def sw(self) -> str:
        return _n(self.w)

    @property
    def sy(self) -> str:
        return _n(self.y)

    @property
    def sh(self) -> str:
        return _n(self.h)

    @property
    def cx(self) -> str:
        return _n(self.x + self.w / 2)

    @property
    def bottom(self) -> str:
        return _n(self.y + self.h)

    @property
    def text_x(self) -> str:
        return _n(self.x + 4)

    @property
    def text_y(self) -> str:
        return _n(self.y + self.h / 2 + 3.5)

    @property
    def count_y(self) -> str:
        return _n(self.y - 2)

    @property
    def path(self) -> str:
        """A break's shape, so it reads without colour: a lease lost is a zigzag, a cancel
        a cross, a failure a bar with a cap."""
        x, y, h = self.x, self.y, self.h
        if self.variant == "cancelled":
            m = y + h / 2
            return (
                f"M{_n(x - 5)} {_n(m - 5)} L{_n(x + 5)} {_n(m + 5)} "
                f"M{_n(x + 5)} {_n(m - 5)} L{_n(x - 5)} {_n(m + 5)}"
            )
        if self.variant == "failed":
            return (
                f"M{_n(x)} {_n(y)} L{_n(x)} {_n(y + h)} M{_n(x - 4)} {_n(y)} L{_n(x + 4)} {_n(y)}"
            )
        q = h / 4
        return (
            f"M{_n(x)} {_n(y)} L{_n(x + 4)} {_n(y + q)} L{_n(x - 4)} {_n(y + 2 * q)} "
            f"L{_n(x + 4)} {_n(y + 3 * q)} L{_n(x)} {_n(y + h)}"
        )

    @property
    def hit_x(self) -> str:
        return _n(self.x - 6)


@dataclass
class Tick:
    x: float
    label: str

    @property
    def sx(self) -> str:
        return _n(self.x)


@dataclass
class ChartLayout:
    lanes: list[Lane]
    steps: list[Item]
    spans: list[Item]
    marks: list[Item]
    breaks: list[Item]
    ticks: list[Tick]
    start: dt.datetime
    end: dt.datetime
    width: int = WIDTH
    height: int = 0
    lane_h: int = LANE_H
    truncated: bool = False
    summary: str = ""

    @property
    def items(self) -> int:
        return len(self.steps) + len(self.spans) + len(self.marks) + len(self.breaks)

    @property
    def axis_bottom(self) -> str:
        return _n(self.height - 4)


# Sentences already translated, per language: a long run's chart says the same few
# sentences hundreds of times, and each ``gettext`` (with its look-up of the active
# language) costs more than the rest of an item. ``chart_layout`` picks its language's
# dict once, for its thread.
_WORDS: dict[str | None, dict[str, str]] = {}
_drawing = threading.local()


def _(message: str) -> str:
    words: dict[str, str] | None = getattr(_drawing, "words", None)
    if words is None:
        return gettext(message)
    found = words.get(message)
    if found is None:
        found = words[message] = gettext(message)
    return found


def _n(value: float) -> str:
    """A coordinate as SVG reads it: never localized (no decimal comma), one decimal."""
    return f"{value:.1f}".removesuffix(".0")


def _payload(event: ChartEvent) -> dict[str, Any]:
    return event.payload if isinstance(event.payload, dict) else {}


def _text(value: Any, limit: int = 80) -> str:
    """Words from an agent or a person, shortened and isolated (U+2068 … U+2069, the text
    form of ``<bdi>``: it works in attributes and SVG text too), so right-to-left text or
    a stray direction mark in a step name cannot reorder the sentence around it."""
    text = str(value or "")
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return f"\u2068{text}\u2069" if text else ""


def _outcome(event: ChartEvent) -> str:
    status = str(_payload(event).get("status") or "")
    if status in _OUTCOME_RANK:
        return status
    if event.type == "side_effect.reused":
        return "confirmed"
    what = event.type.removeprefix("side_effect.")
    return what if what in _OUTCOME_RANK else "unknown"


def _at(when: dt.datetime) -> str:
    return clock(when)


def _took(seconds: float) -> str:
    """A duration: ``span``'s words, with tenths under ten seconds (a quick answer is not
    "0s")."""
    if seconds < 10:
        return _("%(s)ss") % {"s": f"{max(seconds, 0):.1f}"}
    return span(seconds)


def chart_layout(
    events: Sequence[ChartEvent],
    attempts: Sequence[ChartAttempt],
    *,
    end: dt.datetime,
    truncated: bool = False,
) -> ChartLayout | None:
    """The layout of a run drawn from its ``events`` (oldest first) and ``attempts``;
    ``end``: where the axis ends (now for a run that goes on, its last event for one that
    finished). None when no attempt has run yet: there is nothing on the axis."""
    _drawing.words = _WORDS.setdefault(get_language(), {})
    try:
        return _layout(events, attempts, end=end, truncated=truncated)
    finally:
        _drawing.words = None


def _layout(
    events: Sequence[ChartEvent],
    attempts: Sequence[ChartAttempt],
    *,
    end: dt.datetime,
    truncated: bool,
) -> ChartLayout | None:
    ran = sorted((a for a in attempts if a.started_at is not None), key=lambda a: a.number)
    if not ran:
        return None
    starts = [a.started_at for a in ran if a.started_at is not None]
    start = min([*(e.created_at for e in events[:1]), *starts])
    last = max([*(e.created_at for e in events[-1:]), *(a.ended_at for a in ran if a.ended_at)])
    end = max(end, last)
    total = (end - start).total_seconds()
    if total <= 0:
        total = 1.0

    def x_of(when: dt.datetime) -> float:
        offset = (when - start).total_seconds()
        return LABEL_W + max(0.0, min(1.0, offset / total)) * PLOT_W

    lane_of = {a.id: i for i, a in enumerate(ran)}
    lanes = [
        Lane(
            index=i,
            number=a.number,
            status=a.status,
            y=AXIS_H + i * LANE_H,
            label=_("Attempt %(n)s") % {"n": a.number},
        )
        for i, a in enumerate(ran)
    ]

    # Which attempt each event belongs to: the one it names, else the one claimed last
    # before it (a side effect's outcome, a hold point, a pause).
    claims: dict[str, int] = {}
    checkpoints: dict[str, list[ChartEvent]] = {a.id: [] for a in ran}
    spans: list[Item] = []
    effects: list[tuple[int, float, ChartEvent]] = []
    breaks: list[Item] = []
    open_holds: dict[str, tuple[ChartEvent, int]] = {}
    open_pauses: dict[str, tuple[ChartEvent, int, ChartEvent | None]] = {}
    pause_asked: ChartEvent | None = None
    current = 0

    def lane_for(event: ChartEvent) -> int:
        attempt_id = _payload(event).get("attempt_id")
        if isinstance(attempt_id, str) and attempt_id in lane_of:
            return lane_of[attempt_id]
        return current

    def span_item(kind: str, lane: int, since: dt.datetime, until: dt.datetime, **kw: Any) -> Item:
        x0, x1 = x_of(since), x_of(until)
        return Item(kind=kind, lane=lane, x=x0, w=max(x1 - x0, MIN_SPAN_PX), **kw)

    def close_hold(request_id: str, event: ChartEvent, answered: bool) -> None:
        asked, lane = open_holds.pop(request_id)
        waited = _took((event.created_at - asked.created_at).total_seconds())
        who = _text(actor_name(event.actor), 40)
        if answered:
            label = _("Hold point: %(prompt)s. Answered by %(who)s after %(after)s.") % {
                "prompt": _hold_prompt(asked),
                "who": who,
                "after": waited,
            }
            text = _("%(who)s after %(after)s") % {"who": who, "after": waited}
        else:
            label = _("Hold point: %(prompt)s. Closed after %(after)s: %(why)s.") % {
                "prompt": _hold_prompt(asked),
                "after": waited,
                "why": _text(_payload(event).get("reason") or _payload(event).get("status")),
            }
            text = _("closed after %(after)s") % {"after": waited}
        spans.append(
            span_item(
                "hold",
                lane,
                asked.created_at,
                event.created_at,
                seq=asked.seq,
                label=label,
                text=text,
                variant=str(_payload(asked).get("kind") or ""),
            )
        )

    def close_pause(request_id: str, event: ChartEvent | None, until: dt.datetime) -> None:
        paused, lane, asked = open_pauses.pop(request_id)
        who = _text(actor_name(asked.actor if asked is not None else paused.actor), 40)
        reason = _text(_payload(asked or paused).get("reason"))
        lasted = _took((until - paused.created_at).total_seconds())
        if event is None:
            label = _("Paused by %(who)s for %(for)s so far: %(reason)s") % {
                "who": who,
                "for": lasted,
                "reason": reason,
            }
        else:
            label = _("Paused by %(who)s for %(for)s: %(reason)s. Continued by %(by)s.") % {
                "who": who,
                "for": lasted,
                "reason": reason,
                "by": _text(actor_name(event.actor), 40),
            }
        spans.append(
            span_item(
                "pause",
                lane,
                paused.created_at,
                until,
                seq=paused.seq,
                label=label,
                text=_("Paused %(for)s") % {"for": lasted},
            )
        )

    for event in events:
        p = _payload(event)
        kind = event.type
        if kind == "attempt.claimed":
            attempt_id = p.get("attempt_id")
            if isinstance(attempt_id, str) and attempt_id in lane_of:
                current = lane_of[attempt_id]
                claims.setdefault(attempt_id, event.seq)
        elif kind == "checkpoint.saved":
            attempt_id = p.get("attempt_id")
            if isinstance(attempt_id, str) and attempt_id in checkpoints:
                checkpoints[attempt_id].append(event)
        elif kind == "run.interrupted":
            open_holds[str(p.get("request_id"))] = (event, lane_for(event))
        elif kind in ("request.answered", "request.closed"):
            request_id = str(p.get("request_id"))
            if request_id in open_holds:
                close_hold(request_id, event, answered=kind == "request.answered")
            elif request_id in open_pauses:
                close_pause(request_id, event, event.created_at)
        elif kind == "run.pause_requested":
            pause_asked = event
        elif kind == "run.paused":
            open_pauses[str(p.get("request_id"))] = (event, lane_for(event), pause_asked)
            pause_asked = None
        elif kind == "run.continued":
            request_id = str(p.get("request_id"))
            if request_id in open_pauses:
                close_pause(request_id, event, event.created_at)
        elif kind == "run.backing_off":
            until = parse_datetime(str(p.get("not_before") or "")) or event.created_at
            until = min(max(until, event.created_at), end)
            delay = _took(float(p.get("delay_seconds") or 0))
            spans.append(
                span_item(
                    "backoff",
                    lane_for(event),
                    event.created_at,
                    until,
                    seq=event.seq,
                    label=_("Backing off %(delay)s after %(n)s failures in a row")
                    % {
                        "delay": delay,
                        "n": p.get("failures_in_a_row") or 1,
                    },
                    text=_("Backoff %(delay)s") % {"delay": delay},
                )
            )
        elif kind in EFFECT_EVENTS:
            effects.append((lane_for(event), x_of(event.created_at), event))
        if kind in BREAK_EVENTS:
            lane = lane_for(event)
            breaks.append(
                Item(
                    kind="break",
                    variant=BREAK_EVENTS[kind],
                    lane=lane,
                    x=x_of(event.created_at),
                    w=0,
                    seq=event.seq,
                    label=_event_label(event),
                )
            )

    # What is still open goes on to the end of the axis.
    for request_id, (asked, lane) in list(open_holds.items()):
        waited = _took((end - asked.created_at).total_seconds())
        spans.append(
            span_item(
                "hold",
                lane,
                asked.created_at,
                end,
                seq=asked.seq,
                label=_("Hold point: %(prompt)s. Waiting for an answer for %(for)s.")
                % {"prompt": _hold_prompt(asked), "for": waited},
                text=_("waiting %(for)s") % {"for": waited},
                variant=str(_payload(asked).get("kind") or ""),
            )
        )
        del open_holds[request_id]
    for request_id in list(open_pauses):
        close_pause(request_id, None, end)

    steps: list[Item] = []
    for attempt in ran:
        steps += _steps(
            attempt,
            lane_of[attempt.id],
            checkpoints[attempt.id],
            claims.get(attempt.id, 0),
            x_of,
            end,
        )

    marks = _group_effects(effects)
    for item in steps:
        item.y = AXIS_H + item.lane * LANE_H + (LANE_H - BAR_H) / 2
        item.h = BAR_H
    for item in spans:
        item.y = AXIS_H + item.lane * LANE_H + (LANE_H - BAR_H) / 2
        item.h = BAR_H
        if item.w < LABEL_MIN_PX:
            item.text = ""
    for item in marks:
        item.x -= MARK_W / 2
        item.w = MARK_W
        item.y = AXIS_H + item.lane * LANE_H + (LANE_H - MARK_H) / 2
        item.h = MARK_H
    for item in breaks:
        item.y = AXIS_H + item.lane * LANE_H + 2
        item.h = LANE_H - 4
    return ChartLayout(
        lanes=lanes,
        steps=steps,
        spans=spans,
        marks=marks,
        breaks=breaks,
        ticks=_ticks(total, x_of, start),
        start=start,
        end=end,
        height=AXIS_H + len(lanes) * LANE_H + 6,
        truncated=truncated,
        summary=_summary(ran, spans, len(effects), total),
    )


def _event_label(event: ChartEvent) -> str:
    """The event's sentence (the event list's), with its time."""
    sentence = describe_event(cast(Any, event))
    return f"#{event.seq} · {_at(event.created_at)} · {sentence}"


def _hold_prompt(event: ChartEvent) -> str:
    p = _payload(event)
    kind = p.get("kind")
    what = _("approval") if kind == "auth_required" else _("question")
    prompt = _text(p.get("prompt") or p.get("reason") or p.get("step_id"), 60)
    return f"{what} {prompt}".strip() if prompt else what


def _steps(
    attempt: ChartAttempt,
    lane: int,
    checkpoints: list[ChartEvent],
    claim_seq: int,
    x_of: Any,
    end: dt.datetime,
) -> list[Item]:
    """The attempt's steps as bars: from its start to its first checkpoint the step it
    resumed at, then from each checkpoint the step that checkpoint names, to the next one
    or the attempt's end. Steps too narrow to see join their neighbours."""
    assert attempt.started_at is not None
    stop = attempt.ended_at or end
    bounds: list[tuple[dt.datetime, str, int]] = [
        (attempt.started_at, attempt.first_step, claim_seq)
    ]
    for cp in checkpoints:
        if attempt.started_at <= cp.created_at <= stop:
            bounds.append((cp.created_at, str(_payload(cp).get("step") or ""), cp.seq))
    items: list[Item] = []
    group: list[tuple[dt.datetime, dt.datetime, str, int]] = []

    def flush() -> None:
        if not group:
            return
        since, until = group[0][0], group[-1][1]
        x0, x1 = x_of(since), x_of(until)
        took = _took((until - since).total_seconds())
        names = [name for _s, _u, name, _q in group]
        if len(group) == 1:
            name = names[0] or _("(start)")
            label = _("Step %(name)s, attempt %(n)s: from %(at)s, %(took)s") % {
                "name": _text(name, 60),
                "n": attempt.number,
                "at": _at(since),
                "took": took,
            }
        else:
            label = ngettext(
                "%(count)s step, attempt %(n)s (%(first)s … %(last)s): from %(at)s, %(took)s",
                "%(count)s steps, attempt %(n)s (%(first)s … %(last)s): from %(at)s, %(took)s",
                len(group),
            ) % {
                "count": len(group),
                "n": attempt.number,
                "first": _text(names[0] or _("(start)"), 40),
                "last": _text(names[-1], 40),
                "at": _at(since),
                "took": took,
            }
        items.append(
            Item(
                kind="step",
                lane=lane,
                x=x0,
                w=max(x1 - x0, 1.0),
                seq=group[0][3],
                label=label,
                count=len(group),
                variant="ab"[len(items) % 2],
                text=_text(names[0], 24) if len(group) == 1 else "",
            )
        )
        group.clear()

    for i, (since, name, seq) in enumerate(bounds):
        until = bounds[i + 1][0] if i + 1 < len(bounds) else stop
        group.append((since, until, name, seq))
        if x_of(group[-1][1]) - x_of(group[0][0]) >= MIN_STEP_PX:
            flush()
    flush()
    return items


def _group_effects(effects: list[tuple[int, float, ChartEvent]]) -> list[Item]:
    """One mark per side-effect outcome, or per group of those closer than ``MERGE_PX``
    in a lane: the group shows the outcome to look at first, and how many it holds."""
    marks: list[Item] = []
    by_lane: dict[int, list[tuple[float, ChartEvent]]] = {}
    for lane, x, event in effects:
        by_lane.setdefault(lane, []).append((x, event))
    for lane, rows in sorted(by_lane.items()):
        rows.sort(key=lambda r: (r[0], r[1].seq))
        group: list[tuple[float, ChartEvent]] = []
        for row in [*rows, None]:
            if row is not None and (not group or row[0] - group[0][0] < MERGE_PX):
                group.append(row)
                continue
            if group:
                marks.append(_effect_mark(lane, group))
            group = [row] if row is not None else []
    return marks


def _effect_mark(lane: int, group: list[tuple[float, ChartEvent]]) -> Item:
    outcomes = Counter(_outcome(event) for _x, event in group)
    worst = min(outcomes, key=lambda name: _OUTCOME_RANK[name])
    first = min(group, key=lambda r: r[1].seq)[1]
    first_of_worst = min((e for _x, e in group if _outcome(e) == worst), key=lambda e: e.seq)
    if len(group) == 1:
        label = _event_label(first)
    else:
        parts = ", ".join(
            f"{outcomes[name]} {outcome_words()[name]}" for name in OUTCOMES if outcomes[name]
        )
        label = _("%(count)s side effects from %(at)s: %(parts)s") % {
            "count": len(group),
            "at": _at(first.created_at),
            "parts": parts,
        }
    # At the group's first effect: the next group begins at least MERGE_PX further on.
    x = group[0][0]
    return Item(
        kind="mark",
        variant=worst,
        lane=lane,
        x=x,
        w=MARK_W,
        seq=first_of_worst.seq,
        label=label,
        count=len(group),
    )


def outcome_words() -> dict[str, str]:
    return {
        "confirmed": _("happened"),
        "unknown": _("unknown"),
        "failed": _("did not happen"),
        "compensated": _("compensated"),
        "compensation_failed": _("compensation failed"),
    }


_TICK_STEPS = (
    0.1,
    0.2,
    0.5,
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    172800,
    604800,
)


def _ticks(total: float, x_of: Any, start: dt.datetime) -> list[Tick]:
    """Up to eight round offsets from the run's first event."""
    step = next((s for s in _TICK_STEPS if total / s <= 8), _TICK_STEPS[-1])
    ticks = []
    n = 0
    while n * step <= total + 1e-9 and n <= 8:
        offset = n * step
        label = _took(offset) if step < 1 and offset else span(offset)
        ticks.append(Tick(x=x_of(start + dt.timedelta(seconds=offset)), label=label))
        n += 1
    return ticks


def _summary(ran: list[ChartAttempt], spans: list[Item], effects: int, total: float) -> str:
    holds = sum(1 for s in spans if s.kind == "hold")
    pauses = sum(1 for s in spans if s.kind == "pause")
    parts = [
        ngettext("%(n)s attempt", "%(n)s attempts", len(ran)) % {"n": len(ran)},
        ngettext("%(n)s hold point", "%(n)s hold points", holds) % {"n": holds},
        ngettext("%(n)s pause", "%(n)s pauses", pauses) % {"n": pauses},
        ngettext("%(n)s side-effect outcome", "%(n)s side-effect outcomes", effects)
        % {"n": effects},
    ]
    return _("Over %(total)s: %(parts)s.") % {"total": span(total), "parts": ", ".join(parts)}


def run_chart(run: Run, *, now: dt.datetime | None = None) -> ChartLayout | None:
    """The run's chart, read from the database: its attempts and its newest
    ``EVENT_LIMIT`` events (not agents' log lines). A run that goes on is drawn up to
    now; a finished one up to its last event."""
    attempts = [
        ChartAttempt(
            id=a_id,
            number=number,
            status=status,
            started_at=started,
            ended_at=ended,
            first_step=first_step or "",
        )
        for a_id, number, status, started, ended, first_step in run.attempts.order_by(
            "number"
        ).values_list("id", "number", "status", "started_at", "ended_at", "resume_from__step")
    ]
    if not any(a.started_at for a in attempts):
        return None
    rows = list(
        run.events.exclude(type__in=NOT_DRAWN)
        .order_by("-seq")
        .values_list("seq", "type", "actor", "payload", "created_at")[: EVENT_LIMIT + 1]
    )
    truncated = len(rows) > EVENT_LIMIT
    events = [ChartEvent(*row) for row in reversed(rows[:EVENT_LIMIT])]
    end = run.finished_at if run.finished_at is not None else (now or timezone.now())
    return chart_layout(events, attempts, end=end, truncated=truncated)
