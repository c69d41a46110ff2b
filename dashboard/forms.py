"""The dashboard's fixed forms: approve/deny, cancel, retry.

Answers to input requests and agent inputs are generated from JSON Schema in
``dashboard.schema_forms``. These forms only validate what a person typed; the
services decide whether the action is still allowed.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from runs.models import Checkpoint

MAX_REASON = 2000


class ApprovalForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[("approve", _("Approve")), ("deny", _("Deny"))],
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
        # UX 9: a reason is required to deny, so the agent and the audit trail learn why.
        if cleaned.get("decision") == "deny" and not cleaned.get("comment"):
            self.add_error("comment", _("Say why you deny it; the reason is kept with the run."))
        return cleaned

    def value(self) -> dict[str, Any]:
        value: dict[str, Any] = {"decision": self.cleaned_data["decision"]}
        if self.cleaned_data.get("comment"):
            value["comment"] = self.cleaned_data["comment"]
        return value


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
