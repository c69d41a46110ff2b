"""ASGI entry point: HTTP through Django, websockets through Channels.

A websocket needs our own origin (scheme, host and port: ``config.websocket_origin``;
another site's page, another port or a sibling subdomain cannot open one with the user's
cookies) and is given the session's user; each consumer checks the
user's permissions itself, at connect and at every render (``live.consumers``).

An HTTP body over ``HOLDPOINT_MAX_BODY_BYTES`` is refused before it is read
(``config.body_limit``). A long poll whose client hung up stops waiting and claims
nothing (``api.hangup``). Past what the process can serve a request is answered 503
``overloaded`` with Retry-After before it takes a thread (``api.admission``).
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# Django must be set up before anything imports models.
django.setup(set_prefix=False)

from config.handler import PooledASGIHandler  # noqa: E402

# Django's handler, each request served in one thread of a reused pool (config/handler.py).
django_asgi_app = PooledASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from api.admission import AdmissionMiddleware  # noqa: E402
from api.hangup import HangupMiddleware  # noqa: E402
from config.body_limit import BodyLimitMiddleware, install_daphne_guard  # noqa: E402
from config.websocket_origin import SameOriginValidator  # noqa: E402
from live.routing import websocket_urlpatterns  # noqa: E402

# Bodies over HOLDPOINT_MAX_BODY_BYTES are refused before they are read: in daphne, which
# would otherwise read and queue them whole, and in ASGI for any other server.
install_daphne_guard()

application = ProtocolTypeRouter(
    {
        # Past what this process can serve: 503 `overloaded` at once (api/admission.py).
        "http": BodyLimitMiddleware(AdmissionMiddleware(HangupMiddleware(django_asgi_app))),
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
