"""Issue 30: the run drawn on a time axis (dashboard/timeline.py). The layout is a pure
function of the events, tested with events made here; the page, its escaping, its words
in Chinese and its live partial are tested on runs driven through the real services."""

from __future__ import annotations

import datetime as dt
import itertools
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.template.loader import render_to_string
from django.test import Client
from django.utils import timezone, translation

from dashboard.pages.runs import run_shared_context
from dashboard.timeline import (
    LANE_H,
    MERGE_PX,
    ChartAttempt,
    ChartEvent,
    ChartLayout,
    Item,
    chart_layout,
    run_chart,
)
from runs import services
from tests.dashboard.chart_scenario import effect, two_attempts_hold_pause_unknown
from tests.runs.factory import claim, epochs, start

T0 = dt.datetime(2026, 12, 5, 9, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


class Events:
    """Events of one run, numbered as the run store numbers them."""

    def __init__(self) -> None:
        self.rows: list[ChartEvent] = []

    def add(self, seconds: float, type: str, actor: str = "system", **payload: Any) -> int:
        seq = len(self.rows) + 1
        self.rows.append(ChartEvent(seq, type, actor, payload, at(seconds)))
        return seq


def only(items: list[Item], **attrs: Any) -> Item:
    found = [i for i in items if all(getattr(i, k) == v for k, v in attrs.items())]
    assert len(found) == 1, (attrs, found)
    return found[0]


def story() -> tuple[ChartLayout, dict[str, int]]:
    """Attempt 1 runs two steps, confirms an effect and asks a question; alice answers
    after 10 minutes; attempt 2 records an unknown effect, fails and backs off; attempt 3
    is paused by olivia and loses its lease after she continues it."""
    e = Events()
    seqs: dict[str, int] = {}
    e.add(0, "run.created", "user:olivia")
    seqs["claim1"] = e.add(1, "attempt.claimed", "worker:w1", attempt_id="a1", number=1)
    e.add(10, "checkpoint.saved", "worker:w1", attempt_id="a1", step="fetch")
    seqs["confirmed"] = e.add(30, "side_effect.confirmed", "worker:w1", status="confirmed")
    e.add(40, "checkpoint.saved", "worker:w1", attempt_id="a1", step="ask")
    seqs["ask"] = e.add(60, "run.interrupted", "worker:w1", request_id="r1", kind="input_required")
    e.add(660, "request.answered", "user:alice", request_id="r1")
    e.add(660, "run.resumed", "user:alice", attempt_id="a2", request_id="r1")
    seqs["claim2"] = e.add(670, "attempt.claimed", "worker:w2", attempt_id="a2", number=2)
    seqs["unknown"] = e.add(700, "side_effect.unknown", "worker:w2", status="unknown")
    seqs["failed"] = e.add(720, "attempt.failed", "worker:w2", attempt_id="a2", error="Boom")
    seqs["backoff"] = e.add(
        720,
        "run.backing_off",
        "system:retry",
        not_before=at(780).isoformat(),
        delay_seconds=60,
        failures_in_a_row=1,
    )
    e.add(780, "run.queued", "system:sweeper")
    e.add(790, "attempt.claimed", "worker:w3", attempt_id="a3", number=3)
    e.add(800, "run.pause_requested", "user:olivia", reason="wait for the window")
    seqs["paused"] = e.add(810, "run.paused", "worker:w3", request_id="p1", attempt_id="a3")
    e.add(1000, "run.continued", "user:olivia", request_id="p1", paused_seconds=190)
    seqs["lost"] = e.add(1100, "attempt.lost", "system:sweeper", attempt_id="a3")
    attempts = [
        ChartAttempt("a1", 1, "interrupted", at(1), at(60)),
        ChartAttempt("a2", 2, "failed", at(670), at(720), first_step="ask"),
        ChartAttempt("a3", 3, "lost", at(790), at(1100), first_step="ask"),
        ChartAttempt("a4", 4, "queued", None, None),
    ]
    layout = chart_layout(e.rows, attempts, end=at(1200))
    assert layout is not None
    return layout, seqs


def test_it_draws_one_lane_per_attempt_that_ran_with_its_steps_in_order() -> None:
    layout, seqs = story()
    assert [lane.number for lane in layout.lanes] == [1, 2, 3]  # attempt 4 never ran
    first = [s for s in layout.steps if s.lane == 0]
    assert [s.seq for s in first] == [seqs["claim1"], 3, 5]
    assert "fetch" in first[1].label and "ask" in first[2].label
    # Back to back, left to right, and the attempt's last step ends where it was interrupted.
    assert first[0].x < first[1].x < first[2].x
    assert first[1].x + first[1].w == pytest.approx(first[2].x)
    hold = only(layout.spans, kind="hold")
    assert first[2].x + first[2].w == pytest.approx(hold.x)
    # Each lane's items sit inside its band.
    for item in layout.steps + layout.spans + layout.marks:
        top = layout.lanes[item.lane].y
        assert top <= item.y and item.y + item.h <= top + LANE_H


def test_a_hold_point_is_a_gap_between_the_attempts_saying_who_answered_after_how_long() -> None:
    layout, seqs = story()
    hold = only(layout.spans, kind="hold")
    second = min((s for s in layout.steps if s.lane == 1), key=lambda s: s.x)
    assert hold.lane == 0 and hold.seq == seqs["ask"]
    assert hold.x + hold.w <= second.x  # answered before attempt 2 began
    assert "alice" in hold.label and "10m 00s" in hold.label
    assert "alice" in hold.text


def test_pauses_and_backoffs_are_spans_of_their_own_and_losses_are_breaks() -> None:
    layout, seqs = story()
    pause = only(layout.spans, kind="pause")
    backoff = only(layout.spans, kind="backoff")
    assert pause.lane == 2 and pause.seq == seqs["paused"]
    assert "olivia" in pause.label and "3m 10s" in pause.label and "window" in pause.label
    assert backoff.lane == 1 and backoff.seq == seqs["backoff"]
    assert "1m 00s" in backoff.label
    # The backoff lasts until not_before: 60 s at the chart's scale.
    total = (layout.end - layout.start).total_seconds()
    assert backoff.w == pytest.approx(60 / total * (layout.width - 92 - 14), abs=0.2)
    assert {(b.variant, b.lane, b.seq) for b in layout.breaks} == {
        ("failed", 1, seqs["failed"]),
        ("lease_lost", 2, seqs["lost"]),
    }


def test_side_effects_are_marks_in_the_lane_of_their_attempt_coloured_by_outcome() -> None:
    layout, seqs = story()
    assert {(m.variant, m.lane, m.seq) for m in layout.marks} == {
        ("confirmed", 0, seqs["confirmed"]),
        ("unknown", 1, seqs["unknown"]),
    }


def test_an_open_hold_runs_to_the_end_of_the_axis_and_says_it_waits() -> None:
    e = Events()
    e.add(0, "attempt.claimed", "worker:w1", attempt_id="a1")
    e.add(5, "run.interrupted", "worker:w1", request_id="r1", kind="auth_required")
    layout = chart_layout(e.rows, [ChartAttempt("a1", 1, "interrupted", at(0), at(5))], end=at(65))
    assert layout is not None
    hold = only(layout.spans, kind="hold")
    assert hold.x + hold.w == pytest.approx(layout.lanes[0].y * 0 + 960 - 14)
    assert "Waiting for an answer for 1m 00s" in hold.label
    assert "approval" in hold.label


def test_nothing_is_drawn_before_an_attempt_runs() -> None:
    e = Events()
    e.add(0, "run.created")
    assert chart_layout(e.rows, [ChartAttempt("a1", 1, "queued", None, None)], end=at(1)) is None


def big_run(events: int = 2000, attempts: int = 50) -> tuple[list[ChartEvent], list[ChartAttempt]]:
    """``events`` events over ``attempts`` attempts: checkpoints and side effects a second
    apart, every outcome, a backoff between attempts."""
    e = Events()
    rows: list[ChartAttempt] = []
    per = events // attempts
    t = 0.0
    for n in range(1, attempts + 1):
        attempt = f"a{n}"
        begin = t
        e.add(t, "attempt.claimed", "worker:w", attempt_id=attempt, number=n)
        for i in range(per - 3):
            t += 1
            if i % 2:
                e.add(t, "checkpoint.saved", "worker:w", attempt_id=attempt, step=f"s{i}")
            else:
                status = ("confirmed", "unknown", "failed", "compensated")[i % 4 // 2 + n % 3 % 2]
                e.add(t, f"side_effect.{status}", "worker:w", status=status)
        t += 1
        e.add(t, "attempt.failed", "worker:w", attempt_id=attempt)
        e.add(t, "run.backing_off", "system:retry", not_before=(at(t + 5)).isoformat())
        rows.append(ChartAttempt(attempt, n, "failed", at(begin), at(t)))
        t += 5
    return e.rows, rows


def test_two_thousand_events_draw_a_bounded_number_of_things_grouping_the_near_ones() -> None:
    events, attempts = big_run()
    assert len(events) == 2000
    layout = chart_layout(events, attempts, end=events[-1].created_at)
    assert layout is not None
    assert len(layout.lanes) == 50
    effects = sum(1 for e in events if e.type.startswith("side_effect."))
    # Every effect is in exactly one mark...
    assert sum(m.count for m in layout.marks) == effects
    # ...and marks of a lane are at least MERGE_PX apart: a bounded number however many.
    for lane in range(50):
        xs = sorted(m.x for m in layout.marks if m.lane == lane)
        assert all(b - a >= MERGE_PX for a, b in itertools.pairwise(xs))
    assert len(layout.marks) < effects / 3
    assert sum(s.count for s in layout.steps) == 50 + sum(
        1 for e in events if e.type == "checkpoint.saved"
    )
    assert layout.items < 800
    # A grouped mark shows the outcome to look at first.
    grouped = [m for m in layout.marks if m.count > 1]
    assert grouped and any(m.variant == "unknown" for m in grouped)
    assert all("side effects" in m.label for m in grouped)


pytestmark = pytest.mark.django_db


def test_the_run_page_draws_the_run_above_its_event_list(
    client: Client, operator: User, approver: User
) -> None:
    scene = two_attempts_hold_pause_unknown(answerer=approver, pauser=operator)
    client.force_login(operator)
    html = client.get(f"/runs/{scene.run.id}/").content.decode()
    chart = html.index(f'id="run-{scene.run.id}-chart"')
    assert chart < html.index(f'id="run-{scene.run.id}-events"')
    svg = html[chart : html.index("</svg>", chart)]
    assert svg.count('class="tl-lane ') == 2
    unknown = re.search(
        r'<a href="#run-\w+-event-(\d+)"[^>]*data-outcome="unknown"[^>]*data-lane="1"', svg
    )
    assert unknown is not None
    seq = int(unknown.group(1))
    assert scene.run.events.get(seq=seq).type == "side_effect.unknown"
    # The link goes to the event's row in the list.
    assert f'id="run-{scene.run.id}-event-{seq}"' in html
    hold = re.search(r'data-kind="hold"[^>]*aria-label="([^"]*)"', svg)
    assert hold is not None and "alice" in hold.group(1)
    assert 'data-kind="pause"' in svg
    assert svg.count("<title>") == svg.count('class="tl-item')


def test_agent_text_in_the_drawing_is_escaped_and_isolated(client: Client, operator: User) -> None:
    run = start()
    lease = claim()
    evil = '<script>alert("x")</script>\u202eevil'
    services.checkpoint_save(**epochs(lease), step=evil[:90], state={})
    services.checkpoint_save(**epochs(lease), step="next", state={})
    services.run_pause(run_id=run.id, reason=evil, user=operator)
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )
    client.force_login(operator)
    html = client.get(f"/runs/{run.id}/").content.decode()
    chart = html[html.index(f'id="run-{run.id}-chart"') : html.index(f'id="run-{run.id}-events"')]
    assert "<script>" not in chart
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in chart
    # Isolated: a right-to-left override in a step name cannot turn the sentence around.
    assert "\u2068&lt;script&gt;" in chart and "evil\u2069" in chart


def test_the_live_push_redraws_the_chart_out_of_band(operator: User, approver: User) -> None:
    scene = two_attempts_hold_pause_unknown(answerer=approver, pauser=operator)
    before = render_to_string(
        "dashboard/run_detail.html#run-live-shared", run_shared_context(scene.run, timeline=None)
    )
    assert f'<section id="run-{scene.run.id}-chart" class="run-section run-chart"' in before
    assert re.search(rf'id="run-{scene.run.id}-chart"[^>]*hx-swap-oob="true"', before)
    services.run_resume(
        run_id=scene.run.id,
        request_id=scene.run.pending_request_id,
        checkpoint_id=scene.run.latest_checkpoint_id,
        user=operator,
    )
    third = claim()
    effect(third, step="notify", tool="webhook", target="third-hook", status="failed")
    scene.run.refresh_from_db()
    after = render_to_string(
        "dashboard/run_detail.html#run-live-shared", run_shared_context(scene.run, timeline=None)
    )
    assert after.count('class="tl-lane ') == 3
    assert re.search(r'data-outcome="failed"[^>]*data-lane="2"', after)
    assert "Continued by" in after


def test_it_speaks_chinese(operator: User, approver: User) -> None:
    scene = two_attempts_hold_pause_unknown(answerer=approver, pauser=operator)
    with translation.override("zh-hans"):
        layout = run_chart(scene.run, now=timezone.now())
        html = render_to_string(
            "dashboard/run_detail.html#run-chart", {"run": scene.run, "chart": layout}
        )
    assert layout is not None
    assert "第 1 次尝试" in layout.lanes[0].label
    hold = only(layout.spans, kind="hold")
    assert "alice" in hold.label and "回答" in hold.label
    assert "图例" in html and "副作用结果未知" in html
