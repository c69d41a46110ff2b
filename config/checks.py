"""System checks of Holdpoint's own settings (``manage.py check --deploy``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


@register(Tags.security, deploy=True)
def metrics_token_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``/metrics`` tells anyone who can reach it how many runs there are, in which state,
    and how the workers fare: in a deployment it needs a token."""
    if settings.HOLDPOINT_METRICS_TOKEN:
        return []
    if settings.HOLDPOINT_METRICS_PUBLIC:
        return [
            Warning(
                "/metrics is served to anyone: HOLDPOINT_METRICS_TOKEN is not set and "
                "HOLDPOINT_METRICS_PUBLIC is on.",
                hint="Set HOLDPOINT_METRICS_TOKEN to a long random string and give Prometheus "
                "it as a bearer token (or keep /metrics off the public network and say so "
                "with HOLDPOINT_METRICS_PUBLIC=true, accepting this warning).",
                id="holdpoint.W001",
            )
        ]
    return [
        Warning(
            "/metrics refuses every request: HOLDPOINT_METRICS_TOKEN is not set.",
            hint="Set HOLDPOINT_METRICS_TOKEN to a long random string and give Prometheus it "
            "as a bearer token.",
            id="holdpoint.W002",
        )
    ]
