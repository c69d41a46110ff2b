"""Dashboard pages of the ledger, mounted at ``/side-effects/``."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from ledger import views

app_name = "ledger"

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.side_effect_list, name="side-effects"),
    path("runs/<str:run_id>/", views.run_report, name="run-report"),
    path("runs/<str:run_id>/retry-preview", views.retry_preview, name="retry-preview"),
    path("<str:operation_id>/reconcile", views.side_effect_reconcile, name="reconcile"),
    path("<str:operation_id>/compensate", views.side_effect_compensate, name="compensate"),
]
