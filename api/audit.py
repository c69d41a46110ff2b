"""``GET /api/audit``: the audit trail of decisions and control operations, as JSON pages
or as a CSV download (``?format=csv`` or ``Accept: text/csv``).

Needs ``runs.view_audit`` (the admin group, and superusers): anyone else gets 403, before
the query is looked at. The rows come from ``runs.audit_log``; this module pages them,
and writes the CSV with every cell that a spreadsheet would run as a formula neutralised.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from api.base import AUTH_CODES, problems, require_perm
from api.problems import render_problem
from api.reads import QueryValidated
from api.serializers import UtcDateTimeField, utc
from runs.audit import AGENT_AUDIT_EVENT_TYPES, AUDIT_EVENT_TYPES
from runs.audit_log import (
    COMMENT_MAX,
    PAGE_MAX,
    SUMMARY_MAX,
    AuditFilter,
    AuditRow,
    audit_download,
    audit_page,
    cursor_decode,
    cursor_encode,
)
from runs.selectors import VIEW_AUDIT

COLUMNS = (
    "time",
    "run_id",
    "agent",
    "type",
    "actor",
    "via",
    "identity",
    "request_id",
    "decision",
    "summary",
    "comment",
)
# The runs' decisions and control operations, then people's changes to agents (tool rules).
TRAIL_TYPES = [*AUDIT_EVENT_TYPES, *AGENT_AUDIT_EVENT_TYPES]
# A cell starting with one of these is a formula (or becomes one) in Excel, LibreOffice
# and Google Sheets: CSV injection (OWASP). Agent and user text reaches the cells.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """One cell: text, with a leading ``'`` where a spreadsheet would see a formula, and
    without NUL (which no CSV reader expects)."""
    text = "" if value is None else str(value).replace("\x00", "")
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class CsvRenderer(BaseRenderer):
    """Lets ``?format=csv`` and ``Accept: text/csv`` choose the CSV download. The rows are
    streamed by the view; only a refusal (a problem) is rendered here, as JSON."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None
    ) -> bytes:
        return render_problem(data) if isinstance(data, dict) else b""


class FormatNegotiation(DefaultContentNegotiation):
    """An unknown ``?format=`` is a problem of the query (422 on ``/format``, after the
    permission), not DRF's 404 before anything was checked."""

    def select_renderer(self, request: Request, renderers: Any, format_suffix: Any = None) -> Any:
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except Http404:
            return renderers[0], renderers[0].media_type


class AuditRowSerializer(serializers.Serializer):
    """One decision or control operation."""

    time = UtcDateTimeField(source="at")
    run_id = serializers.CharField(
        allow_null=True, help_text="Null for a change to the agent as a whole (a tool rule)."
    )
    agent = serializers.CharField()
    type = serializers.ChoiceField(choices=TRAIL_TYPES)
    actor = serializers.CharField(help_text="`user:<name>`, `cli` or `system`.")
    via = serializers.CharField(
        help_text="How: `dashboard`, `api`, `email`, `slack`, `cli`; empty for the system "
        "and for events recorded before doors were."
    )
    identity = serializers.CharField(
        help_text="The credential: `session:oidc` or `session:password` (how the browser "
        "session was signed in), `token:<12 hex digits of the key's SHA-256>`, "
        "`email-link`, `slack:<team>/<user>`, `shell:<account>`; empty when `via` is."
    )
    request_id = serializers.CharField(allow_null=True)
    decision = serializers.CharField(
        allow_null=True, help_text="`approve`, `deny` or `respond` for an approval's decision."
    )
    summary = serializers.CharField(help_text=f"At most {SUMMARY_MAX} characters.")
    comment = serializers.CharField(
        help_text=f"The comment or reason given, at most {COMMENT_MAX} characters."
    )


class AuditPageSerializer(serializers.Serializer):
    results = AuditRowSerializer(many=True)
    next = serializers.URLField(allow_null=True, help_text="The next page; null on the last.")


