"""Every API error is ``application/problem+json`` (RFC 9457) with our stable ``code``.

Three ways in, one body:

- ``exception_handler`` is DRF's ``EXCEPTION_HANDLER``: it turns ``HoldpointError``
  and DRF's own errors (parse errors, 401, 403, 404, 405, 406, 415, 429,
  validation) into problem responses.
- ``problem_response(code, detail, status=None, **extra)`` builds one anywhere else
  (plain Django views, middleware, the dashboard).
- ``overloaded_body(detail)`` is the 503 ``overloaded`` refusal with ``Retry-After``
  (``HOLDPOINT_OVERLOAD_RETRY_AFTER``): from the admission limit (``api.admission``), and
  for a request that waited ``DATABASE_POOL_TIMEOUT`` for a pooled database connection
  and got none (``pool_exhausted``), which was a 500 before.
- ``ApiBoundaryMiddleware`` guards ``/api/`` before any view runs: it refuses bodies
  over ``HOLDPOINT_MAX_BODY_BYTES`` (413) and JSON nested deeper than
  ``MAX_JSON_DEPTH`` (400), and turns Django's HTML 404/405/500 pages under
  ``/api/`` into problems too.

A body looks like::

    {"type": "urn:holdpoint:problem:stale_worker", "title": "Stale worker",
     "status": 409, "detail": "Another lease was granted …", "code": "stale_worker",
     "instance": "/api/worker/attempts/att_…/complete", …extra facts}

``type`` is a URN rather than a URL: it names the problem and promises no page.
Validation problems carry ``errors: [{pointer, message}]`` with a JSON pointer into
the request body (``/input/n``) or the query (``/status`` for ``?status=``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.views import defaults
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import set_rollback

from runs.errors import ERROR_STATUS, ERRORS, HoldpointError
from runs.schemas import MAX_JSON_DEPTH
from runs.schemas import too_deep as too_deep_json

logger = logging.getLogger(__name__)

CONTENT_TYPE = "application/problem+json"
API_PREFIX = "/api/"


def problem_type(code: str) -> str:
    return f"urn:holdpoint:problem:{code}"


def title_for(code: str) -> str:
    kind = ERRORS.get(code)
    return kind.title if kind else code.replace("_", " ").capitalize()


def problem_body(
    code: str,
    detail: str,
    status: int | None = None,
    instance: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The RFC 9457 members, our ``code``, then the error's structured facts."""
    body: dict[str, Any] = {
        "type": problem_type(code),
        "title": title_for(code),
        "status": status or ERROR_STATUS.get(code, 500),
        "detail": detail,
        "code": code,
    }
    if instance:
        body["instance"] = instance
    for name, value in extra.items():
        body.setdefault(name, value)
    return body


def _headers_for(extra: dict[str, Any]) -> dict[str, str]:
    retry_after = extra.get("retry_after")
    return {"Retry-After": str(int(retry_after))} if retry_after is not None else {}


def render_problem(body: dict[str, Any]) -> bytes:
    # A problem may quote what the client sent (a pointer to a member name holding a lone
    # surrogate): written as its JSON escape (\ud800), it is still valid JSON.
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=str)
    return text.encode("utf-8", "backslashreplace")


def problem_response(
    code: str,
    detail: str,
    status: int | None = None,
    instance: str | None = None,
    **extra: Any,
) -> HttpResponse:
    """A ``problem+json`` HttpResponse for use outside DRF."""
    body = problem_body(code, detail, status, instance, **extra)
    response = HttpResponse(render_problem(body), status=body["status"], content_type=CONTENT_TYPE)
    for name, value in _headers_for(extra).items():
        response[name] = value
    return response


def error_body(exc: HoldpointError, instance: str | None = None) -> dict[str, Any]:
    return problem_body(exc.code, exc.detail, exc.status, instance, **exc.extra)


def error_response(exc: HoldpointError, instance: str | None = None) -> HttpResponse:
    return problem_response(exc.code, exc.detail, exc.status, instance, **exc.extra)


# --- Overload ----------------------------------------------------------------------------------


def overloaded_body(detail: str, instance: str | None = None, **extra: Any) -> dict[str, Any]:
    """A 503 ``overloaded`` problem; ``retry_after`` is also its ``Retry-After`` header."""
    retry_after = int(settings.HOLDPOINT_OVERLOAD_RETRY_AFTER)
    return problem_body("overloaded", detail, 503, instance, retry_after=retry_after, **extra)


