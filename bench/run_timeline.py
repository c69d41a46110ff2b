"""Drawing a long run's timeline (issue 30): the run page's chart of a run with 2,000
events over 50 attempts, read, laid out and rendered as SVG on the server.

What is timed is what a page view and every live push of the run pay for the chart:
``dashboard.timeline.run_chart`` (two queries: the attempts and the newest events) and
rendering ``dashboard/run_detail.html#run-chart``. Baseline in the same run, on the same
run: the page's event list as it is drawn today (``timeline_rows`` and its partial
``#run-timeline``: the newest 500 events), timed alternately with the chart so the
machine's load falls on both alike. Target: the chart's p95 < 200 ms.

The run is written straight into the tables (its attempts and events as the services
write them: claims, checkpoints, side-effect outcomes, failures and backoffs, a hold
point and a pause), so the script measures drawing, not writing.

    python -m bench.run_timeline [--events 2000] [--attempts 50] [--samples 30] [--keep]
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from typing import Any

from bench.common import (
    Summary,
    declare_bench_agent,
    ms,
    save_result,
    scratch_database,
    setup_django,
    table,
    verdict,
)

TARGET_MS = 200.0


def make_run(events: int, attempts: int) -> Any:
    from django.utils import timezone

    from runs import services
    from runs.models import Attempt, Run, RunEvent

    agent = declare_bench_agent()
    run = services.run_start(agent=agent, input={})
    Attempt.objects.filter(run=run).delete()
    start = timezone.now() - dt.timedelta(hours=6)
    per = events // attempts
    rows: list[RunEvent] = []
    attempt_rows: list[Attempt] = []
    t = start
    seq = 0

    def add(event_type: str, actor: str, **payload: Any) -> None:
        nonlocal seq
        seq += 1
        rows.append(
            RunEvent(run=run, seq=seq, type=event_type, actor=actor, payload=payload, created_at=t)
        )

    outcomes = ("confirmed", "confirmed", "confirmed", "unknown", "failed", "compensated")
    for n in range(1, attempts + 1):
        attempt_id = f"att_bench{n:04d}"
        began = t
        add("attempt.claimed", "worker:bench", attempt_id=attempt_id, number=n)
        for i in range(per - 3):
            t += dt.timedelta(seconds=3)
            if i % 2:
                add("checkpoint.saved", "worker:bench", attempt_id=attempt_id, step=f"step-{i}")
            else:
                status = outcomes[(i // 2 + n) % len(outcomes)]
                add(
                    f"side_effect.{status}",
                    "worker:bench",
                    operation_id=f"op_{n}_{i}",
                    step_id=f"step-{i}",
                    tool="webhook",
                    target="deploy-hook",
                    status=status,
                )
        t += dt.timedelta(seconds=3)
        if n % 10 == 5:
            add("run.interrupted", "worker:bench", request_id=f"req_{n}", kind="input_required")
            t += dt.timedelta(minutes=4)
            add("request.answered", "user:alice", request_id=f"req_{n}")
        else:
            add("attempt.failed", "worker:bench", attempt_id=attempt_id, type="Timeout")
            not_before = t + dt.timedelta(seconds=20)
            add("run.backing_off", "system:retry", not_before=not_before.isoformat())
        attempt_rows.append(
            Attempt(
                id=attempt_id,
                run=run,
                number=n,
                status="failed" if n < attempts else "running",
                reason="retry",
                started_at=began,
                ended_at=t if n < attempts else None,
            )
        )
        t += dt.timedelta(seconds=25)
    Attempt.objects.bulk_create(attempt_rows)
    RunEvent.objects.filter(run=run).delete()
    times = [row.created_at for row in rows]
    RunEvent.objects.bulk_create(rows)
    # created_at is auto_now_add: bulk_create stamped every row with now; put the run's
    # own times back.
    for row, when in zip(rows, times, strict=True):
        row.created_at = when
    RunEvent.objects.bulk_update(rows, ["created_at"], batch_size=500)
    Run.objects.filter(pk=run.pk).update(
        last_event_seq=seq, status="running", current_attempt_id=attempt_rows[-1].id
    )
    return Run.objects.get(pk=run.pk)


def draw_chart(run: Any) -> tuple[str, Any]:
    from django.template.loader import render_to_string

    from dashboard.timeline import run_chart

    chart = run_chart(run)
    return render_to_string(
        "dashboard/run_detail.html#run-chart", {"run": run, "chart": chart}
    ), chart


def draw_event_list(run: Any) -> str:
    from django.template.loader import render_to_string

    from dashboard.pages.runs import timeline_rows
    from dashboard.present import TIMELINE_FILTERS

    context = {
        "run": run,
        "timeline": timeline_rows(run, ""),
        "timeline_filter": "",
        "timeline_filters": [(k, v[0]) for k, v in TIMELINE_FILTERS.items()],
    }
    return render_to_string("dashboard/run_detail.html#run-timeline", context)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--attempts", type=int, default=50)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--keep", action="store_true")
    opts = parser.parse_args()
    with scratch_database("run_timeline", keep=opts.keep):
        setup_django()
        run = make_run(opts.events, opts.attempts)
        html, chart = draw_chart(run)  # warm: templates compiled, catalogs loaded
        draw_event_list(run)
        elements = html.count("<a ") + html.count("<rect") + html.count("<path")
        chart_s: list[float] = []
        list_s: list[float] = []
        for _ in range(opts.samples):
            t0 = time.perf_counter()
            draw_chart(run)
            chart_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            draw_event_list(run)
            list_s.append(time.perf_counter() - t0)
        chart_ms, list_ms = Summary.of(ms(chart_s)), Summary.of(ms(list_s))
        met = chart_ms.p95 < TARGET_MS
        print(
            f"A run of {run.last_event_seq:,} events over {opts.attempts} attempts; "
            f"the chart draws {chart.items} items ({elements} SVG elements, "
            f"{len(html) / 1024:.0f} KiB), {opts.samples} samples each, alternating."
        )
        print(
            table(
                ["drawing", "p50 ms", "p95 ms", "max ms", "x event list (p50)"],
                [
                    [
                        "the chart (read + layout + SVG)",
                        chart_ms.p50,
                        chart_ms.p95,
                        chart_ms.max,
                        chart_ms.p50 / list_ms.p50,
                    ],
                    [
                        "baseline: the event list (500 rows)",
                        list_ms.p50,
                        list_ms.p95,
                        list_ms.max,
                        1.0,
                    ],
                ],
            )
        )
        print(
            f"Target: the chart's p95 < {TARGET_MS:.0f} ms: {verdict(met)} ({chart_ms.p95:.1f} ms)"
        )
        save_result(
            "run_timeline",
            {
                "events": run.last_event_seq,
                "attempts": opts.attempts,
                "samples": opts.samples,
                "items": chart.items,
                "svg_elements": elements,
                "chart_ms": chart_ms.as_dict(),
                "event_list_ms": list_ms.as_dict(),
                "x_event_list_p50": round(chart_ms.p50 / list_ms.p50, 2),
                "target_p95_ms": TARGET_MS,
                "met": met,
            },
        )


if __name__ == "__main__":
    main()
