"""Websocket routes of the live dashboard (``config.asgi`` mounts them behind the origin
check and the session)."""

from __future__ import annotations

from django.urls import URLPattern, path

from live.consumers import (
    BadgeConsumer,
    InboxConsumer,
    RunConsumer,
    RunListConsumer,
    WorkersConsumer,
)

websocket_urlpatterns: list[URLPattern] = [
    path("ws/inbox/", InboxConsumer.as_asgi()),
    path("ws/runs/", RunListConsumer.as_asgi()),
    path("ws/runs/<str:run_id>/", RunConsumer.as_asgi()),
    path("ws/live/", BadgeConsumer.as_asgi()),
    path("ws/workers/", WorkersConsumer.as_asgi()),
]
