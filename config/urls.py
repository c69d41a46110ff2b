"""URL wiring only: each app owns its own routes."""

from __future__ import annotations

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from runs.health import healthz, metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    # Browsers ask for /favicon.ico on pages that name none (the admin, raw files).
    path("favicon.ico", RedirectView.as_view(url=static("holdpoint/favicon.svg"), permanent=True)),
    path("metrics", metrics, name="metrics"),
    # JSON API: the control API and the worker API (runs), the ledger's endpoints.
    path("api/", include("runs.api_urls")),
    path("api/", include("ledger.api_urls")),
    # Dashboard pages.
    path("side-effects/", include("ledger.urls")),
    path("", include("runs.urls")),
]