def pool_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is psycopg's pool timing out: every pooled
    connection stayed busy for ``DATABASE_POOL_TIMEOUT``. Nothing ran without a connection,
    so nothing changed: the request may be sent again."""
    try:
        from psycopg_pool import PoolTimeout
    except ImportError:  # SQLite (newcomer mode): no pool
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, PoolTimeout):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


POOL_EXHAUSTED_DETAIL = (
    "Every database connection of this server process stayed busy; nothing was done: "
    "send the same request again after Retry-After seconds."
)


def pool_exhausted_response(instance: str | None) -> HttpResponse:
    body = overloaded_body(POOL_EXHAUSTED_DETAIL, instance)
    logger.warning("Overloaded: no pooled database connection for %s", instance)
    response = HttpResponse(render_problem(body), status=503, content_type=CONTENT_TYPE)
    response["Retry-After"] = str(body["retry_after"])
    return response


# --- DRF -----------------------------------------------------------------------------------------


def _escape_pointer(token: Any) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def validation_errors(detail: Any, pointer: str = "") -> list[dict[str, str]]:
    """Flatten DRF's nested error detail into ``[{pointer, message}]`` (JSON pointers)."""
    if isinstance(detail, dict):
        errors: list[dict[str, str]] = []
        for name, value in detail.items():
            if name in ("non_field_errors", "__all__"):
                errors.extend(validation_errors(value, pointer))
            else:
                errors.extend(validation_errors(value, f"{pointer}/{_escape_pointer(name)}"))
        return errors
    if isinstance(detail, list):
        errors = []
        for index, value in enumerate(detail):
            if isinstance(value, dict | list):
                errors.extend(validation_errors(value, f"{pointer}/{index}"))
            else:
                errors.extend(validation_errors(value, pointer))
        return errors
    return [{"pointer": pointer or "/", "message": str(detail)}]


_DRF_CODES: list[tuple[type[exceptions.APIException], str]] = [
    (exceptions.ParseError, "malformed_request"),
    (exceptions.NotAuthenticated, "not_authenticated"),
    (exceptions.AuthenticationFailed, "authentication_failed"),
    (exceptions.PermissionDenied, "permission_denied"),
    (exceptions.NotFound, "not_found"),
    (exceptions.MethodNotAllowed, "method_not_allowed"),
    (exceptions.NotAcceptable, "not_acceptable"),
    (exceptions.UnsupportedMediaType, "unsupported_media_type"),
    (exceptions.Throttled, "throttled"),
]


def _drf_code(exc: exceptions.APIException) -> str:
    # An exception raised with one of our codes (csrf_failed) keeps it.
    codes = exc.get_codes()
    if isinstance(codes, str) and codes in ERROR_STATUS:
        return codes
    for cls, code in _DRF_CODES:
        if isinstance(exc, cls):
            return code
    if exc.status_code == 413:
        return "payload_too_large"
    return "server_error" if exc.status_code >= 500 else "malformed_request"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every refusal becomes a problem with a stable ``code``.

    Anything else returns None, so DRF re-raises it and ``ApiBoundaryMiddleware``
    answers a logged 500 problem.
    """
    request = context.get("request")
    instance = request.path if request is not None else None
    if isinstance(exc, HoldpointError):
        body = error_body(exc, instance)
        headers = _headers_for(exc.extra)
    else:
        if isinstance(exc, Http404):
            exc = exceptions.NotFound(str(exc) or "Not found.")
        elif isinstance(exc, DjangoPermissionDenied):
            exc = exceptions.PermissionDenied(str(exc) or None)
        if not isinstance(exc, exceptions.APIException):
            if pool_exhausted(exc):
                set_rollback()
                body = overloaded_body(POOL_EXHAUSTED_DETAIL, instance)
                logger.warning("Overloaded: no pooled database connection for %s", instance)
                return Response(
                    body,
                    status=503,
                    headers={"Retry-After": str(body["retry_after"])},
                    content_type=CONTENT_TYPE,
                )
            return None
        headers = {}
        if isinstance(exc, exceptions.ValidationError):
            body = problem_body(
                "invalid_input",
                "The request does not pass validation; see errors.",
                instance=instance,
                errors=validation_errors(exc.detail),
            )
        else:
            code = _drf_code(exc)
            detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
            body = problem_body(code, str(detail), exc.status_code, instance)
            if getattr(exc, "auth_header", None):
                headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
            wait = getattr(exc, "wait", None)
            if wait:
                headers["Retry-After"] = str(int(wait))
                body["retry_after"] = int(wait)
    set_rollback()
    return Response(body, status=body["status"], headers=headers, content_type=CONTENT_TYPE)


def nul_in_request(request: HttpRequest, *, form: bool) -> str | None:
    """Where the request carries a NUL character (``"path"``, ``"query"``, ``"form"``), or None.

    PostgreSQL text cannot hold NUL, so an id such as ``run_%00`` reached the database
    and failed there with a 500. No id, filter or form field of Holdpoint needs one.
    """
    if "\x00" in request.path_info:
        return "path"
    if "%00" in request.META.get("QUERY_STRING", "") and _has_nul(request.GET.lists()):
        return "query"
    if form and request.method == "POST" and _has_nul(request.POST.lists()):
        return "form"
    return None


def _has_nul(items: object) -> bool:
    return any(
        "\x00" in key or any("\x00" in str(value) for value in values)
        for key, values in items  # type: ignore[attr-defined]
    )


# --- Middleware ----------------------------------------------------------------------------------


# PostgreSQL stores neither NUL (text, jsonb) nor a lone UTF-16 surrogate (not UTF-8), which
# JSON's \u0000 and \ud800 escapes can carry into any string of a body.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_UNSTORABLE_REPORTED = 10


def json_unstorable_strings(value: Any) -> list[dict[str, str]]:
    """``[{pointer, message}]`` for each string (member names too) holding a NUL or a lone
    surrogate, at most ``_UNSTORABLE_REPORTED`` of them (iterative: no recursion)."""
    errors: list[dict[str, str]] = []
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack and len(errors) < _UNSTORABLE_REPORTED:
        item, pointer = stack.pop()
        if isinstance(item, str):
            found = _UNSTORABLE.search(item)
            if found is not None:
                what = "a NUL character" if found.group() == "\x00" else "a lone surrogate"
                errors.append({"pointer": pointer or "/", "message": f"The string holds {what}."})
        elif isinstance(item, dict):
            for name, child in item.items():
                member = f"{pointer}/{_escape_pointer(name)}"
                if _UNSTORABLE.search(name):
                    errors.append(
                        {
                            "pointer": member,
                            "message": "The member name holds a NUL character or a lone surrogate.",
                        }
                    )
                stack.append((child, member))
        elif isinstance(item, list):
            stack.extend((child, f"{pointer}/{index}") for index, child in enumerate(item))
    return errors


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


# Answers Django itself makes in HTML before or around a view: a 400 for a request it
# finds suspicious (an empty or disallowed Host header, a malformed multipart body), a
# 403 from its CSRF view, a 404 for no URL, a 405 from a class-based view.
_HTML_ANSWERS = {
    400: ("malformed_request", "The request is malformed (for example its Host header)."),
    403: ("permission_denied", "The request was refused."),
    404: ("not_found", "There is no such API endpoint."),
    405: ("method_not_allowed", "{method} is not allowed here."),
}


def html_answer_problem(status: int, request: HttpRequest) -> HttpResponse:
    """The problem an API client gets where Django would answer ``status`` in HTML."""
    code, detail = _HTML_ANSWERS[status]
    return problem_response(code, detail.format(method=request.method), instance=request.path)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's ``handler404``: under ``/api/`` the problem at once, not an HTML page that
    ``ApiBoundaryMiddleware`` would render and then throw away (two thirds of a 404's CPU);
    elsewhere Django's page (``templates/404.html``)."""
    if request.path.startswith(API_PREFIX):
        return html_answer_problem(404, request)
    return defaults.page_not_found(request, exception)


