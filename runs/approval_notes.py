"""What a request says about an earlier approval that was not applied (issue 24), in
words: one home for the sentence the approval card shows and a notification can send.

The runtime writes a note into the context of the request it asks instead
(``runtime/questions.py``): ``superseded_approval`` when the step asked anew (the target
changed while the approval waited), ``refused_edit`` when the agent could not use the edit
people approved (``EditRefused``). Each is ``{request_id, action, target, approved_by,
edited, reason}``.
"""

from __future__ import annotations

import json
from typing import Any

from django.utils.translation import gettext as _

NOTE_KEYS = ("superseded_approval", "refused_edit")


def without_notes(context: Any) -> Any:
    """The agent's context without the runtime's notes (they are said as a sentence)."""
    if not isinstance(context, dict) or not any(key in context for key in NOTE_KEYS):
        return context
    return {k: v for k, v in context.items() if k not in NOTE_KEYS}


def _people(names: Any) -> str:
    names = [str(n) for n in names or [] if n]
    if not names:
        return _("someone")
    if len(names) == 1:
        return names[0]
    return _("%(people)s and %(last)s") % {"people": ", ".join(names[:-1]), "last": names[-1]}


def _short(value: Any) -> str:
    """An edit as people read it: ``accepted_versions: v1, v3``."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_short(v)}" for k, v in value.items())
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return ", ".join(str(v) for v in value)
    if isinstance(value, str | int | float | bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def note_sentence(context: Any) -> tuple[str, dict[str, str]] | None:
    """The sentence about the note in ``context``: a translated template and its parts
    (the agent's words, at most 400 characters each), or None when there is no note.
    ``template % parts`` is the plain text; a page isolates each part first."""
    if not isinstance(context, dict):
        return None
    refused = context.get("refused_edit")
    if isinstance(refused, dict):
        return _(
            "Asked again: the agent could not use the edit %(people)s approved "
            "(%(edit)s): %(reason)s. Approve the plan as shown, or edit it again."
        ), _parts(
            people=_people(refused.get("approved_by")),
            edit=_short(refused.get("edited")),
            reason=str(refused.get("reason") or ""),
        )
    superseded = context.get("superseded_approval")
    if not isinstance(superseded, dict):
        return None
    people = _people(superseded.get("approved_by"))
    reason = str(superseded.get("reason") or "")
    if superseded.get("edited") is not None:
        return _(
            "Asked again after %(people)s approved: %(reason)s. Their edit (%(edit)s) "
            "was not applied."
        ), _parts(people=people, reason=reason, edit=_short(superseded["edited"]))
    return _(
        "Asked again after %(people)s approved: %(reason)s. Their approval was not applied."
    ), _parts(people=people, reason=reason)


def _parts(**parts: str) -> dict[str, str]:
    return {k: v if len(v) <= 400 else v[:399] + "…" for k, v in parts.items()}


def note_text(context: Any) -> str:
    """The sentence as plain text (a notification's), or empty."""
    found = note_sentence(context)
    if found is None:
        return ""
    template, parts = found
    return template % parts
