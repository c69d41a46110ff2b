"""Routes of the JSON API, mounted under ``/api/`` by ``config/urls.py``: the control API,
the worker API, and the side-effect ledger's endpoints."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import AllowAny

from api import (
    audit,
    control,
    pause,
    reads,
    side_effects,
    slack,
    stats,
    tool_rules,
    worker,
    worker_protocol,
    workers,
)

urlpatterns: list[URLPattern | URLResolver] = [
    path(
        "schema",
        SpectacularAPIView.as_view(permission_classes=[AllowAny], authentication_classes=[]),
        name="api-schema",
    ),
    path("agents", reads.AgentListApi.as_view(), name="api-agents"),
    path("agents/<str:name>", worker_protocol.AgentDeclareApi.as_view(), name="api-agent-declare"),
    path("agents/<str:name>/pause", pause.AgentPauseApi.as_view(), name="api-agent-pause"),
    path("agents/<str:name>/unpause", pause.AgentUnpauseApi.as_view(), name="api-agent-unpause"),
    # The rules of the tools the agent calls through the MCP gateway (api/tool_rules.py).
    path(
        "agents/<str:name>/tool-rules",
        tool_rules.ToolRuleListApi.as_view(),
        name="api-agent-tool-rules",
    ),
    path(
        "agents/<str:name>/tool-rules/confirm-suggested",
        tool_rules.ToolRulesConfirmSuggestedApi.as_view(),
        name="api-agent-tool-rules-confirm-suggested",
    ),
    # A tool's name may hold "/": the rest of the path is the tool.
    path(
        "agents/<str:name>/tool-rules/<str:server>/<path:tool>",
        tool_rules.ToolRuleConfirmApi.as_view(),
        name="api-agent-tool-rule",
    ),
    path("runs", control.RunCollectionApi.as_view(), name="api-runs"),
    path("runs/<str:run_id>", reads.RunDetailApi.as_view(), name="api-run"),
    path("runs/<str:run_id>/attempts", reads.RunAttemptListApi.as_view(), name="api-run-attempts"),
    path("runs/<str:run_id>/events", reads.RunEventListApi.as_view(), name="api-run-events"),
    path(
        "runs/<str:run_id>/checkpoints",
        reads.RunCheckpointListApi.as_view(),
        name="api-run-checkpoints",
    ),
    path("runs/<str:run_id>/resume", control.RunResumeApi.as_view(), name="api-run-resume"),
    path("runs/<str:run_id>/cancel", control.RunCancelApi.as_view(), name="api-run-cancel"),
    path("runs/<str:run_id>/retry", control.RunRetryApi.as_view(), name="api-run-retry"),
    path("runs/<str:run_id>/pause", pause.RunPauseApi.as_view(), name="api-run-pause"),
    path("input-requests", reads.InputRequestListApi.as_view(), name="api-input-requests"),
    path("workers", workers.WorkerListApi.as_view(), name="api-workers"),
    # The operations page's figures (api/stats.py).
    path("stats/operations", stats.OperationsStatsApi.as_view(), name="api-stats-operations"),
    # Slack's interactivity requests (buttons, modals), signed by Slack (api/slack.py).
    path("slack/interactions", slack.interactions, name="api-slack-interactions"),
    # Decisions and control operations across runs, as pages or a CSV download.
    path("audit", audit.AuditApi.as_view(), name="api-audit"),
    # The worker API: worker tokens only.
    # The tools an agent's MCP gateway proxies, and their rules (api/tool_rules.py).
    path(
        "worker/agents/<str:name>/mcp-tools",
        tool_rules.McpToolsApi.as_view(),
        name="api-worker-mcp-tools",
    ),
    # The claim of api/worker.py, with the long poll and the answers (api/worker_protocol.py).
    path("worker/claim", worker_protocol.WorkerClaimWaitApi.as_view(), name="api-worker-claim"),
    # One renewal for all the attempts a worker process holds (api/worker_protocol.py).
    path(
        "worker/heartbeat",
        worker_protocol.WorkerHeartbeatsApi.as_view(),
        name="api-worker-heartbeats",
    ),
    path(
        "worker/attempts/<str:attempt_id>/heartbeat",
        worker.WorkerHeartbeatApi.as_view(),
        name="api-worker-heartbeat",
    ),
    path(
        "worker/attempts/<str:attempt_id>/release",
        worker.WorkerReleaseApi.as_view(),
        name="api-worker-release",
    ),
    path(
        "worker/attempts/<str:attempt_id>/checkpoint",
        worker.WorkerCheckpointApi.as_view(),
        name="api-worker-checkpoint",
    ),
    path(
        "worker/attempts/<str:attempt_id>/interrupt",
        worker.WorkerInterruptApi.as_view(),
        name="api-worker-interrupt",
    ),
    path(
        "worker/attempts/<str:attempt_id>/log",
        worker_protocol.WorkerLogApi.as_view(),
        name="api-worker-log",
    ),
    path(
        "worker/attempts/<str:attempt_id>/watch",
        worker_protocol.WorkerWatchApi.as_view(),
        name="api-worker-watch",
    ),
    path(
        "worker/attempts/<str:attempt_id>/cost",
        worker_protocol.WorkerCostApi.as_view(),
        name="api-worker-cost",
    ),
    path(
        "worker/attempts/<str:attempt_id>/complete",
        worker.WorkerCompleteApi.as_view(),
        name="api-worker-complete",
    ),
    path(
        "worker/attempts/<str:attempt_id>/fail",
        worker.WorkerFailApi.as_view(),
        name="api-worker-fail",
    ),
    # The side-effect ledger: reads, people's actions, and the workers' begin/outcome.
    path(
        "runs/<str:run_id>/side-effects",
        side_effects.RunSideEffectListApi.as_view(),
        name="api-run-side-effects",
    ),
    path("runs/<str:run_id>/report", side_effects.RunReportApi.as_view(), name="api-run-report"),
    path("side-effects", side_effects.SideEffectListApi.as_view(), name="api-side-effects"),
    path(
        "side-effects/<str:operation_id>",
        side_effects.SideEffectDetailApi.as_view(),
        name="api-side-effect",
    ),
    path(
        "side-effects/<str:operation_id>/reconcile",
        side_effects.SideEffectReconcileApi.as_view(),
        name="api-side-effect-reconcile",
    ),
    path(
        "side-effects/<str:operation_id>/compensate",
        side_effects.SideEffectCompensateApi.as_view(),
        name="api-side-effect-compensate",
    ),
    path(
        "worker/attempts/<str:attempt_id>/side-effects",
        side_effects.WorkerSideEffectBeginApi.as_view(),
        name="api-worker-side-effect-begin",
    ),
    path(
        "worker/side-effects/<str:operation_id>/outcome",
        side_effects.WorkerSideEffectOutcomeApi.as_view(),
        name="api-worker-side-effect-outcome",
    ),
]