class ApiBoundaryMiddleware:
    """Refuse oversized and deeply nested bodies under ``/api/`` before any work,
    and answer problems where Django would answer HTML."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        where = nul_in_request(request, form=False)
        if where is not None:
            return problem_response(
                "malformed_request",
                f"The {where} of the request contains a NUL character; no id or filter takes one.",
                instance=request.path,
            )
        refused = self._refuse_body(request)
        if refused is not None:
            return refused
        response = self.get_response(request)
        content_type = response.get("Content-Type", "")
        if response.status_code in _HTML_ANSWERS and not _is_json(content_type):
            return html_answer_problem(response.status_code, request)
        return response

    def _refuse_body(self, request: HttpRequest) -> HttpResponse | None:
        limit = int(settings.HOLDPOINT_MAX_BODY_BYTES)
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return problem_response(
                "malformed_request", "Content-Length is not a number.", instance=request.path
            )
        if length > limit:
            return problem_response(
                "payload_too_large",
                f"The body is {length} bytes; the limit is {limit} bytes.",
                instance=request.path,
                limit=limit,
            )
        if length == 0 or not _is_json(request.META.get("CONTENT_TYPE", "")):
            return None
        try:
            value = json.loads(request.body)
        except RecursionError:
            value = None
            too_deep = True
        except ValueError:
            return None  # The parser of the view reports the syntax error with its position.
        else:
            too_deep = too_deep_json(value)
        if too_deep:
            return problem_response(
                "malformed_request",
                f"The JSON body nests deeper than {MAX_JSON_DEPTH} levels.",
                instance=request.path,
                max_depth=MAX_JSON_DEPTH,
            )
        unstorable = json_unstorable_strings(value)
        if unstorable:
            return problem_response(
                "invalid_input",
                "The JSON body contains characters that cannot be stored; see errors.",
                instance=request.path,
                errors=unstorable,
            )
        return None

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path.startswith(API_PREFIX):
            return None
        if isinstance(exception, HoldpointError):
            return error_response(exception, request.path)
        if pool_exhausted(exception):
            return pool_exhausted_response(request.path)
        logger.exception("Unhandled error in %s %s", request.method, request.path)
        return problem_response(
            "server_error",
            "The server failed to answer; nothing was stored for an Idempotency-Key.",
            instance=request.path,
        )
