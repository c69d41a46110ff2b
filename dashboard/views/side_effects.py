"""Dashboard pages of the ledger: side effects needing a person, a run's report, and the
reconcile and compensate actions.

The run page fetches the report with ``hx-get`` (``runs`` never imports ``ledger``);
these views use the run store's selectors and the dashboard's shared helpers, which
is the direction dependencies point (``ledger -> runs``). Reconciling and compensating
need ``runs.retry_run``, as in the API: they decide whether a run may go on. The rows
and the report are built in ``dashboard.pages.side_effects``.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_POST

from dashboard.actions import (
    HtmxHttpRequest,
    Outcome,
    dashboard_view,
    redirect_after_post,
    safe_next,
    submit_action,
)
from dashboard.pages.side_effects import effect_row, effect_rows, report_context
from ledger import services
from ledger.models import SideEffect, SideEffectStatus
from ledger.selectors import (
    side_effect_get_for_user,
    side_effect_rows,
    side_effects_for_run,
    side_effects_for_user,
)
from runs.selectors import RETRY, run_get_for_user

S = SideEffectStatus
TABS = [
    ("needs", gettext_lazy("Needs reconciliation")),
    ("all", gettext_lazy("All side effects")),
]
PAGE = 100


class ReconcileForm(forms.Form):
    outcome = forms.ChoiceField(
        choices=[
            ("confirmed", gettext_lazy("Happened")),
            ("not_applied", gettext_lazy("Did not happen")),
        ],
        error_messages={"required": gettext_lazy("Choose Mark happened or Mark not happened.")},
    )
    external_reference = forms.CharField(required=False, max_length=500, strip=True)
    note = forms.CharField(
        max_length=2000,
        strip=True,
        error_messages={
            "required": gettext_lazy("Say what you checked and how; the note is kept with the run.")
        },
    )


class CompensateForm(forms.Form):
    reason = forms.CharField(
        max_length=2000,
        strip=True,
        error_messages={
            "required": gettext_lazy("Say why you undo it; the reason is kept with the run.")
        },
    )
    force = forms.BooleanField(required=False)


ORIGINS = ("list", "report", "run")


def _origin(value: str | None, default: str = "list") -> str:
    """Where a row is shown: the reconciliation list, the report page, or the run page."""
    return value if value in ORIGINS else default


@dashboard_view()
@require_GET
def side_effect_list(request: HtmxHttpRequest) -> HttpResponse:
    """Everything unknown or left pending by a gone worker: a person decides (docs/dashboard.md)."""
    tab = request.GET.get("tab", "needs")
    tab = tab if tab in dict(TABS) else "needs"
    status = "needs_reconciliation" if tab == "needs" else None
    effects = list(side_effects_for_user(user=request.user, status=status)[:PAGE])
    needs = side_effects_for_user(user=request.user, status="needs_reconciliation").count()
    context = {
        "tab": tab,
        "tabs": TABS,
        "rows": effect_rows(effects, user=request.user, origin="list"),
        "needs_count": needs,
    }
    return render(request, "dashboard/side_effects.html", context)


@dashboard_view(require_view=False)
@require_GET
def run_report(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """The run's side-effect report in five groups; a fragment for the run page's hx-get."""
    if request.htmx:
        origin = _origin(request.GET.get("origin"), "report")
        context = report_context(request, run_id, origin=origin)
        return render(request, "dashboard/report.html#report-fragment", context)
    return render(request, "dashboard/report.html", report_context(request, run_id))


@dashboard_view(require_view=False)
@require_GET
def retry_preview(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """What a retry does with the side effects already recorded (docs/dashboard.md)."""
    run = run_get_for_user(user=request.user, run_id=run_id)
    effects = list(side_effects_for_run(run.id))
    # The ledger's own decision table says what a retry's step does with each record.
    group_of = {"reuse": "reused", "look_up": "looked_up", "refuse": "blocked", "act": "again"}
    groups: dict[str, list[SideEffect]] = {name: [] for name in group_of.values()}
    for effect in effects:
        groups[group_of[services.decision_for(effect.status)]].append(effect)
    return render(
        request,
        "dashboard/report.html#retry-preview",
        {"run": run, "groups": groups, "total": len(effects)},
    )


def _reply(
    request: HtmxHttpRequest,
    effect: SideEffect,
    *,
    outcome: Outcome,
    message: str,
    form: ReconcileForm | CompensateForm | None = None,
) -> HttpResponse:
    """After a POST: a redirect without JavaScript, else the refreshed row or report."""
    level = "success" if outcome.ok else "error"
    origin = _origin(request.POST.get("origin"))
    if not request.htmx:
        messages.add_message(request, messages.SUCCESS if outcome.ok else messages.ERROR, message)
        fallback = {
            "list": reverse("ledger:side-effects"),
            "report": reverse("ledger:run-report", args=[effect.run_id]),
            "run": reverse("run-detail", args=[effect.run_id]),
        }[origin]
        return redirect_after_post(safe_next(request, fallback))
    effect.refresh_from_db()
    if origin in ("report", "run"):
        context = report_context(
            request,
            effect.run_id,
            origin=origin,
            message=message,
            message_level=level,
            focus=effect.operation_id,
            refresh_run=origin == "run",
        )
        if form is not None:
            for group in context["report"]["groups"]:
                for row in group["rows"]:
                    if row["operation_id"] == effect.operation_id:
                        row["form"] = form
        return render(
            request, "dashboard/report.html#report-fragment", context, status=outcome.status
        )
    row = effect_row(
        side_effect_rows([effect], user=request.user)[0],
        user=request.user,
        origin="list",
        form=form,
        message=message,
        message_level=level,
    )
    needs = side_effects_for_user(user=request.user, status="needs_reconciliation").count()
    return render(
        request,
        "dashboard/side_effects.html#effect-reply",
        {"row": row, "needs_count": needs},
        status=outcome.status,
    )


def _out_of_date(request: HtmxHttpRequest, effect: SideEffect) -> HttpResponse:
    out_of_date = Outcome(ok=False, code="malformed_request", status=400)
    message = _("This form is out of date; here is the current state. Please try again.")
    return _reply(request, effect, outcome=out_of_date, message=message)


def _invalid(
    request: HtmxHttpRequest,
    effect: SideEffect,
    form: ReconcileForm | CompensateForm,
    message: str,
) -> HttpResponse:
    if not request.htmx:
        # Without JavaScript the page comes back with the values and errors in place.
        return _invalid_page(request, effect, form, message)
    invalid = Outcome(ok=False, code="invalid_input", status=422)
    return _reply(request, effect, outcome=invalid, message=message, form=form)


@dashboard_view(require_view=False)
@require_POST
def side_effect_reconcile(request: HtmxHttpRequest, operation_id: str) -> HttpResponse:
    """A person says how an unknown effect really went: happened (with its reference) or not."""
    effect = side_effect_get_for_user(user=request.user, operation_id=operation_id, perm=RETRY)

    def reconcile(data: dict[str, Any]) -> dict[str, Any]:
        settled = services.side_effect_reconcile(
            operation_id=effect.operation_id,
            outcome=data["outcome"],
            external_reference=data["external_reference"] or None,
            note=data["note"],
            user=request.user,
        )
        return {"status": settled.status}

    form = ReconcileForm(request.POST)
    done = submit_action(
        request,
        ids={"operation_id": effect.operation_id},
        form=form,
        perform=reconcile,
        stale=lambda: _out_of_date(request, effect),
        invalid=lambda _form: _invalid(
            request, effect, form, _("Check the highlighted fields. Nothing was recorded.")
        ),
    )
    if isinstance(done, HttpResponse):
        return done
    outcome, data = done.outcome, done.data
    if outcome.ok and data["outcome"] == "confirmed":
        message = _("Marked as happened. The run may be retried; this effect will not be repeated.")
    elif outcome.ok:
        message = _(
            "Marked as not happened. A retry of the run may do it again, with the same key."
        )
    else:
        message = outcome.detail
    return _reply(request, effect, outcome=outcome, message=message)


@dashboard_view(require_view=False)
@require_POST
def side_effect_compensate(request: HtmxHttpRequest, operation_id: str) -> HttpResponse:
    """Undo (or offset) an effect that happened with its tool's compensating action.

    A reason is required; when the target changed after the effect, the person must tick
    "restore anyway" (the service refuses ``target_changed`` otherwise)."""
    effect = side_effect_get_for_user(user=request.user, operation_id=operation_id, perm=RETRY)

    def compensate(data: dict[str, Any]) -> dict[str, Any]:
        done = services.side_effect_compensate(
            operation_id=effect.operation_id,
            user=request.user,
            reason=data["reason"],
            force=data["force"],
        )
        return {"status": done.status}

    form = CompensateForm(request.POST)
    done = submit_action(
        request,
        ids={"operation_id": effect.operation_id},
        form=form,
        perform=compensate,
        stale=lambda: _out_of_date(request, effect),
        invalid=lambda _form: _invalid(
            request, effect, form, _("Check the highlighted fields. Nothing was undone.")
        ),
    )
    if isinstance(done, HttpResponse):
        return done
    outcome = done.outcome
    if outcome.ok and outcome.extra.get("status") == S.COMPENSATED:
        message = _("Undone: the compensating action ran.")
    elif outcome.ok:
        message = _("The compensation failed; it may be tried again (same key, so never twice).")
        outcome = Outcome(ok=False, code="compensation_failed", status=200, extra=outcome.extra)
    elif outcome.code == "target_changed":
        message = _(
            "The target changed after this effect: another version is on top. Tick "
            "“Restore anyway” if you mean to undo the newer versions too."
        )
        form.add_error("force", message)
        if not request.htmx:
            return _invalid_page(request, effect, form, message)
        return _reply(request, effect, outcome=outcome, message=message, form=form)
    else:
        message = outcome.detail
    return _reply(request, effect, outcome=outcome, message=message)


def _invalid_page(
    request: HtmxHttpRequest,
    effect: SideEffect,
    form: ReconcileForm | CompensateForm,
    message: str,
) -> HttpResponse:
    if request.POST.get("origin") in ("report", "run"):
        context = report_context(
            request,
            effect.run_id,
            message=message,
            message_level="error",
            focus=effect.operation_id,
        )
        for group in context["report"]["groups"]:
            for row in group["rows"]:
                if row["operation_id"] == effect.operation_id:
                    row["form"] = form
        return render(request, "dashboard/report.html", context, status=422)
    tab = "needs" if isinstance(form, ReconcileForm) else "all"
    status = "needs_reconciliation" if tab == "needs" else None
    effects = list(side_effects_for_user(user=request.user, status=status)[:PAGE])
    rows = effect_rows(effects, user=request.user, origin="list")
    for row in rows:
        if row["operation_id"] == effect.operation_id:
            row.update(form=form, message=message, message_level="error")
    context = {
        "tab": tab,
        "tabs": TABS,
        "rows": rows,
        "needs_count": side_effects_for_user(
            user=request.user, status="needs_reconciliation"
        ).count(),
    }
    return render(request, "dashboard/side_effects.html", context, status=422)