class AuditApi(QueryValidated, APIView):
    """Decisions and control operations across runs, newest first."""

    renderer_classes = [JSONRenderer, CsvRenderer]
    content_negotiation_class = FormatNegotiation

    class QuerySerializer(serializers.Serializer):
        since = serializers.DateTimeField(required=False, help_text="From this time (ISO 8601).")
        until = serializers.DateTimeField(required=False, help_text="Before this time (ISO 8601).")
        actor = serializers.CharField(
            max_length=200, required=False, help_text="`user:olivia`, `olivia`, `cli`, …"
        )
        run = serializers.CharField(max_length=40, required=False)
        type = serializers.ChoiceField(choices=TRAIL_TYPES, required=False)
        cursor = serializers.CharField(max_length=200, required=False)
        limit = serializers.IntegerField(
            min_value=1, max_value=PAGE_MAX, required=False, default=50
        )
        format = serializers.ChoiceField(
            choices=["json", "csv"], required=False, help_text="`csv`: the CSV download."
        )

        def validate(self, data: dict[str, Any]) -> dict[str, Any]:
            since, until = data.get("since"), data.get("until")
            if since is not None and until is not None and since >= until:
                raise serializers.ValidationError({"until": ["Must be later than since."]})
            if "cursor" in data:
                key = cursor_decode(data["cursor"])
                if key is None:
                    raise serializers.ValidationError({"cursor": ["Invalid cursor."]})
                data["key"] = key
            return data

    @extend_schema(
        tags=["audit"],
        operation_id="audit_list",
        parameters=[QuerySerializer],
        description="Decisions and control operations across runs, newest first, paged by "
        "`cursor` (follow `next`). `?format=csv` (or `Accept: text/csv`): the same rows as a "
        "CSV download, at most HOLDPOINT_AUDIT_CSV_MAX_ROWS; when more match, the header "
        '`Link: <…>; rel="next"` continues it. Needs `runs.view_audit`.',
        responses={
            (200, "application/json"): AuditPageSerializer,
            (200, "text/csv"): OpenApiResponse(
                response=OpenApiTypes.STR, description="A header row, then one row per event."
            ),
            **problems(*AUTH_CODES, "invalid_input", "not_acceptable"),
        },
    )
    def get(self, request: Request) -> Any:
        require_perm(request.user, VIEW_AUDIT)
        query = self.query(request)
        where = AuditFilter(
            since=query.get("since"),
            until=query.get("until"),
            actor=query.get("actor", ""),
            run_id=query.get("run", ""),
            type=query.get("type", ""),
        )
        before = query.get("key")
        if isinstance(request.accepted_renderer, CsvRenderer):
            return self._download(request, where, before)
        rows, next_key = audit_page(where, before=before, limit=query["limit"])
        url = request.build_absolute_uri()
        next_url = (
            None
            if next_key is None
            else replace_query_param(url, "cursor", cursor_encode(next_key))
        )
        return Response({"results": AuditRowSerializer(rows, many=True).data, "next": next_url})

    def _download(self, request: Request, where: AuditFilter, before: Any) -> StreamingHttpResponse:
        max_rows = int(settings.HOLDPOINT_AUDIT_CSV_MAX_ROWS)
        chunks, bound = audit_download(where, before=before, max_rows=max_rows)
        lines = _csv_lines(chunks)
        content: Iterator[bytes] | AsyncIterator[bytes] = lines
        if isinstance(request._request, ASGIRequest):
            # Served by an ASGI server, Django would read a plain iterator whole before
            # sending a byte; each chunk (one query) is read in the request's thread instead.
            content = _one_at_a_time(lines)
        response = StreamingHttpResponse(content, content_type="text/csv; charset=utf-8")
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response["Content-Disposition"] = f'attachment; filename="holdpoint-audit-{stamp}.csv"'
        if bound is not None:
            url = replace_query_param(request.build_absolute_uri(), "cursor", cursor_encode(bound))
            response["Link"] = f'<{url}>; rel="next"'
            response["Holdpoint-Audit-Truncated"] = "true"
        return response


def _csv_lines(chunks: Iterator[list[AuditRow]]) -> Iterator[bytes]:
    """The header row, then each chunk of rows as one piece of UTF-8 CSV."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    yield buffer.getvalue().encode()
    for rows in chunks:
        buffer.seek(0)
        buffer.truncate()
        for row in rows:
            writer.writerow(
                [
                    csv_cell(value)
                    for value in (
                        utc(row["at"]),
                        row["run_id"],
                        row["agent"],
                        row["type"],
                        row["actor"],
                        row["via"],
                        row["identity"],
                        row["request_id"],
                        row["decision"],
                        row["summary"],
                        row["comment"],
                    )
                ]
            )
        yield buffer.getvalue().encode()


def _next_piece(lines: Iterator[bytes]) -> bytes | None:
    return next(lines, None)


async def _one_at_a_time(lines: Iterator[bytes]) -> AsyncIterator[bytes]:
    step = sync_to_async(_next_piece, thread_sensitive=True)
    while (piece := await step(lines)) is not None:
        yield piece
