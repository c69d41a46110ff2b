"""Start the test provider: ``python -m tests.oidc_provider.serve DIR``.

Binds a free port on 127.0.0.1 first (so the issuer URL is known before Django starts),
migrates its SQLite database in DIR, registers Holdpoint's client, then writes the port
to DIR/port (atomically) and serves until killed. The environment names the RSA key, the
provider's secret and the client (OIDC_PROVIDER_RSA_KEY, OIDC_PROVIDER_SECRET,
OIDC_PROVIDER_CLIENT_ID, OIDC_PROVIDER_CLIENT_SECRET, OIDC_PROVIDER_REDIRECT_URIS).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    folder = Path(sys.argv[1])
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

    server = ThreadedWSGIServer(("127.0.0.1", 0), WSGIRequestHandler, allow_reuse_address=False)
    port = server.server_address[1]
    os.environ["OIDC_PROVIDER_PORT"] = str(port)
    os.environ["OIDC_PROVIDER_DB"] = str(folder / "provider.sqlite3")
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"

    import django

    django.setup()
    from django.core.management import call_command
    from django.core.wsgi import get_wsgi_application
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0, interactive=False)
    Application.objects.create(
        name="holdpoint",
        client_id=os.environ["OIDC_PROVIDER_CLIENT_ID"],
        client_secret=os.environ["OIDC_PROVIDER_CLIENT_SECRET"],
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=os.environ["OIDC_PROVIDER_REDIRECT_URIS"],
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )
    server.set_app(get_wsgi_application())
    written = folder / "port.tmp"
    written.write_text(str(port))
    written.rename(folder / "port")
    server.serve_forever()


if __name__ == "__main__":
    main()
