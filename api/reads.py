"""Read endpoints of the control API: agents, runs, attempts, events, checkpoints, the inbox.

Every read goes through ``runs.selectors``: a user without ``view`` gets 404 for any
run (its existence never leaks) and 403 for the collections.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.base import AUTH_CODES, problems, require_perm, validated
from api.serializers import (
    AgentOverviewSerializer,
    AttemptSerializer,
    CheckpointSerializer,
    InputRequestSerializer,
    RunEventSerializer,
    RunSerializer,
)
from runs.models import InputRequest, Run
from runs.selectors import (
    VIEW,
    agents_overview,
    inbox_for_user,
    run_get_for_user,
    runs_for_user,
    waiting_for_runs,
)
from runs.states import RequestKind, RequestStatus, RunStatus

RUN_RELATED = ("current_attempt", "pending_request", "pending_request__answered_by")


class Cursor(CursorPagination):
    """Cursor pagination; a damaged cursor is a 422 on ``/cursor``, not a 404."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200
    ordering = ("-created_at", "-id")

    def decode_cursor(self, request: Request) -> Any:
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError({"cursor": ["Invalid cursor."]}) from None


class InboxCursor(Cursor):
    def get_ordering(self, request: Request, queryset: Any, view: Any) -> tuple[str, ...]:
        # Pending questions: soonest expiry first (what runs out next is on top).
        if request.query_params.get("status", RequestStatus.PENDING) == RequestStatus.PENDING:
            return ("expires_at", "id")
        return ("-created_at", "-id")


class QueryValidated:
    """Validate the query string with ``QuerySerializer``; failures point at ``/param``."""

    QuerySerializer: type[serializers.Serializer]

    def query(self, request: Request) -> dict[str, Any]:
        cached = getattr(request, "_holdpoint_query", None)
        if cached is None:
            cached = validated(self.QuerySerializer, request.query_params)
            request._holdpoint_query = cached  # type: ignore[attr-defined]
        return cached


def _choices(values: Any) -> list[str]:
    return [str(v) for v in values]


@extend_schema(
    tags=["agents"],
    responses={200: AgentOverviewSerializer(many=True), **problems(*AUTH_CODES)},
)
class AgentListApi(APIView):
    """The registry: Python agents of the workers and agents declared for HTTP workers,
    each with its gate (open or paused: who, why, since when) and its runs by status."""

    def get(self, request: Request) -> Response:
        require_perm(request.user, VIEW)
        return Response(AgentOverviewSerializer(agents_overview(), many=True).data)


