"""The operations page: the state of the whole system now and over the last 24 hours or
7 days, for operators (``runs.view_worker``: operators and admins). What it shows is built
in ``dashboard.pages.operations`` from ``runs.stats``; ``GET /api/stats/operations``
serves the same figures as JSON."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET

from dashboard.actions import HtmxHttpRequest, dashboard_view
from dashboard.pages.operations import operations_context
from runs.selectors import VIEW_OPERATIONS
from runs.stats import DEFAULT_WINDOW, WINDOWS


@dashboard_view(require_view=False)
@require_GET
def operations(request: HtmxHttpRequest) -> HttpResponse:
    if not request.user.has_perm(VIEW_OPERATIONS):
        raise PermissionDenied(_("Only operators and admins can see the operations page."))
    # An unknown window shows the default one: a page link, not an API to refuse.
    window = request.GET.get("window", DEFAULT_WINDOW)
    return render(
        request,
        "dashboard/operations.html",
        operations_context(window if window in WINDOWS else DEFAULT_WINDOW),
    )
