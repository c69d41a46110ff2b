"""Reads of the ledger: a run's side effects, its report, what needs reconciliation.

The permission-checked reads follow ``runs.selectors``: without ``runs.view_run``
every side effect is "not found"; seeing but not acting is ``PermissionDenied``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404
from django.utils.translation import gettext, gettext_noop, ngettext

from ledger.models import Reversibility, SideEffect, SideEffectStatus, ToolRule
from ledger.services import needs_reconciliation_q, stale_pending_q
from ledger.services.tool_rules import tool_rules_for
from ledger.tools import can_compensate, get_tool
from runs.access import Actor
from runs.errors import HoldpointError
from runs.models import Run
from runs.selectors import CHANGE_TOOL_RULES, RETRY, VIEW, permission_denied_text

S = SideEffectStatus

# The report's groups, in the order people read them (docs/dashboard.md, the side-effect report): what needs a person
# first, then what can never be taken back, then the rest.
REPORT_GROUPS: tuple[tuple[str, str], ...] = (
    ("unknown", gettext_noop("Unknown — needs reconciliation")),
    ("cannot_be_undone", gettext_noop("Cannot be undone")),
    ("happened", gettext_noop("Happened")),
    ("compensated", gettext_noop("Compensated")),
    ("did_not_happen", gettext_noop("Did not happen")),
)


def side_effects_for_run(run_id: str) -> QuerySet[SideEffect]:
    # side_effect_run_created_idx serves this query.
    return (
        SideEffect.objects.filter(run_id=run_id)
        .select_related("attempt")
        .order_by("created_at", "operation_id")
    )


def side_effects_needing_reconciliation() -> QuerySet[SideEffect]:
    """``unknown`` effects and ``pending`` ones that no live worker will settle."""
    return (
        SideEffect.objects.filter(needs_reconciliation_q())
        .select_related("run", "attempt")
        .order_by("created_at", "operation_id")
    )


def retry_guard(run: Run) -> str | None:
    """Registered with ``runs.services.register_retry_guard``: a run whose side effects
    are unsettled may not be retried, or the retry could act on a guess."""
    unsettled = SideEffect.objects.filter(run=run).filter(
        needs_reconciliation_q()
    )  # served by side_effect_unsettled_idx
    unknown = pending = 0
    for status in unsettled.values_list("status", flat=True):
        if status == S.UNKNOWN:
            unknown += 1
        else:
            pending += 1
    if not unknown and not pending:
        return None
    parts = []
    if unknown:
        parts.append(
            ngettext("%(n)d whose outcome is unknown", "%(n)d whose outcome is unknown", unknown)
            % {"n": unknown}
        )
    if pending:
        parts.append(
            ngettext(
                "%(n)d left pending by a worker that is gone",
                "%(n)d left pending by a worker that is gone",
                pending,
            )
            % {"n": pending}
        )
    joined = (
        gettext("%(a)s and %(b)s") % {"a": parts[0], "b": parts[1]} if len(parts) == 2 else parts[0]
    )
    return gettext("This run has side effects that must be reconciled first: %(what)s.") % {
        "what": joined
    }


def _tool_can_compensate(name: str) -> bool:
    try:
        return can_compensate(get_tool(name))
    except HoldpointError:
        return False


def report_group(effect: SideEffect) -> str:
    if effect.status in (S.PENDING, S.UNKNOWN):
        return "unknown"
    if effect.status == S.COMPENSATED:
        return "compensated"
    if effect.status == S.FAILED:
        return "did_not_happen"
    # Confirmed, or a compensation that failed: it happened and is still in place.
    if effect.reversibility == Reversibility.IRREVERSIBLE:
        return "cannot_be_undone"
    return "happened"


REPLY_HIDDEN = gettext_noop("Hidden: only people who can reconcile or compensate see replies.")


def replies_visible(user: Actor | None) -> bool:
    """Whether ``user`` sees what external systems answered (reply bodies): only people
    who can act on side effects. ``None`` is the system itself (commands, tests)."""
    return user is None or bool(user.has_perm(RETRY))


def _hide_reply(value: Any) -> Any:
    """``value`` (a result, or an error with ``details``) with the reply body replaced: a
    receiver chosen by an agent may answer anything, including internal data."""
    if not isinstance(value, dict):
        return value
    hidden = dict(value)
    if "body" in hidden:
        hidden["body"] = gettext(REPLY_HIDDEN)
    if isinstance(hidden.get("details"), dict) and "body" in hidden["details"]:
        hidden["details"] = {**hidden["details"], "body": gettext(REPLY_HIDDEN)}
    return hidden


def side_effect_row(
    effect: SideEffect, *, stale_ids: set[str] | None = None, show_replies: bool = True
) -> dict[str, Any]:
    """One side effect as the API and the report show it (times stay datetimes).

    ``show_replies=False`` (viewers) replaces reply bodies in the result and errors."""
    reply = (lambda value: value) if show_replies else _hide_reply
    approval = effect.approval or None
    compensable = (
        effect.reversibility != Reversibility.IRREVERSIBLE
        and effect.status in (S.CONFIRMED, S.COMPENSATION_FAILED)
        and _tool_can_compensate(effect.tool)
    )
    needs = effect.status == S.UNKNOWN or (
        effect.status == S.PENDING and stale_ids is not None and effect.operation_id in stale_ids
    )
    return {
        "operation_id": effect.operation_id,
        "run_id": effect.run_id,
        "attempt_id": effect.attempt_id,
        "step_id": effect.step_id,
        "tool": effect.tool,
        "target": effect.target,
        "status": effect.status,
        "reversibility": effect.reversibility,
        "idempotency_key": effect.idempotency_key,
        "generation": effect.generation,
        "external_reference": effect.external_reference,
        "request": effect.request,
        "result": reply(effect.result),
        "error": reply(effect.error),
        "late": effect.late,
        "compensating_action": effect.compensating_action,
        # The time the report shows: when the outcome was known, else when it began.
        "time": effect.outcome_at or effect.created_at,
        "created_at": effect.created_at,
        "outcome_at": effect.outcome_at,
        "outcome_by": effect.outcome_actor or None,
        "approved_by": approval["by"] if approval else None,
        "approval_comment": approval["comment"] if approval else None,
        "approval": approval,
        "resolution": (
            {
                "outcome": effect.resolution,
                "by": effect.resolved_actor,
                "note": effect.resolution_note,
                "at": effect.resolved_at,
            }
            if effect.resolution
            else None
        ),
        "compensation": (
            {
                "idempotency_key": effect.compensation_idempotency_key,
                "external_reference": effect.compensation_reference,
                "result": reply(effect.compensation_result),
                "error": reply(effect.compensation_error),
                "by": effect.compensation_actor or None,
                "reason": effect.compensation_reason,
                "started_at": effect.compensation_started_at,
                "ended_at": effect.compensation_ended_at,
                "in_progress": effect.compensation_in_progress,
            }
            if effect.compensation_idempotency_key
            else None
        ),
        "needs_reconciliation": needs,
        "can_compensate": compensable,
    }


def _stale_ids(effects: list[SideEffect]) -> set[str]:
    pending = [e.operation_id for e in effects if e.status == S.PENDING]
    if not pending:
        return set()
    return set(
        SideEffect.objects.filter(stale_pending_q(), pk__in=pending).values_list(
            "operation_id", flat=True
        )
    )


def side_effect_rows(
    effects: list[SideEffect], *, user: Actor | None = None
) -> list[dict[str, Any]]:
    """The rows as ``user`` may see them (see ``replies_visible``)."""
    stale = _stale_ids(effects)
    show = replies_visible(user)
    return [side_effect_row(effect, stale_ids=stale, show_replies=show) for effect in effects]


# Where a later request of the run says an earlier approval was not applied (the runtime
# writes these notes: runtime/questions.py).
NOT_APPLIED_NOTES = ("superseded_approval", "refused_edit")


def approvals_not_applied(run_id: str) -> list[dict[str, Any]]:
    """The approvals people gave in the run that did not happen (issue 24), oldest first:
    an attempt resumed with one failed ``ApprovalNotApplied``, or the step asked anew
    instead (``superseded_approval``) or refused the approved edit (``refused_edit``) in a
    later request. Each: the request, its action and target, who approved, their edit,
    why it was not applied, and the request that asked again (None when the run failed)."""
    from runs.models import Attempt, InputRequest
    from runs.services.notifications import APPROVAL_NOT_APPLIED

    why: dict[str, dict[str, Any]] = {}
    failed = Attempt.objects.filter(
        run_id=run_id, error_type=APPROVAL_NOT_APPLIED, resume_request__isnull=False
    ).order_by("number")
    for attempt in failed:
        why[str(attempt.resume_request_id)] = {
            "reason": attempt.error_message,
            "asked_again": None,
            "refused": False,
        }
    later = InputRequest.objects.filter(run_id=run_id).filter(
        Q(context__has_key=NOT_APPLIED_NOTES[0]) | Q(context__has_key=NOT_APPLIED_NOTES[1])
    )
    for request in later.order_by("created_at", "id"):
        for key in NOT_APPLIED_NOTES:
            note = (request.context or {}).get(key)
            if isinstance(note, dict) and isinstance(note.get("request_id"), str):
                why.setdefault(
                    note["request_id"],
                    {
                        "reason": str(note.get("reason") or ""),
                        "asked_again": request.id,
                        "refused": key == "refused_edit",
                    },
                )
    if not why:
        return []
    # Who approved what comes from the run store's record, not from a worker's note.
    approved = (
        InputRequest.objects.filter(run_id=run_id, pk__in=list(why), status="answered")
        .select_related("answered_by")
        .order_by("answered_at", "id")
    )
    rows = []
    for request in approved:
        answer = request.answer if isinstance(request.answer, dict) else {}
        if answer.get("decision") != "approve":
            continue
        action = request.action if isinstance(request.action, dict) else {}
        approvers = answer.get("approvers")
        by = (
            [str(a) for a in approvers]
            if isinstance(approvers, list) and approvers
            else ([request.answered_by.get_username()] if request.answered_by else [])
        )
        rows.append(
            {
                "request_id": request.id,
                "action": str(action.get("action") or action.get("tool") or ""),
                "target": str(action.get("target") or ""),
                "approved_by": by,
                "approved_at": request.answered_at,
                "edited": answer.get("edited"),
                **why[request.id],
            }
        )
    return rows


def add_approvals(rows: list[dict[str, Any]]) -> None:
    """Give each row done under an answered approval ``approvals``: every approval that
    counted (``runs.approvals.standing_votes`` of its request), oldest first, each with
    who, when, their comment and whether it made the edit that was approved. The report
    shows them all, not only the last approver's comment (issue 24)."""
    from runs.approvals import standing_votes
    from runs.models import InputRequest

    wanted = {
        str(row["approval"]["request_id"])
        for row in rows
        if isinstance(row.get("approval"), dict) and row["approval"].get("request_id")
    }
    found: dict[str, list[dict[str, Any]]] = {}
    for request in InputRequest.objects.filter(pk__in=wanted, decisions__gt=0):
        votes = (
            standing_votes(request)
            .select_related("user")
            .filter(decision="approve")
            .order_by("created_at", "id")
        )
        found[request.id] = [
            {
                "by": vote.user.get_username() if vote.user is not None else vote.actor,
                "at": vote.created_at,
                "comment": vote.comment,
                "made_edit": vote.edited is not None,
            }
            for vote in votes
        ]
    for row in rows:
        approval = row.get("approval")
        request_id = approval.get("request_id") if isinstance(approval, dict) else None
        row["approvals"] = found.get(str(request_id), []) if request_id else []


