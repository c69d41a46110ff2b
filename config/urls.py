"""URL wiring only: each app owns its own routes."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # JSON API: the control API and the worker API (runs), the ledger's endpoints.
    path("api/", include("runs.api_urls")),
    path("api/", include("ledger.api_urls")),
    # Dashboard pages.
    path("side-effects/", include("ledger.urls")),
    path("", include("runs.urls")),
]
