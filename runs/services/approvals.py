"""Deciding an approval under its policy (``runs/approvals.py``): called by ``run_resume``
with the run locked, so that two people deciding at once take turns on the run's row.

A decision is recorded (``ApprovalVote``) before anything else. An approval that leaves
the request short of its policy's N distinct approvals appends ``approval.given`` and
keeps the request pending; the Nth approval (or a deny that closes, or a response)
answers it. An approval with an edit starts a new round: the approvals before it
approved other arguments and no longer count. A person who decides again in the same
round changed their mind: the new decision supersedes theirs (``approval.changed``), and
counts as any decision would (an approver who now denies closes the request).

What an approval is about is the server's to say, not the worker's: the reversibility of
a named tool comes from the tool (``approval_action``), through the lookup the ledger
registers (``register_tool_facts``; the run store does not import the ledger).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from django.utils import timezone

from runs.action_links import ActionLink
from runs.agents import approval_policy_for
from runs.approvals import (
    ApprovalAnswer,
    Policy,
    approval_answer,
    approvals_so_far,
    edit_that_counts,
    editable_of,
    editor_of,
    is_new_edit,
    policy_of,
    resolve_policy,
    same,
    standing_votes,
    why_not_decide,
)
from runs.errors import HoldpointError
from runs.events import EventType, append_event, how
from runs.models import ApprovalVote, InputRequest, Run
from runs.services._base import UserLike, user_or_none


# What the server knows of a tool an agent names: ``{"reversibility": …, "request_schema":
# …}``, or None for a name that is no tool of that agent. The ledger registers the lookup
# (ledger/apps.py): a tool belongs to the agent that declared it, and a built-in tool's
# reversibility is the server's.
class ToolFacts(TypedDict):
    """What the server knows of a tool an agent names (``register_tool_facts``)."""

    reversibility: str
    can_compensate: bool
    request_schema: dict[str, Any] | None


ToolFactsLookup = Callable[[str, str], "ToolFacts | None"]
_tool_facts: list[ToolFactsLookup] = []

REVERSIBILITIES = ("irreversible", "compensable", "reversible")


def register_tool_facts(lookup: ToolFactsLookup) -> ToolFactsLookup:
    if lookup not in _tool_facts:
        _tool_facts.append(lookup)
    return lookup


def tool_facts(agent: str, tool: str) -> ToolFacts | None:
    for lookup in _tool_facts:
        found = lookup(agent, tool)
        if found is not None:
            return found
    return None


def least_reversible(a: str, b: str) -> str:
    """Of two reversibilities, the one that can be undone least."""
    known = [r for r in (a, b) if r in REVERSIBILITIES]
    return min(known, key=REVERSIBILITIES.index) if known else ""


def approval_action(agent: str, action: dict[str, Any]) -> dict[str, Any]:
    """The approval's ``action`` as the server stores and judges it.

    When it names a tool of the agent (its own declaration, or a tool of the server), the
    reversibility is the tool's: a worker may call an action less reversible than its
    tool, never more (except, as the ledger allows, a compensable call of a tool that can
    undo it, with the plan to undo it), and its silence is not "reversible" (what a client
    sends for ``ctx.approve(tool="email")``). An action that names no tool keeps the agent's word.
    When the approver may edit the tool's request itself (the ledger's approval before an
    irreversible call), the tool's request schema goes with the editable arguments, so an
    edit the tool would refuse is refused when it is made.
    """
    claimed = str(action.get("reversibility") or "")
    facts = tool_facts(agent, str(action.get("tool") or ""))
    if facts is None:
        return {**action, "reversibility": claimed if claimed in REVERSIBILITIES else ""}
    own = str(facts.get("reversibility") or "irreversible")
    if (
        claimed == "compensable"
        and own == "irreversible"
        and facts.get("can_compensate")
        and action.get("compensating_action")
    ):
        # The ledger's own rule (ledger/services/intents.py, effective_reversibility): a
        # call of a tool that can undo what it does, with a plan to undo it, is compensable.
        own = "compensable"
    reversibility = least_reversible(own, claimed)
    out = {**action, "reversibility": reversibility}
    editable = action.get("editable")
    request_schema = facts.get("request_schema")
    if (
        isinstance(editable, dict)
        and isinstance(request_schema, dict)
        and same(editable.get("value"), action.get("change"))
    ):
        out["editable"] = {**editable, "request_schema": request_schema}
    return out


def policy_for_request(agent: str, action: dict[str, Any]) -> Policy:
    """The policy an approval of ``agent`` about ``action`` (as ``approval_action`` made
    it) is asked under."""
    policy, source = approval_policy_for(agent)
    resolved = resolve_policy(
        policy,
        tool=str(action.get("tool") or ""),
        target=str(action.get("target") or ""),
        reversibility=str(action.get("reversibility") or ""),
    )
    resolved["source"] = source
    return resolved


def _standing_vote_of(request: InputRequest, who: Any, actor: str) -> ApprovalVote | None:
    """This person's (or, for the system, this actor's) standing decision in the round."""
    votes = standing_votes(request)
    votes = votes.filter(user=who) if who is not None else votes.filter(user=None, actor=actor)
    return votes.order_by("-created_at", "-id").first()


def approval_decide(
    run: Run,
    request: InputRequest,
    value: Any,
    *,
    user: UserLike,
    actor: str,
    via: str = "",
    identity: str = "",
    link: ActionLink | None = None,
    round_seen: int | None = None,
) -> ApprovalAnswer | None:
    """Record one person's decision; return the request's answer when it is decided, or
    None while it waits for more approvals. Refuses ``approval_not_allowed`` (who may not
    decide, and why) or ``invalid_input`` before writing anything; with an e-mail's
    ``link``, ``request_mismatch`` when the request was edited since the link was sent or
    the link has decided already."""
    decision = value.get("decision") if isinstance(value, dict) else None
    who = user_or_none(user)
    door = how(via=via, identity=identity)
    if link is not None:
        _check_link(request, link, who, value)
    elif round_seen is not None:
        _check_round(request, round_seen, "since you saw it")
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
        and standing_votes(request).filter(user=None, actor=actor, decision="approve").exists()
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
    name = who.get_username() if who is not None else actor
    # A second decision in the same round by the same person is a change of mind: it
    # supersedes the first (kept, with when it stopped counting). The run's lock, held by
    # the caller, orders it against every other decision on this request.
    earlier = None if edit is not None else _standing_vote_of(request, who, actor)
    if earlier is not None:
        earlier.superseded_at = timezone.now()
        earlier.save(update_fields=["superseded_at"])
    ApprovalVote.objects.create(
        request=request,
        user=who,
        actor=actor,
        decision=decision,
        comment=answer.get("comment", ""),
        edited=edit,
        round=request.edit_round,
        via=via,
        link=link.nonce if link is not None else "",
    )
    if earlier is not None:
        append_event(
            run,
            EventType.APPROVAL_CHANGED,
            actor,
            {
                "request_id": request.id,
                "by": name,
                "from": earlier.decision,
                "to": decision,
                "comment": answer.get("comment", ""),
                "earlier_comment": earlier.comment,
                **door,
            },
        )
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
                    **door,
                },
            )
            return None
        final: ApprovalAnswer = {"decision": "approve"}
        if answer.get("comment"):
            final["comment"] = answer["comment"]
        counted_edit = edit_that_counts(request.action, request.edited)
        if counted_edit is not None:
            final["edited"] = counted_edit
        if policy["required"] > 1:
            final["approvers"] = [
                v.user.get_username() if v.user is not None else v.actor for v in given
            ]
        return final
    if decision == "deny" and not policy["any_deny_closes"]:
        request.save(update_fields=["decisions"])
        if earlier is not None:
            return None  # approval.changed says it: an approval became an objection
        append_event(
            run,
            EventType.APPROVAL_OBJECTED,
            actor,
            {
                "request_id": request.id,
                "by": name,
                "comment": answer.get("comment", ""),
                **door,
            },
        )
        return None
    return answer


def _check_round(request: InputRequest, round_seen: int, when: str) -> None:
    """A decision made on what a message showed (an e-mail, a Slack message) is about that
    version of the request: an edit since then (a new round) refuses it, under the run's
    lock, rather than approve arguments the person never saw."""
    if request.edit_round != round_seen:
        raise HoldpointError(
            "request_mismatch",
            f"This request was edited {when}; look at what is asked now.",
            reason="edited",
            request_id=request.id,
        )


def _check_link(request: InputRequest, link: ActionLink, who: Any, value: Any) -> None:
    """An e-mail link decides the version of the request it was sent about, for the
    person it was sent to, once, as the link says: approve or deny, with at most a
    comment, never an edit (``runs/action_links.py``). Checked under the run's lock, so a
    link and an edit, or the two links of one e-mail, take turns."""
    if (
        not isinstance(value, dict)
        or value.get("decision") != link.decision
        or set(value) - {"decision", "comment"}
    ):
        raise HoldpointError(
            "invalid_input",
            f"This link can only {link.decision}, with a comment at most.",
            request_id=request.id,
        )
    if who is None or who.pk != link.user_id:
        raise HoldpointError(
            "approval_not_allowed",
            "This link was sent to someone else.",
            reason="not_the_recipient",
            request_id=request.id,
        )
    _check_round(request, link.edit_round, "after the e-mail was sent")
    used = ApprovalVote.objects.filter(request=request, link=link.nonce).exists()
    if used:
        raise HoldpointError(
            "request_mismatch",
            "This e-mail's links have been used already.",
            reason="link_used",
            request_id=request.id,
        )


def answered_payload(request: InputRequest, answer: Any) -> dict[str, Any]:
    """What ``request.answered`` adds for an approval: the original arguments next to the
    edit, and who edited them."""
    if not isinstance(answer, dict) or "edited" not in answer:
        return {}
    editable = editable_of(request.action)
    return {
        "original": editable.value if editable is not None else None,
        "edited_by": editor_of(request),
    }
