"""Dashboard pages: the inbox, runs, the run page, starting a run, and their actions."""

from __future__ import annotations

from runs.views.inbox import inbox, inbox_count, request_answer
from runs.views.runs import run_cancel, run_detail, run_list, run_retry, run_timeline
from runs.views.start import run_start

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
