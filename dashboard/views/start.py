"""Start a run: pick an agent from the registry, fill in the form of its input schema."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods
from django_htmx.http import HttpResponseClientRedirect

from dashboard.actions import (
    HtmxHttpRequest,
    dashboard_view,
    form_key,
    new_idempotency_key,
    perform_once,
    redirect_after_post,
)
from dashboard.forms import PreapprovalForm
from dashboard.schema_forms import SchemaForm
from runs import services
from runs.agents import AgentSpec, all_agent_specs, approval_policy_for
from runs.approvals import why_not_preapprove
from runs.audit import DASHBOARD
from runs.errors import HoldpointError
from runs.schemas import compile_schema
from runs.selectors import APPROVE, START
from runs.services import session_identity

EMPTY_INPUT: dict[str, Any] = {"type": "object", "properties": {}}


def _input_form(spec: AgentSpec, data: Any = None) -> SchemaForm:
    schema = compile_schema(spec.input_schema) if spec.input_schema else EMPTY_INPUT
    return SchemaForm(schema, data, prefix="input", allow_buttons=False)


@dashboard_view()
@require_http_methods(["GET", "POST"])
def run_start(request: HtmxHttpRequest) -> HttpResponse:
    if not request.user.has_perm(START):
        raise PermissionDenied(_("Only operators can start runs."))
    specs = all_agent_specs()
    name = request.POST.get("agent") if request.method == "POST" else request.GET.get("agent")
    spec = next((s for s in specs if s.name == name), None)
    context: dict[str, Any] = {"specs": specs, "spec": spec, "key": new_idempotency_key()}
    if spec is None:
        if request.method == "POST":
            context["message"] = _("Choose an agent first.")
        return render(request, "dashboard/run_start.html", context, status=400 if name else 200)
    try:
        form = _input_form(spec, request.POST if request.method == "POST" else None)
    except HoldpointError as error:
        context["message"] = _("This agent's input schema is broken: %(detail)s") % {
            "detail": error.detail
        }
        return render(request, "dashboard/run_start.html", context, status=200)
    context["form"] = form
    # Approving steps at start is an approval: only people who may approve see the field.
    may_preapprove = request.user.has_perm(APPROVE)
    preapproval = PreapprovalForm(request.POST if request.method == "POST" else None)
    context["preapproval"] = preapproval if may_preapprove else None
    if may_preapprove:
        # The agent's approval policy may not let this person approve their own run: say
        # why instead of offering a field the service would refuse.
        why = why_not_preapprove(approval_policy_for(spec.name)[0], request.user)
        if why is not None:
            context["preapproval"] = None
            context["preapproval_blocked"] = why.detail
    if request.method == "GET":
        return render(request, "dashboard/run_start.html", context)
    if not preapproval.is_valid():
        if not may_preapprove:
            raise PermissionDenied(_("Only approvers can approve steps when a run starts."))
        context["message"] = _("Check the highlighted fields. No run was started.")
        return render(request, "dashboard/run_start.html", context, status=422)
    approvals = preapproval.cleaned_data["approvals"]
    if approvals and not may_preapprove:
        raise PermissionDenied(_("Only approvers can approve steps when a run starts."))
    key = form_key(request)
    if key is None:
        context["message"] = _("This form is out of date. Please try again.")
        return render(request, "dashboard/run_start.html", context, status=400)
    if not form.is_valid():
        context["message"] = _("Check the highlighted fields. No run was started.")
        return render(request, "dashboard/run_start.html", context, status=422)
    value = form.value

    def start() -> dict[str, Any]:
        run = services.run_start(
            agent=spec.name,
            input=value,
            user=request.user,
            approvals=approvals or None,
            via=DASHBOARD,
            identity=session_identity(request.session),
        )
        return {"run_id": run.id}

    body: dict[str, Any] = {"agent": spec.name, "input": value}
    if approvals:
        body["approvals"] = approvals
    outcome, _replayed = perform_once(request, key=key, body=body, call=start)
    if not outcome.ok:
        if outcome.extra.get("errors"):
            form.add_errors(outcome.extra["errors"])
        context["message"] = outcome.detail
        return render(request, "dashboard/run_start.html", context, status=outcome.status)
    messages.success(request, _("Run started."))
    url = reverse("run-detail", args=[outcome.extra["run_id"]])
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return redirect_after_post(url)
