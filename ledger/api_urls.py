"""The ledger's JSON endpoints, mounted under /api/ by config/urls.py."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from ledger import apis

urlpatterns: list[URLPattern | URLResolver] = [
    path(
        "runs/<str:run_id>/side-effects",
        apis.RunSideEffectListApi.as_view(),
        name="api-run-side-effects",
    ),
    path("runs/<str:run_id>/report", apis.RunReportApi.as_view(), name="api-run-report"),
    path("side-effects", apis.SideEffectListApi.as_view(), name="api-side-effects"),
    path(
        "side-effects/<str:operation_id>",
        apis.SideEffectDetailApi.as_view(),
        name="api-side-effect",
    ),
    path(
        "side-effects/<str:operation_id>/reconcile",
        apis.SideEffectReconcileApi.as_view(),
        name="api-side-effect-reconcile",
    ),
    path(
        "side-effects/<str:operation_id>/compensate",
        apis.SideEffectCompensateApi.as_view(),
        name="api-side-effect-compensate",
    ),
    path(
        "worker/attempts/<str:attempt_id>/side-effects",
        apis.WorkerSideEffectBeginApi.as_view(),
        name="api-worker-side-effect-begin",
    ),
    path(
        "worker/side-effects/<str:operation_id>/outcome",
        apis.WorkerSideEffectOutcomeApi.as_view(),
        name="api-worker-side-effect-outcome",
    ),
]
