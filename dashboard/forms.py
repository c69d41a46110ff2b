"""The dashboard's fixed forms: approve/deny, cancel, retry, steps approved at start.

Answers to input requests and agent inputs are generated from JSON Schema in
``dashboard.schema_forms``. These forms only validate what a person typed; the
services decide whether the action is still allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from runs.models import Checkpoint, InputRequest
from runs.states import RequestKind

MAX_REASON = 2000


class ApprovalForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[("approve", _("Approve")), ("deny", _("Deny")), ("respond", _("Send back"))],
        error_messages={"required": _("Choose Approve or Deny.")},
    )
    comment = forms.CharField(
        required=False,
        max_length=MAX_REASON,
        strip=True,
        widget=forms.Textarea,
        label=_("Comment"),
    )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # a reason is required to deny, so the agent and the audit trail learn why.
        if cleaned.get("decision") == "deny" and not cleaned.get("comment"):
            self.add_error("comment", _("Say why you deny it; the reason is kept with the run."))
        if cleaned.get("decision") == "respond" and not cleaned.get("comment"):
            self.add_error(
                "comment", _("Write what the agent should change; the comment goes back to it.")
            )
        return cleaned

    def value(self) -> dict[str, Any]:
        value: dict[str, Any] = {"decision": self.cleaned_data["decision"]}
        if self.cleaned_data.get("comment"):
            value["comment"] = self.cleaned_data["comment"]
        return value


@dataclass
class Submission:
    """What a person sent to answer one request, checked by the forms the card shows (and
    only those: nothing of the card's presentation is built before the service decides)."""

    valid: bool
    value: Any


def answer_submission(req: InputRequest, data: Any) -> Submission:
    """The value a POST of the request's card carries: an approval's decision (with the
    arguments as edited, when the approval offers them), or the answer to a question by
    its schema's form; ``valid`` False when a form refuses it (the card, built then, shows
    why)."""
    from dashboard.schema_forms import SchemaForm
    from runs.approvals import current_value, editable_of

    if req.kind == RequestKind.AUTH_REQUIRED:
        approval = ApprovalForm(data)
        if not approval.is_valid():
            return Submission(False, None)
        value = approval.value()
        editable = editable_of(req.action)
        if value["decision"] == "approve" and editable is not None:
            # The arguments as the form shows them: the service keeps them only when they
            # differ from what is on the table (an unchanged form is a plain approval).
            edit_form = SchemaForm(
                editable.schema,
                data,
                prefix=f"{req.id}-edit",
                initial=current_value(editable, req.edited),
                allow_buttons=False,
            )
            if not edit_form.is_valid():
                return Submission(False, None)
            value["edited"] = edit_form.value
        return Submission(True, value)
    form = SchemaForm(req.accepted_schema, data, prefix=req.id)
    valid = form.is_valid()
    return Submission(valid, form.value if valid else None)


MAX_PREAPPROVALS = 100
_STEP_SEPARATORS = re.compile(r"[\s,]+")


class PreapprovalForm(forms.Form):
    """Steps approved when the run starts (``approvals``). Only people with the approve
    permission see it; the view refuses it from anyone else, and so does the service."""

    approvals = forms.CharField(
        required=False,
        max_length=4000,
        strip=True,
        label=_("Approve steps now"),
        help_text=_(
            "Step ids, separated by commas or spaces (e.g. notify.email). This is your "
            "approval: the run records you as the approver of what these steps do."
        ),
    )

    def clean_approvals(self) -> list[str]:
        raw = self.cleaned_data.get("approvals") or ""
        steps = list(dict.fromkeys(s for s in _STEP_SEPARATORS.split(raw) if s))
        if len(steps) > MAX_PREAPPROVALS or any(len(s) > 100 for s in steps):
            raise forms.ValidationError(
                _("Name at most 100 steps, each at most 100 characters long.")
            )
        return steps


class CancelForm(forms.Form):
    reason = forms.CharField(
        max_length=MAX_REASON,
        strip=True,
        widget=forms.Textarea,
        label=_("Reason"),
        error_messages={"required": _("Say why the run is cancelled; it is kept with the run.")},
    )


class RetryForm(forms.Form):
    from_checkpoint = forms.ChoiceField(label=_("Continue from"), required=False)
    reason = forms.CharField(
        max_length=MAX_REASON,
        strip=True,
        widget=forms.Textarea,
        label=_("Reason"),
        error_messages={"required": _("Say why you retry; it is kept with the run.")},
    )

    def __init__(self, *args: Any, checkpoints: list[Checkpoint], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices: list[tuple[str, str]] = [("", str(_("The latest checkpoint")))]
        choices += [(c.id, f"#{c.number} · {c.step}") for c in checkpoints]
        self.fields["from_checkpoint"].choices = choices  # type: ignore[attr-defined]
