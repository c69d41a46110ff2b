"""A run's side-effect report and the rows of the reconciliation list: each effect as a
person reads it, with fresh form keys for its actions (the report's page, the run page's
panel, and the actions' replies share them)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.translation import gettext as _

from dashboard.actions import new_idempotency_key
from dashboard.pages.runs import run_context
from dashboard.present import as_text, before_after_diff, parse_time, value_rows
from ledger import services
from ledger.models import Reversibility, SideEffect, SideEffectStatus
from ledger.selectors import report_for_run, side_effect_rows
from runs.access import Actor
from runs.agents import run_label
from runs.models import Run
from runs.selectors import RETRY, run_get_for_user

S = SideEffectStatus
STATUS_TONE = {
    S.PENDING: "warn",
    S.UNKNOWN: "warn",
    S.CONFIRMED: "good",
    S.FAILED: "neutral",
    S.COMPENSATED: "neutral",
    S.COMPENSATION_FAILED: "bad",
}


def _plan(effect_row: dict[str, Any]) -> dict[str, Any] | None:
    """The planned compensation in human terms: what the target is now, what it will be,
    and whether something was written on top since (issue 15, point 4)."""
    effect = SideEffect.objects.filter(pk=effect_row["operation_id"]).first()
    preview = services.compensation_preview(effect) if effect is not None else None
    if preview is None:
        return None
    name = str(preview.get("document") or effect_row["target"])
    return {
        **preview,
        "diff": before_after_diff(preview.get("now"), preview.get("after"), name),
    }


def _run_label(run_id: str) -> str:
    found = Run.objects.filter(pk=run_id).values_list("agent", "input").first()
    return run_label(found[0], found[1], run_id) if found else run_id


def _approval_edit_diff(approval: Any) -> list[Any]:
    """An approval that edited the plan (issue 18): the plan against what was approved."""
    if not isinstance(approval, dict) or "edited" not in approval:
        return []
    return before_after_diff(approval.get("original"), approval["edited"], _("request"))


def effect_row(
    effect_row: dict[str, Any], *, user: Actor, origin: str, **extra: Any
) -> dict[str, Any]:
    """A side effect as the templates show it, with fresh form keys for its actions."""
    row = dict(effect_row)
    row.update(
        tone=STATUS_TONE.get(row["status"], "neutral"),
        status_label=str(S(row["status"]).label) if row["status"] in S.values else row["status"],
        irreversible=row["reversibility"] == Reversibility.IRREVERSIBLE,
        reversibility_label=(
            str(Reversibility(row["reversibility"]).label)
            if row["reversibility"] in Reversibility.values
            else row["reversibility"]
        ),
        compensating_text=as_text(row["compensating_action"]) if row["compensating_action"] else "",
        compensating_rows=value_rows(row["compensating_action"]),
        error_text=as_text(row["error"]) if row["error"] else "",
        result_text=as_text(row["result"]) if row["result"] is not None else "",
        request_text=as_text(row["request"]) if row["request"] else "",
        can_act=user.has_perm(RETRY),
        approval_at=parse_time((row.get("approval") or {}).get("at")),
        approval_edit_diff=_approval_edit_diff(row.get("approval")),
        run_label=_run_label(row["run_id"]),
        reconcile_key=new_idempotency_key(),
        compensate_key=new_idempotency_key(),
        origin=origin,
        form=None,
        message="",
        message_level="info",
    )
    row.update(extra)
    if row["can_compensate"] and row["can_act"] and "plan" not in extra:
        row["plan"] = _plan(effect_row)
    return row


def effect_rows(effects: list[SideEffect], *, user: Actor, origin: str) -> list[dict[str, Any]]:
    return [effect_row(r, user=user, origin=origin) for r in side_effect_rows(effects, user=user)]


def report_context(
    request: HttpRequest, run_id: str, *, origin: str = "report", **extra: Any
) -> dict[str, Any]:
    run = run_get_for_user(user=request.user, run_id=run_id)
    report = report_for_run(run.id, user=request.user)
    for group in report["groups"]:
        group["rows"] = [effect_row(r, user=request.user, origin=origin) for r in group["rows"]]
    context = {"run": run, "report": report, "origin": origin, **extra}
    if origin == "run":
        # The run page's controls and status change with the ledger (a reconciled effect
        # lets a retry through): send them along, swapped out of band.
        context = {**run_context(request, run), **context}
    return context
