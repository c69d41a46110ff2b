"""Deciding an approval under its policy (``runs/approvals.py``): called by ``run_resume``
with the run locked, so that two people deciding at once take turns on the run's row.

A decision is recorded (``ApprovalVote``) before anything else. An approval that leaves
the request short of its policy's N distinct approvals appends ``approval.given`` and
keeps the request pending; the Nth approval (or a deny that closes, or a response)
answers it. An approval with an edit starts a new round: the approvals before it
approved other arguments and no longer count.
"""

from __future__ import annotations

from typing import Any

from runs.agents import approval_policy_for
from runs.approvals import (
    approval_answer,
    approvals_so_far,
    editable_of,
    is_new_edit,
    policy_of,
    resolve_policy,
    why_not_decide,
)
from runs.errors import HoldpointError
from runs.events import EventType, append_event
from runs.models import ApprovalVote, InputRequest, Run
from runs.services._base import UserLike, user_or_none


def policy_for_request(agent: str, action: dict[str, Any]) -> dict[str, Any]:
    """The policy an approval of ``agent`` about ``action`` is asked under."""
    policy, source = approval_policy_for(agent)
    resolved = resolve_policy(
        policy,
        tool=str(action.get("tool") or ""),
        target=str(action.get("target") or ""),
        reversibility=str(action.get("reversibility") or ""),
    )
    resolved["source"] = source
    return resolved


def approval_decide(
    run: Run, request: InputRequest, value: Any, *, user: UserLike, actor: str
) -> dict[str, Any] | None:
    """Record one person's decision; return the request's answer when it is decided, or
    None while it waits for more approvals. Refuses ``approval_not_allowed`` (who may not
    decide, and why) or ``invalid_input`` before writing anything."""
    decision = value.get("decision") if isinstance(value, dict) else None
    who = user_or_none(user)
    new_edit = is_new_edit(request.action, value, request.edited)
    why = why_not_decide(
        request, who, decision if isinstance(decision, str) else "approve", new_edit=new_edit
    )
    if why is not None:
        raise HoldpointError(
            "approval_not_allowed", why.detail, reason=why.reason, request_id=request.id
        )
    if (
        who is None
        and decision == "approve"
        and not new_edit
        and ApprovalVote.objects.filter(
            request=request, round=request.edit_round, user=None, actor=actor, decision="approve"
        ).exists()
    ):
        # Not a person, yet one actor counts once too (a script cannot be two approvers).
        raise HoldpointError(
            "approval_not_allowed",
            f"{actor} already approved this; it needs approvals from other people.",
            reason="already_approved",
            request_id=request.id,
        )
    answer = approval_answer(request.action, value, current_edit=request.edited)
    policy = policy_of(request.policy)
    decision = answer["decision"]
    edit = answer.get("edited")
    # An edit resets the approvals given in the round it ends (the first edit too).
    resets = edit is not None and bool(approvals_so_far(request))
    if edit is not None:
        request.edit_round += 1
        request.edited = edit
    request.decisions += 1
    ApprovalVote.objects.create(
        request=request,
        user=who,
        actor=actor,
        decision=decision,
        comment=answer.get("comment", ""),
        edited=edit,
        round=request.edit_round,
    )
    name = who.get_username() if who is not None else actor
    if decision == "approve":
        given = approvals_so_far(request)
        if len(given) < policy["required"]:
            request.save(update_fields=["edited", "edit_round", "decisions"])
            append_event(
                run,
                EventType.APPROVAL_GIVEN,
                actor,
                {
                    "request_id": request.id,
                    "by": name,
                    "approvals": len(given),
                    "required": policy["required"],
                    "edited": edit,
                    "reset": resets,
                    "comment": answer.get("comment", ""),
                },
            )
            return None
        final: dict[str, Any] = {"decision": "approve"}
        if answer.get("comment"):
            final["comment"] = answer["comment"]
        if request.edited is not None:
            final["edited"] = request.edited
        if policy["required"] > 1:
            final["approvers"] = [
                v.user.get_username() if v.user is not None else v.actor for v in given
            ]
        return final
    if decision == "deny" and not policy["any_deny_closes"]:
        request.save(update_fields=["decisions"])
        append_event(
            run,
            EventType.APPROVAL_OBJECTED,
            actor,
            {"request_id": request.id, "by": name, "comment": answer.get("comment", "")},
        )
        return None
    return answer


def answered_payload(request: InputRequest, answer: Any) -> dict[str, Any]:
    """What ``request.answered`` adds for an approval: the original arguments next to the
    edit, and who edited them."""
    if not isinstance(answer, dict) or "edited" not in answer:
        return {}
    editable = editable_of(request.action)
    editors = list(
        ApprovalVote.objects.filter(request=request, round=request.edit_round)
        .exclude(edited__isnull=True)
        .values_list("actor", flat=True)[:1]
    )
    return {
        "original": editable.value if editable is not None else None,
        "edited_by": editors[0] if editors else None,
    }
