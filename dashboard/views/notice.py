"""What a browser notification says (docs/notifications.md): when the inbox badge grows
while a dashboard tab is in the background, ``static/holdpoint/app.js`` asks here for the
newest request this person may act on, and shows what is asked and the run's label, with
the link that opens its card."""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.http import require_GET

from dashboard.actions import HtmxHttpRequest, dashboard_view
from dashboard.present import request_title
from ledger.notifications import browser_line
from runs.selectors import inbox_for_user
from runs.services.notifications import DECIDE, person_may

# How many of the newest waiting requests are looked at for one this person may decide.
LOOK_AT = 20


@dashboard_view()
@require_GET
def inbox_newest(request: HtmxHttpRequest) -> HttpResponse:
    """The newest request waiting for this person that they may act on now (answer, or
    decide under its policy): ``{request_id, title, body, url}``, each text one short line
    of plain text (``browser_line``: agent text, untrusted); 204 when there is none."""
    newest = inbox_for_user(user=request.user).order_by("-created_at", "-id")[:LOOK_AT]
    for req in newest:
        if person_may(req, request.user) == DECIDE:
            return JsonResponse(
                {
                    "request_id": req.id,
                    "title": browser_line(request_title(req)),
                    "body": browser_line(req.run.label),
                    "url": reverse("run-detail", args=[req.run_id]) + f"#request-{req.id}",
                },
                headers={"Cache-Control": "no-store"},
            )
    return HttpResponse(status=204)
