"""Dashboard pages: the inbox, runs, the run page, starting a run, and their actions."""

from __future__ import annotations

from dashboard.views.inbox import inbox, inbox_count, request_answer
from dashboard.views.runs import run_cancel, run_detail, run_list, run_retry, run_timeline
from dashboard.views.start import run_start

__all__ = [
    "inbox",
    "inbox_count",
    "request_answer",
    "run_cancel",
    "run_detail",
    "run_list",
    "run_retry",
    "run_start",
    "run_timeline",
]
