"""Pause over HTTP: one run (``POST /api/runs/{id}/pause``) and a whole agent, the kill
switch (``POST /api/agents/{name}/pause`` and ``/unpause``).

Continuing a paused run is ``POST /api/runs/{id}/resume`` with the pause request's
``request_id`` and ``checkpoint_id`` and no value (``api.control.RunResumeApi``).
Each view checks, in this order: authentication, the object and the permission, the
throttle, the Idempotency-Key header, the body; then it calls the one service.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema_view
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from api.base import api_identity, command_schema, require_perm
from api.idempotency import IdempotentMixin
from api.serializers import AgentOverviewSerializer, RunSerializer
from api.throttles import PrincipalRateThrottle
from runs import services
from runs.audit import API
from runs.errors import HoldpointError
from runs.selectors import CANCEL, PAUSE_AGENT, VIEW, agent_overview, run_get_for_user

STATE_CODES = ("invalid_state", "not_found", "throttled")


class PauseThrottle(SimpleRateThrottle):
    """Pauses per user per minute (``HOLDPOINT_PAUSE_THROTTLE_PER_MINUTE``): an alarm that
    loops on the API must not flood the run store with commands."""

    scope = "pause"

    def get_rate(self) -> str:
        return f"{settings.HOLDPOINT_PAUSE_THROTTLE_PER_MINUTE}/min"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        ident = request.user.pk if request.user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


class ReasonInput(serializers.Serializer):
    class Meta:
        ref_name = "PauseInput"

    reason = serializers.CharField(max_length=2000, help_text="Why; shown to everyone.")


class RunPauseInput(ReasonInput):
    class Meta:
        ref_name = "RunPauseInput"

    expires_in = serializers.FloatField(
        min_value=1,
        max_value=90 * 86400,
        required=False,
        allow_null=True,
        help_text="Seconds until the pause expires (the run then fails input_expired); "
        "without it a pause does not expire.",
    )


class RunPauseApi(IdempotentMixin, APIView):
    """Pause the run. ``queued`` or ``waiting``: ``paused`` at once. ``running``:
    ``pause_requested`` until the worker finishes its step, saves the next checkpoint and
    releases; then ``paused``. Continue with ``resume`` (the pause request, no value)."""

    # The API-wide throttle, and a tighter one for commands that stop work.
    throttle_classes = [PrincipalRateThrottle, PauseThrottle]

    InputSerializer = RunPauseInput

    @command_schema(
        RunPauseInput,
        {202: RunSerializer},
        *STATE_CODES,
        tags=["control"],
        operation_id="runs_pause",
    )
    def post(self, request: Request, run_id: str) -> HttpResponse:
        run = run_get_for_user(user=request.user, run_id=run_id, perm=CANCEL)
        return self.command(
            request,
            lambda data: (
                RunSerializer(
                    services.run_pause(
                        run_id=run.pk,
                        reason=data["reason"],
                        expires_in=data.get("expires_in"),
                        user=request.user,
                        via=API,
                        identity=api_identity(request),
                    )
                ).data
            ),
            status=202,
        )


def _agent_answer(name: str) -> Response:
    row = agent_overview(name)
    if row is None:  # pragma: no cover - the service found it a moment ago
        raise HoldpointError("not_found", f"There is no agent named {name!r}.")
    return Response(AgentOverviewSerializer(row).data, status=202)


def _known_agent(user: Any, name: str) -> None:
    """404 for an unknown agent (after the permission: the registry is no secret to
    people who may pause, and a 404 before a 403 would tell others nothing more)."""
    require_perm(user, VIEW)
    require_perm(user, PAUSE_AGENT)
    if len(name) > 100 or agent_overview(name) is None:
        raise HoldpointError("not_found", f"There is no agent named {name[:100]!r}.")


class AgentGateApi(IdempotentMixin, APIView):
    """Close or reopen an agent's gate: ``change`` is the one service that does it."""

    # The API-wide throttle, and a tighter one for commands that stop work.
    throttle_classes = [PrincipalRateThrottle, PauseThrottle]
    change: staticmethod[..., Any]

    def post(self, request: Request, name: str) -> HttpResponse:
        _known_agent(request.user, name)

        def execute(data: dict[str, Any]) -> Response:
            type(self).change(
                agent=name,
                reason=data["reason"],
                user=request.user,
                via=API,
                identity=api_identity(request),
            )
            return _agent_answer(name)

        return self.command(request, execute)


@extend_schema_view(
    post=command_schema(
        ReasonInput,
        {202: AgentOverviewSerializer},
        *STATE_CODES,
        tags=["agents"],
        operation_id="agents_pause",
    )
)
class AgentPauseApi(AgentGateApi):
    """Close the agent's gate (the kill switch): nothing of it is claimed, every running
    attempt stops at its next step boundary and its run waits ``queued``, held."""

    InputSerializer = ReasonInput
    change = staticmethod(services.agent_pause)


class UnpauseInput(serializers.Serializer):
    class Meta:
        ref_name = "AgentUnpauseInput"

    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


@extend_schema_view(
    post=command_schema(
        UnpauseInput,
        {202: AgentOverviewSerializer},
        *STATE_CODES,
        tags=["agents"],
        operation_id="agents_unpause",
    )
)
class AgentUnpauseApi(AgentGateApi):
    """Reopen the agent's gate: its held and queued runs go on by themselves, soonest first."""

    InputSerializer = UnpauseInput
    change = staticmethod(services.agent_unpause)
