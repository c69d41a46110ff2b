"""URL wiring only: each web app owns its own routes."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from config.health import healthz, metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    # The JSON API: control, worker protocol, side effects.
    path("api/", include("api.urls")),
    # The dashboard's pages.
    path("", include("dashboard.urls")),
]
