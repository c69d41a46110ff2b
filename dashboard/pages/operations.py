"""The operations page (``/operations/``): the figures of ``runs.stats`` in words, bars and
links. Every figure links to the list behind it: the runs list (``status``, ``agent``,
``failure_class``), the inbox's tabs, the Workers page. The bars are drawn with CSS from
heights computed here: no script, no chart library (the CSP allows neither inline)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy

from dashboard.present import span
from runs.states import FailureClass, RequestKind, RunStatus
from runs.stats import OUTCOMES, WINDOWS, operations_stats

WINDOW_LABELS = {"24h": gettext_lazy("Last 24 hours"), "7d": gettext_lazy("Last 7 days")}
# The runs list's status for a pending request of each kind: the runs waiting on it.
RUN_STATUS_OF_KIND = {
    RequestKind.INPUT_REQUIRED: RunStatus.INPUT_REQUIRED,
    RequestKind.AUTH_REQUIRED: RunStatus.AUTH_REQUIRED,
    RequestKind.PAUSE: RunStatus.PAUSED,
}


def runs_url(**params: str) -> str:
    query = urlencode({k: v for k, v in params.items() if v})
    return reverse("run-list") + (f"?{query}" if query else "")


def inbox_url(tab: str) -> str:
    return reverse("inbox") + "?" + urlencode({"tab": tab})


def _seconds(value: float | None) -> str:
    return "—" if value is None else span(value)


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f} %"


def _label(choices: Any, value: str) -> str:
    return str(choices(value).label) if value in choices.values else value


def operations_context(window: str) -> dict[str, Any]:
    stats = operations_stats(window=window)
    now = stats["now"]
    open_rows = [
        {
            **row,
            "kind_label": _label(RequestKind, row["kind"]),
            "url": runs_url(status=RUN_STATUS_OF_KIND.get(row["kind"], ""), agent=row["agent"]),
            "waiting": span((now - row["oldest_at"]).total_seconds()),
        }
        for row in stats["open_requests"]
    ]
    answer = {
        group: [
            {**row, "p50_text": _seconds(row["p50"]), "p95_text": _seconds(row["p95"])}
            for row in rows
        ]
        for group, rows in stats["answer_times"].items()
    }
    outcomes = stats["request_outcomes"]
    shares = [
        {
            "name": "expired",
            "label": gettext_lazy("Expired unanswered"),
            "count": outcomes["expired"],
            "of": outcomes["answered"] + outcomes["expired"],
            "share": _percent(outcomes["expired_share"]),
            "url": inbox_url("expired"),
        },
        {
            "name": "denied",
            "label": gettext_lazy("Approvals denied"),
            "count": outcomes["denied"],
            "of": outcomes["approvals_decided"],
            "share": _percent(outcomes["denied_share"]),
            "url": runs_url(status=RunStatus.FAILED, failure_class=FailureClass.DENIED),
        },
        {
            "name": "sent_back",
            "label": gettext_lazy("Approvals sent back"),
            "count": outcomes["sent_back"],
            "of": outcomes["approvals_decided"],
            "share": _percent(outcomes["sent_back_share"]),
            "url": inbox_url("answered"),
        },
    ]
    series = stats["runs_over_time"]
    tallest = max((b["total"] for b in series["buckets"]), default=0) or 1
    hourly = series["bucket"] == "hour"
    # The bars are an SVG drawn here (a viewBox 10 units per bucket, 100 high): sizes are
    # attributes, not inline styles, so the CSP needs nothing, and no script draws them.
    bars = []
    for index, bucket in enumerate(series["buckets"]):
        local = timezone.localtime(bucket["start"])
        top = 100.0
        segments = []
        for status in OUTCOMES:
            count = bucket["counts"].get(status, 0)
            if not count:
                continue
            height = round(100 * count / tallest, 2)
            top -= height
            segments.append(
                {
                    "status": status,
                    "label": _label(RunStatus, status),
                    "count": count,
                    "y": round(top, 2),
                    "height": height,
                }
            )
        bars.append(
            {
                "start": bucket["start"],
                "x": index * 10 + 1,
                "label": local.strftime("%H:00") if hourly else local.strftime("%m-%d"),
                "total": bucket["total"],
                "segments": segments,
            }
        )
    legend = [
        {
            "status": status,
            "label": _label(RunStatus, status),
            "count": series["totals"].get(status, 0),
            "url": runs_url(status=status),
        }
        for status in OUTCOMES
    ]
    failures = stats["failures"]
    by_class = [
        {
            **row,
            "label": _label(FailureClass, row["error_class"]),
            "url": runs_url(failure_class=row["error_class"]),
        }
        for row in failures["by_class"]
    ]
    fingerprints = [
        {
            **row,
            "label": _label(FailureClass, row["error_class"]),
            "url": runs_url(agent=row["agent"], failure_class=row["error_class"]),
        }
        for row in failures["top_fingerprints"]
    ]
    costs = [{**row, "url": runs_url(agent=row["agent"])} for row in stats["cost_by_agent"]]
    return {
        "stats": stats,
        "window": stats["window"],
        "windows": [
            (name, WINDOW_LABELS[name], reverse("operations") + "?" + urlencode({"window": name}))
            for name in WINDOWS
        ],
        "window_label": WINDOW_LABELS[stats["window"]],
        "open_requests": open_rows,
        "open_total": sum(row["count"] for row in open_rows),
        "answer_by_agent": answer["agent"],
        "answer_by_group": answer["group"],
        "answered_url": inbox_url("answered"),
        "shares": shares,
        "bars": bars,
        "chart_width": len(bars) * 10,
        "tallest": tallest if any(b["total"] for b in bars) else 0,
        "hourly": hourly,
        "legend": legend,
        "failures_by_class": by_class,
        "fingerprints": fingerprints,
        "lease_losses": stats["lease_losses"],
        "workers": stats["workers"],
        "workers_url": reverse("worker-list"),
        "costs": costs,
    }
