"""The Workers page: every worker, in process and remote, whether it is alive, what it
runs now and the leases it lost lately. What it shows is built in
``dashboard.pages.workers``; its socket (``live.consumers``) renders ``workers_context``
again when a worker's presence or any run changes."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from dashboard.actions import HtmxHttpRequest, dashboard_view
from dashboard.pages.workers import workers_context
from runs.selectors import VIEW_WORKERS, permission_denied_text


@dashboard_view(require_view=False)
@require_GET
def worker_list(request: HtmxHttpRequest) -> HttpResponse:
    if not request.user.has_perm(VIEW_WORKERS):
        raise PermissionDenied(permission_denied_text(VIEW_WORKERS))
    return render(request, "dashboard/workers.html", workers_context())
