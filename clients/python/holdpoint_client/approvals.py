"""What a step asks, in shapes the runtime checks, and what becomes of what people approved
(docs/agents.md, approvals): the answer schema of ``ctx.choose``, the ``approval=`` of
``ctx.side_effect``, typed values (``holdpoint_client/typed.py``) handed to a step.

An attempt resumed with an answered approval that said approve (the lease's
``resume_request``) owes the approvers that approval: a ``ctx.approve`` or
``ctx.side_effect`` the answer covers uses it; a new hold point instead carries a note
saying why it was not applied (``superseded_approval``); a step that ends or skips it
without using it fails the attempt ``ApprovalNotApplied``. ``EditRefused`` asks the same
approval again with ``refused_edit``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from holdpoint_client.typed import TypedValueError, parse
from holdpoint_client.types import Deterministic, EditRefused

MAX_CHOICES = 50


def choice_schema(options: Any) -> dict[str, Any]:
    """The answer schema of ``ctx.choose``: ``{"choice": one of the options}``."""
    if isinstance(options, dict):
        pairs = [(value, str(label)) for value, label in options.items()]
    elif isinstance(options, list | tuple):
        pairs = [(value, str(value)) for value in options]
    else:
        raise TypeError("options must be a list of values or a dict of value to label.")
    values = [value for value, _ in pairs]
    if not 1 <= len(values) <= MAX_CHOICES or len(set(values)) != len(values):
        raise ValueError(f"choose takes 1 to {MAX_CHOICES} different options.")
    if not all(isinstance(v, str) and 0 < len(v) <= 200 for v in values):
        raise ValueError("Each option is a string of 1 to 200 characters.")
    return {
        "type": "object",
        "properties": {
            "choice": {"oneOf": [{"const": value, "title": label[:200]} for value, label in pairs]}
        },
        "required": ["choice"],
        "additionalProperties": False,
    }


APPROVAL_OPTIONS = ("prompt", "expires_in", "context", "title")


def approval_options(approval: Any) -> dict[str, Any]:
    """Check ``ctx.side_effect(…, approval=…)``: the question an irreversible call asks."""
    if approval is None:
        return {}
    if not isinstance(approval, dict):
        raise TypeError('approval is a dict: {"prompt", "expires_in", "context", "title"}.')
    unknown = set(approval) - set(APPROVAL_OPTIONS)
    if unknown:
        raise TypeError(
            f"approval takes {', '.join(APPROVAL_OPTIONS)}; not {', '.join(sorted(unknown))}."
        )
    prompt = approval.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise TypeError("approval prompt is a non-empty string.")
    title = approval.get("title")
    if title is not None and (not isinstance(title, str) or not 0 < len(title.strip()) <= 200):
        raise TypeError("approval title is a string of 1 to 200 characters.")
    context = approval.get("context")
    if context is not None and not isinstance(context, dict):
        raise TypeError("approval context is a dict.")
    return dict(approval)


def typed_value(tp: type | None, value: Any, what: str) -> Any:
    """``value`` as an instance of ``tp`` (a Pydantic model or a dataclass), or as it is.

    The JSON Schema of ``tp`` already accepted it at the door; a type that still refuses
    it (a validator the schema cannot say) fails the step, deterministic, with pointers.
    """
    if tp is None:
        return value
    try:
        return parse(tp, value)
    except TypedValueError as exc:
        raise Deterministic(f"The {what} does not make a {tp.__name__}: {exc}") from None


@dataclass
class OwedApproval:
    """An approval the attempt was resumed with: what it showed, who approved, their edit."""

    request_id: str
    step_id: str
    action: dict[str, Any]
    approved_by: tuple[str, ...]
    edited: Any = None
    # A ctx call used it, or a new hold point told the approvers why it was not applied.
    settled: bool = False


def owed_approval(resume_request: Any) -> OwedApproval | None:
    """The approval an attempt resumed with (``lease.resume_request``) when it said approve;
    None for an answer, a pause, a denial or a request sent back."""
    if not isinstance(resume_request, dict) or resume_request.get("kind") != "auth_required":
        return None
    answer = resume_request.get("answer")
    if not isinstance(answer, dict) or answer.get("decision") != "approve":
        return None
    approvers = answer.get("approvers")
    by = resume_request.get("answered_by")
    names = (
        tuple(str(a) for a in approvers)
        if isinstance(approvers, list) and approvers
        else ((str(by),) if by else ())
    )
    action = resume_request.get("action")
    return OwedApproval(
        request_id=str(resume_request.get("request_id") or ""),
        step_id=str(resume_request.get("step_id") or ""),
        action=dict(action) if isinstance(action, dict) else {},
        approved_by=names,
        edited=answer.get("edited"),
    )


def people_words(names: Any) -> str:
    """``alice``, ``alice and bob``, ``alice, bob and carol``."""
    names = [str(n) for n in names or ()]
    if not names:
        return "a person"
    if len(names) == 1:
        return names[0]
    return f"{', '.join(names[:-1])} and {names[-1]}"


def _short(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) and len(str(value)) <= 60


def value_words(value: Any) -> str:
    """A short value as people read it: ``v1, v3`` for a list, ``key: value; …`` for an
    object, JSON for anything deeper (at most 300 characters)."""
    if isinstance(value, list) and all(_short(v) for v in value):
        text = ", ".join(str(v) for v in value) or "(none)"
    elif isinstance(value, dict):
        text = "; ".join(f"{k}: {value_words(v)}" for k, v in value.items())
    elif _short(value):
        text = str(value)
    else:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 300 else text[:299] + "…"


def changed_words(name: str, before: Any, after: Any) -> str:
    """``config changed while the approval waited (version: 5 → 6)``: what a re-read found
    different, with up to three short values that differ."""
    text = f"{name} changed while the approval waited"
    if isinstance(before, dict) and isinstance(after, dict):
        diffs = [
            f"{k}: {before[k]} → {after[k]}"
            for k in sorted(set(before) & set(after), key=str)
            if _short(before[k]) and _short(after[k]) and before[k] != after[k]
        ][:3]
        if diffs:
            text += f" ({', '.join(diffs)})"
    elif _short(before) and _short(after):
        text += f" ({before} → {after})"
    return text


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def not_applied_reason(
    owed: OwedApproval,
    *,
    changed: list[tuple[str, Any, Any]],
    asked: dict[str, Any] | None = None,
    asked_kind: str = "",
    asked_key: str = "",
    skipped: list[str] | None = None,
) -> str:
    """Why the step did not use ``owed``: what changed while it waited (``changed``: name,
    before, after of each ``ctx.observe`` that differs), then what the step did instead:
    asked again (``asked``: the new approval's action, ``asked_key`` its hold-point key),
    asked a question, found nothing
    left to change (``skipped``), or went on without it."""
    parts = [changed_words(name, before, after) for name, before, after in changed]
    old = owed.action
    if asked_kind == "auth_required" and asked is not None:
        if str(asked.get("target", "")) != str(old.get("target", "")):
            parts.append(f"the target is now {asked.get('target')} (it was {old.get('target')})")
        elif str(asked.get("tool", "")) != str(old.get("tool", "")) or str(
            asked.get("action", "")
        ) != str(old.get("action", "")):
            parts.append(f"the step now asks about {asked.get('action') or asked.get('tool')}")
        elif _canonical(asked.get("change")) != _canonical(old.get("change")):
            parts.append("the planned change is different now")
        else:
            parts.append(f"the step asked again under a new key ({asked_key or 'unnamed'})")
    elif asked_kind:
        parts.append("the step asked a new question instead")
    elif skipped:
        parts.append(
            "the planned change is empty now (nothing is left to change), so the step "
            "skipped the approval"
        )
    else:
        parts.append("the step went on without using it")
    return "; ".join(parts)


def approval_note(owed: OwedApproval, reason: str) -> dict[str, Any]:
    """What a new hold point's ``context`` says about an approval it replaces
    (``superseded_approval``) or whose edit the agent refused (``refused_edit``)."""
    return {
        "request_id": owed.request_id,
        "action": str(owed.action.get("action") or owed.action.get("tool") or ""),
        "target": str(owed.action.get("target") or ""),
        "approved_by": list(owed.approved_by),
        "edited": owed.edited,
        "reason": reason,
    }


def not_applied_message(owed: OwedApproval, reason: str) -> str:
    """The failure of an attempt that ended without using ``owed`` (``ApprovalNotApplied``)."""
    what = f"{owed.action.get('action') or owed.action.get('tool') or 'the action'}"
    target = owed.action.get("target")
    edit = f" with their edit ({value_words(owed.edited)})" if owed.edited is not None else ""
    return (
        f"{what}{f' on {target}' if target else ''}, approved by "
        f"{people_words(owed.approved_by)}{edit}, was not applied: {reason}. Nothing was "
        f"done for that approval; retry to plan again (request {owed.request_id})."
    )


def no_edit_to_refuse(refused: EditRefused) -> str:
    """The failure of ``EditRefused`` raised in a step that got no approved edit."""
    return (
        f"The step refused an edit ({refused.reason}), but no approval with an edit was "
        "given to it in this run of the step: there is no approved edit to refuse. Raise "
        "EditRefused after reading approval.edited."
    )
