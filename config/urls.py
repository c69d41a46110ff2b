"""URL wiring only: each web app owns its own routes."""

from __future__ import annotations

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from config.health import healthz, metrics
from dashboard.views.login import admin_login

urlpatterns = [
    # The admin's sign-in is Django's unless passwords are off (HOLDPOINT_PASSWORD_LOGIN=0).
    path("admin/login/", admin_login, name="admin-login"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    # Browsers ask for /favicon.ico on pages that name none (the admin, raw files).
    path("favicon.ico", RedirectView.as_view(url=static("holdpoint/favicon.svg"), permanent=True)),
    path("metrics", metrics, name="metrics"),
    # The JSON API: control, worker protocol, side effects.
    path("api/", include("api.urls")),
    # The dashboard's pages.
    path("", include("dashboard.urls")),
]

# A URL that matches nothing: a problem under /api/, the dashboard's page elsewhere.
handler404 = "api.problems.page_not_found"
