"""WSGI entry point, for a WSGI server in front of the HTTP API and pages (bench.servers
measures gunicorn and granian with it). Websockets need ASGI (``config.asgi``), and so
do long polls that notice a client hanging up (``api.hangup``)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = get_wsgi_application()
