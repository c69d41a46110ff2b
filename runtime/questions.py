"""What a step asks and what becomes of what people approved: one implementation, in the
agent SDK (``holdpoint_client/approvals.py``), named here for the server's modules."""

from __future__ import annotations

from holdpoint_client.approvals import (
    APPROVAL_OPTIONS,
    MAX_CHOICES,
    OwedApproval,
    approval_note,
    approval_options,
    changed_words,
    choice_schema,
    no_edit_to_refuse,
    not_applied_message,
    not_applied_reason,
    owed_approval,
    people_words,
    typed_value,
    value_words,
)

__all__ = [
    "APPROVAL_OPTIONS",
    "MAX_CHOICES",
    "OwedApproval",
    "approval_note",
    "approval_options",
    "changed_words",
    "choice_schema",
    "no_edit_to_refuse",
    "not_applied_message",
    "not_applied_reason",
    "owed_approval",
    "people_words",
    "typed_value",
    "value_words",
]