def report_for_run(run_id: str, *, user: Actor | None = None) -> dict[str, Any]:
    """Every side effect of the run, in the five groups of the report, with counts; and
    the approvals that did not happen (``not_applied``)."""
    effects = list(side_effects_for_run(run_id))
    rows = side_effect_rows(effects, user=user)
    add_approvals(rows)
    grouped: dict[str, list[dict[str, Any]]] = {key: [] for key, _ in REPORT_GROUPS}
    for effect, row in zip(effects, rows, strict=True):
        grouped[report_group(effect)].append(row)
    return {
        "run_id": run_id,
        "total": len(effects),
        "not_applied": approvals_not_applied(run_id),
        "needs_reconciliation": sum(1 for row in rows if row["needs_reconciliation"]),
        "groups": [
            {
                "key": key,
                "title": gettext(title),
                "count": len(grouped[key]),
                "rows": grouped[key],
            }
            for key, title in REPORT_GROUPS
        ],
    }


# --- Permission-checked reads ----------------------------------------------------------------


def side_effects_for_user(*, user: Actor, status: str | None = None) -> QuerySet[SideEffect]:
    """Side effects across runs, newest first; ``status=needs_reconciliation`` for the
    reconciliation page. Nothing for a user who may not view runs."""
    if not user.is_authenticated or not user.has_perm(VIEW):
        return SideEffect.objects.none()
    effects = SideEffect.objects.select_related("run", "attempt")
    if status == "needs_reconciliation":
        return effects.filter(needs_reconciliation_q()).order_by("created_at", "operation_id")
    if status:
        if status not in S.values:
            raise HoldpointError(
                "invalid_input",
                f"status must be one of {', '.join([*S.values, 'needs_reconciliation'])}.",
            )
        effects = effects.filter(status=status)
    return effects.order_by("-created_at", "-operation_id")


