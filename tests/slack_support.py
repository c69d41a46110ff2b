"""The Slack stand-in (``runtime/slack_standin.py``) set up for a test: on a port of its
own, Holdpoint's settings pointed at it, and its signed payloads delivered to Holdpoint's
endpoint through Django's test client (the same handler and middleware as a server)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.test import Client

from runtime.slack_standin import SIGNING_SECRET, TOKEN, Workspace, serve

URL = "/api/slack/interactions"


def deliver(body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    response = Client().post(
        URL,
        body,
        content_type=headers["Content-Type"],
        HTTP_X_SLACK_REQUEST_TIMESTAMP=headers["X-Slack-Request-Timestamp"],
        HTTP_X_SLACK_SIGNATURE=headers["X-Slack-Signature"],
    )
    return response.status_code, response.content


@contextmanager
def slack_standin(settings: Any, channels: dict[str, str]) -> Iterator[Workspace]:
    space = Workspace(transport=deliver)
    server = serve(space)
    settings.HOLDPOINT_SLACK_BOT_TOKEN = TOKEN
    settings.HOLDPOINT_SLACK_SIGNING_SECRET = SIGNING_SECRET
    settings.HOLDPOINT_SLACK_API_URL = f"http://127.0.0.1:{server.server_address[1]}/api/"
    settings.HOLDPOINT_SLACK_CHANNELS = dict(channels)
    settings.HOLDPOINT_SLACK_LINK_BY_EMAIL = False
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {}
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    try:
        yield space
    finally:
        server.shutdown()
        server.server_close()
