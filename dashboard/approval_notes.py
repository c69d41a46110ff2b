"""The approval card's sentence about an earlier approval that was not applied (issue 24):
the words are ``runs/approval_notes.py``'s; here the agent's parts are isolated (<bdi>)."""

from __future__ import annotations

from typing import Any

from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe

from dashboard.present import isolate
from runs.approval_notes import note_sentence, without_notes

__all__ = ["not_applied_sentence", "without_notes"]


def not_applied_sentence(context: Any) -> SafeString | str:
    """ "Asked again after alice and bob approved: … Their edit (…) was not applied.", or
    the refused edit's sentence; empty when the request replaces no approval."""
    found = note_sentence(context)
    if found is None:
        return ""
    template, parts = found
    escaped = str(conditional_escape(template))
    # The template is escaped and every part isolated (escaped inside <bdi>).
    return mark_safe(escaped % {k: isolate(v) for k, v in parts.items()})  # noqa: S308