def side_effect_get_for_user(
    *, user: Actor, operation_id: str, perm: str | None = None
) -> SideEffect:
    """Return the side effect, or raise Http404 (no such effect, or an outsider) /
    PermissionDenied (may see, may not do ``perm``)."""
    if not user.is_authenticated or not user.has_perm(VIEW):
        raise Http404("No such side effect.")
    effect = SideEffect.objects.select_related("run").filter(pk=operation_id).first()
    if effect is None:
        raise Http404("No such side effect.")
    if perm is not None and not user.has_perm(perm):
        raise PermissionDenied(permission_denied_text(perm))
    return effect


# --- The MCP gateway's tool rules -----------------------------------------------------------


def agent_known(name: str) -> bool:
    """Whether ``name`` is an agent of the registry (in-process or declared)."""
    from runs.agents import all_agent_specs

    return len(name) <= 100 and any(spec.name == name for spec in all_agent_specs())


def tool_rules_for_user(*, user: Actor, agent: str, write: bool = False) -> list[ToolRule]:
    """The rules of ``agent``'s gateway tools for a person: ``runs.view_run`` to see them,
    ``ledger.change_toolrule`` too when ``write`` (``PermissionDenied``); an unknown agent
    is ``Http404`` (after the permission, as for an agent's pause)."""
    if not user.has_perm(VIEW):
        raise PermissionDenied(permission_denied_text(VIEW))
    if write and not user.has_perm(CHANGE_TOOL_RULES):
        raise PermissionDenied(permission_denied_text(CHANGE_TOOL_RULES))
    if not agent_known(agent):
        raise Http404("No such agent.")
    return tool_rules_for(agent)