class RunListApi(QueryValidated, ListAPIView):
    """Runs, newest first, filtered by status and agent, paged by cursor."""

    serializer_class = RunSerializer
    pagination_class = Cursor

    class QuerySerializer(serializers.Serializer):
        status = serializers.ChoiceField(choices=_choices(RunStatus.values), required=False)
        agent = serializers.CharField(max_length=100, required=False)
        cursor = serializers.CharField(required=False)
        page_size = serializers.IntegerField(min_value=1, max_value=200, required=False)

    @extend_schema(
        tags=["runs"],
        description="Runs, newest first, filtered by status and agent, paged by cursor.",
        parameters=[QuerySerializer],
        responses={200: RunSerializer(many=True), **problems(*AUTH_CODES, "invalid_input")},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        # Why each queued run of the page waits: read once for the page (two queries).
        context = {**self.get_serializer_context(), "waiting": waiting_for_runs(page or [])}
        serializer = self.get_serializer(page, many=True, context=context)
        return self.get_paginated_response(serializer.data)

    def get_queryset(self) -> QuerySet[Run]:
        require_perm(self.request.user, VIEW)
        query = self.query(self.request)
        return runs_for_user(
            user=self.request.user, status=query.get("status"), agent=query.get("agent")
        ).select_related(*RUN_RELATED)


@extend_schema(tags=["runs"], responses={200: RunSerializer, **problems(*AUTH_CODES, "not_found")})
class RunDetailApi(APIView):
    def get(self, request: Request, run_id: str) -> Response:
        run = run_get_for_user(user=request.user, run_id=run_id, related=True)
        return Response(RunSerializer(run).data)


@extend_schema(
    tags=["runs"],
    responses={200: AttemptSerializer(many=True), **problems(*AUTH_CODES, "not_found")},
)
class RunAttemptListApi(APIView):
    """Every attempt of the run, oldest first; each keeps its own error and cost."""

    def get(self, request: Request, run_id: str) -> Response:
        run = run_get_for_user(user=request.user, run_id=run_id)
        attempts = run.attempts.order_by("number")
        return Response(AttemptSerializer(attempts, many=True).data)


class RunEventListApi(QueryValidated, APIView):
    """The run's events after ``after`` (a seq), oldest first, at most ``limit``.

    Poll with the last ``seq`` you saw: events are append-only and ``seq`` grows by one.
    """

    class QuerySerializer(serializers.Serializer):
        after = serializers.IntegerField(min_value=0, required=False, default=0)
        limit = serializers.IntegerField(min_value=1, max_value=1000, required=False, default=500)

    @extend_schema(
        tags=["runs"],
        parameters=[QuerySerializer],
        responses={
            200: RunEventSerializer(many=True),
            **problems(*AUTH_CODES, "not_found", "invalid_input"),
        },
    )
    def get(self, request: Request, run_id: str) -> Response:
        run = run_get_for_user(user=request.user, run_id=run_id)
        query = self.query(request)
        events = run.events.filter(seq__gt=query["after"]).order_by("seq")[: query["limit"]]
        return Response(RunEventSerializer(events, many=True).data)


@extend_schema(
    tags=["runs"],
    responses={200: CheckpointSerializer(many=True), **problems(*AUTH_CODES, "not_found")},
)
class RunCheckpointListApi(APIView):
    """The run's checkpoints, oldest first: where a retry may start from."""

    def get(self, request: Request, run_id: str) -> Response:
        run = run_get_for_user(user=request.user, run_id=run_id)
        return Response(CheckpointSerializer(run.checkpoints.order_by("number"), many=True).data)


class InputRequestListApi(QueryValidated, ListAPIView):
    """The inbox: pending questions and approvals across runs, soonest expiry first.

    ``mine=true`` keeps only the kinds you may answer; other ``status`` values list
    closed requests, newest first.
    """

    serializer_class = InputRequestSerializer
    pagination_class = InboxCursor

    class QuerySerializer(serializers.Serializer):
        status = serializers.ChoiceField(
            choices=_choices(RequestStatus.values), required=False, default=RequestStatus.PENDING
        )
        kind = serializers.ChoiceField(choices=_choices(RequestKind.values), required=False)
        run_id = serializers.CharField(max_length=40, required=False)
        mine = serializers.BooleanField(
            required=False,
            default=False,
            help_text="Only what I may act on now (the dashboard's Needs me): questions of the "
            "kinds I may answer, approvals I may approve and have not approved yet.",
        )
        cursor = serializers.CharField(required=False)
        page_size = serializers.IntegerField(min_value=1, max_value=200, required=False)

    @extend_schema(
        tags=["inbox"],
        parameters=[QuerySerializer],
        responses={
            200: InputRequestSerializer(many=True),
            **problems(*AUTH_CODES, "invalid_input"),
        },
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[InputRequest]:
        user = self.request.user
        require_perm(user, VIEW)
        query = self.query(self.request)
        if query["status"] == RequestStatus.PENDING:
            requests = inbox_for_user(user=user, mine_only=query["mine"], pauses=True)
        else:
            requests = InputRequest.objects.filter(status=query["status"]).select_related("run")
        if query.get("kind"):
            requests = requests.filter(kind=query["kind"])
        if query.get("run_id"):
            requests = requests.filter(run_id=query["run_id"])
        return requests.select_related("answered_by")
