"""Reads that check permission. Views, APIs and consumers get runs and requests here.

A user without ``runs.view_run`` is an outsider: every run is "not found" for them,
so the existence of a run never leaks. A user who may see a run but not act on it
gets ``PermissionDenied`` (healthchecks ``_get_rw_check_for_user``).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404
from django.utils.translation import gettext

from runs.models import InputRequest, Run
from runs.states import RequestKind, RequestStatus

VIEW = "runs.view_run"
ANSWER = "runs.answer_run"
APPROVE = "runs.approve_run"
CANCEL = "runs.cancel_run"
RETRY = "runs.retry_run"
START = "runs.start_run"


def permission_for_request_kind(kind: str) -> str:
    """Answering a question and approving an action are different permissions."""
    return APPROVE if kind == RequestKind.AUTH_REQUIRED else ANSWER


def run_get_for_user(*, user: Any, run_id: str, perm: str | None = None) -> Run:
    """Return the run, or raise Http404 (no such run, or an outsider) / PermissionDenied."""
    if not user.is_authenticated or not user.has_perm(VIEW):
        raise Http404("No such run.")
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise Http404("No such run.")
    if perm is not None and not user.has_perm(perm):
        raise PermissionDenied(
            gettext("You do not have the %(perm)s permission.") % {"perm": perm.split(".")[1]}
        )
    return run


def runs_for_user(
    *, user: Any, status: str | None = None, agent: str | None = None, q: str | None = None
) -> QuerySet[Run]:
    if not user.is_authenticated or not user.has_perm(VIEW):
        return Run.objects.none()
    runs = Run.objects.all()
    if status:
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent=agent)
    if q:
        runs = runs.filter(pk__startswith=q.strip())
    return runs.order_by("-created_at", "-id")


def answerable_kinds(user: Any) -> list[str]:
    kinds: list[str] = []
    if user.has_perm(ANSWER):
        kinds.append(RequestKind.INPUT_REQUIRED)
    if user.has_perm(APPROVE):
        kinds.append(RequestKind.AUTH_REQUIRED)
    return kinds


def inbox_for_user(*, user: Any, mine_only: bool = True) -> QuerySet[InputRequest]:
    """Pending requests, soonest expiry first. ``mine_only``: only kinds the user may answer.

    The inbox badge and the list both come from this one query (UX 2).
    """
    if not user.is_authenticated or not user.has_perm(VIEW):
        return InputRequest.objects.none()
    requests = InputRequest.objects.filter(status=RequestStatus.PENDING)
    if mine_only:
        requests = requests.filter(kind__in=answerable_kinds(user))
    return requests.select_related("run").order_by("expires_at", "id")


def request_get_for_user(*, user: Any, request_id: str) -> InputRequest:
    if not user.is_authenticated or not user.has_perm(VIEW):
        raise Http404("No such request.")
    request = (
        InputRequest.objects.select_related("run", "answered_by").filter(pk=request_id).first()
    )
    if request is None:
        raise Http404("No such request.")
    return request
