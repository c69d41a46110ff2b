"""Dashboard routes (mounted at ``/``). The JSON API lives in ``api.urls``."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path
from django.utils import timezone
from django.views.decorators.http import last_modified
from django.views.i18n import JavaScriptCatalog

from dashboard import views
from dashboard.views import side_effects
from dashboard.views.act import act
from dashboard.views.agents import agent_detail, tool_rule_confirm, tool_rules_confirm_suggested
from dashboard.views.login import login
from dashboard.views.notice import inbox_newest
from dashboard.views.oidc import oidc_authenticate, oidc_callback
from dashboard.views.operations import operations
from dashboard.views.profile import profile, slack_link_confirm, slack_unlink_view
from dashboard.views.workers import worker_list

# app.js's words (djangojs catalog of locale/). A script file, not inline (CSP); the page
# names its language in the URL, so a cached catalog never answers for another language.
STARTED = timezone.now()
javascript_catalog = last_modified(lambda request, **kwargs: STARTED)(
    JavaScriptCatalog.as_view(packages=["dashboard"])
)

# The ledger's pages, under /side-effects/ with the URL namespace "ledger".
side_effect_urlpatterns: list[URLPattern | URLResolver] = [
    path("", side_effects.side_effect_list, name="side-effects"),
    path("runs/<str:run_id>/", side_effects.run_report, name="run-report"),
    path("runs/<str:run_id>/retry-preview", side_effects.retry_preview, name="retry-preview"),
    path("<str:operation_id>/reconcile", side_effects.side_effect_reconcile, name="reconcile"),
    path("<str:operation_id>/compensate", side_effects.side_effect_compensate, name="compensate"),
]

urlpatterns: list[URLPattern | URLResolver] = [
    path("side-effects/", include((side_effect_urlpatterns, "ledger"))),
    path("login/", login, name="login"),
    # Company sign-in (OpenID Connect): 404 while no identity provider is configured.
    path("oidc/authenticate/", oidc_authenticate, name="oidc-authenticate"),
    path("oidc/callback/", oidc_callback, name="oidc-callback"),
    path("profile/", profile, name="profile"),
    # Link the Slack account that clicked (api/slack.py shows the link), or unlink it.
    path("profile/slack/unlink", slack_unlink_view, name="slack-unlink"),
    path("profile/slack/<str:token>", slack_link_confirm, name="slack-link"),
    # An e-mail's Approve / Deny link: a confirm page, whose POST decides (docs/notifications.md).
    path("act/<str:token>", act, name="act"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("jsi18n/", javascript_catalog, name="javascript-catalog"),
    path("", views.inbox, name="inbox"),
    path("inbox/count", views.inbox_count, name="inbox-count"),
    path("inbox/newest", inbox_newest, name="inbox-newest"),
    path("inbox/paused", views.inbox_paused, name="inbox-paused"),
    path("agents/", views.agent_list, name="agent-list"),
    path("agents/<str:name>/", agent_detail, name="agent-detail"),
    # The MCP gateway's tool rules on the agent page (dashboard/views/agents.py).
    path(
        "agents/<str:name>/tool-rules/confirm-suggested",
        tool_rules_confirm_suggested,
        name="tool-rules-confirm-suggested",
    ),
    path("agents/<str:name>/tool-rules/<int:pk>", tool_rule_confirm, name="tool-rule-confirm"),
    path("agents/<str:name>/confirm-pause", views.agent_pause_confirm, name="agent-pause-confirm"),
    path("agents/<str:name>/pause", views.agent_gate, {"action": "pause"}, name="agent-pause"),
    path(
        "agents/<str:name>/unpause", views.agent_gate, {"action": "unpause"}, name="agent-unpause"
    ),
    path("workers/", worker_list, name="worker-list"),
    path("operations/", operations, name="operations"),
    path("runs/", views.run_list, name="run-list"),
    path("runs/new", views.run_start, name="run-start"),
    path("runs/<str:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<str:run_id>/timeline", views.run_timeline, name="run-timeline"),
    path("runs/<str:run_id>/cancel", views.run_cancel, name="run-cancel"),
    path("runs/<str:run_id>/retry", views.run_retry, name="run-retry"),
    path("runs/<str:run_id>/pause", views.run_pause, name="run-pause"),
    path("runs/<str:run_id>/continue", views.run_continue, name="run-continue"),
    path(
        "runs/<str:run_id>/requests/<str:request_id>/answer",
        views.request_answer,
        name="request-answer",
    ),
]
