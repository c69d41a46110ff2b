"""Beginning a side effect: the intention, fenced like every worker write.

``side_effect_begin`` answers the decision table of docs/ledger.md:

| the ledger says          | answer                                                   |
|--------------------------|----------------------------------------------------------|
| no record                | write ``pending``, commit, answer **act**                |
| ``pending``              | **look up**: ask the tool by idempotency key, then act   |
|                          | only if the external system has no record of it          |
| ``confirmed``            | **reuse** the recorded result; never act again           |
| ``compensation_failed``  | **reuse**: the effect is still in place                  |
| ``unknown``              | refuse ``side_effect_unknown``; a person or the          |
|                          | reconciler decides first                                 |
| ``failed``               | it did not happen: **act** again, with the same key      |
| ``compensated``          | it was undone: a new record with the next key, **act**   |

An ``irreversible`` effect needs an approval before the answer can be *act*:

- a step named in ``run.approvals`` when the run was started (by a person with the
  approve permission) covers whatever that step then asks for;
- otherwise an answered ``auth_required`` request of this run for that step that said
  ``approve`` **and showed this very action**: its tool, target and request hash
  (``action_hash``) to the same value as the call's. Anything else in the step, a
  different tool, target or request, needs its own approval: ``approval_required``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from django.db import IntegrityError, transaction
from django.db.models import Q

from ledger.events import SideEffectEvent
from ledger.models import Reversibility, SideEffect, SideEffectStatus
from ledger.outbound import redact_request
from ledger.services._common import (
    check_supplied_key,
    check_text,
    emit,
    idempotency_key_for,
)
from ledger.tools import ActionFailed, Tool, can_compensate, request_errors, tool_for_agent
from runs.approvals import editor_of, preapproval_stands
from runs.errors import HoldpointError
from runs.models import Attempt, InputRequest, Run
from runs.schemas import canonical_json
from runs.services import lock_for_worker_write
from runs.states import RequestKind, RequestStatus

Decision = Literal["act", "look_up", "reuse"]

# The ledger's decision table: what beginning a side effect again does, by the status of
# the record its key finds (no record: "act"). "refuse" is 409 side_effect_unknown:
# automatic retries stop until a person or the reconciler settles it. A compensated
# record is never reused: the next generation of the key acts anew. The retry preview
# (dashboard/views/side_effects.py) reads this table too.
DECISIONS: dict[str, Decision | Literal["refuse"]] = {
    SideEffectStatus.PENDING: "look_up",
    SideEffectStatus.CONFIRMED: "reuse",
    SideEffectStatus.COMPENSATION_FAILED: "reuse",
    SideEffectStatus.UNKNOWN: "refuse",
    SideEffectStatus.FAILED: "act",
    SideEffectStatus.COMPENSATED: "act",
}


def decision_for(status: str | None) -> Decision | Literal["refuse"]:
    """What beginning the effect again does when its key finds a record in ``status``."""
    return "act" if status is None else DECISIONS[status]


@dataclass(frozen=True)
class Begin:
    """What the worker must do next, and the key it must pass to the external system."""

    decision: Decision
    operation_id: str
    idempotency_key: str
    result: Any = None
    external_reference: str = ""
    reversibility: str = ""


def effective_reversibility(
    tool: Tool, declared: str | None, compensating_action: dict[str, Any] | None
) -> str:
    """The effect's reversibility: the tool's own unless the agent declares another.

    An agent may always declare an effect *less* reversible. It may declare an
    irreversible tool's call undoable only when the tool can compensate and the agent
    says how (a compensating action); otherwise approval could be dodged by a word.
    """
    if declared is None:
        return tool.reversibility
    if declared not in Reversibility.values:
        raise HoldpointError(
            "invalid_input",
            f"reversibility must be one of {', '.join(Reversibility.values)}.",
        )
    if declared != Reversibility.IRREVERSIBLE:
        if not can_compensate(tool):
            raise HoldpointError(
                "invalid_input",
                f"The {tool.name} tool cannot undo what it does; its effects are irreversible.",
            )
        if tool.reversibility == Reversibility.IRREVERSIBLE and not compensating_action:
            raise HoldpointError(
                "invalid_input",
                f"The {tool.name} tool is irreversible unless a compensating_action says how "
                "to undo this call.",
            )
    return declared


def action_hash(*, tool: str, target: str, request: Any) -> str:
    """The canonical hash of an action: what an approval covers and what a call does.

    The one place this is computed: the ledger compares the hash of what an approval
    showed with the hash of the call about to act, and records it with the approval.
    """
    # Hashed as the ledger stores and shows it (secret header values redacted), so that a
    # card and the call it approved hash alike whether or not they carried the secret.
    shown = redact_request(request)
    canonical = canonical_json({"tool": tool, "target": target, "request": shown})
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def approved_action_hash(action: Any, answer: Any = None) -> str | None:
    """The hash of what an ``auth_required`` request's approver saw and approved.

    ``action`` is the request's ``{tool, target, change, …}`` as shown on the card;
    its ``change`` is the request the tool will be given. An approval that edited the
    request (``answer.edited``) covers the edited request and not the plan.
    """
    if not isinstance(action, dict) or not action.get("tool"):
        return None
    request = action.get("change")
    if isinstance(answer, dict) and answer.get("decision") == "approve" and "edited" in answer:
        request = answer["edited"]
    return action_hash(
        tool=str(action["tool"]), target=str(action.get("target", "")), request=request
    )


class ApprovalRecord(TypedDict, total=False):
    """Who approved an effect, as the ledger keeps it on the side effect (``approval``) for
    the audit trail and the report: where the approval came from (``start``: a
    pre-approval; ``request``: an answered approval), by whom, when, their comment, the
    hash of the action it covers, and, for an edited one, the plan, the edit and who made
    it, and everyone whose approval counted."""

    source: str
    request_id: str | None
    by: str | None
    comment: str
    at: str | None
    action_hash: str
    approvers: list[str]
    edited: Any
    original: Any
    edited_by: str


def edited_idempotency_key(*, run_id: str, step_id: str, tool: str, request: Any) -> str:
    """The key of a call an approver edited: its own, never the plan's (the plan was not
    approved and must not be taken for it by the external system or the ledger)."""
    digest = hashlib.sha256(canonical_json(redact_request(request)).encode()).hexdigest()[:12]
    return f"{idempotency_key_for(run_id=run_id, step_id=step_id, tool=tool)}.e{digest}"


def approval_for(run: Run, *, step_id: str, tool: str, target: str, request: Any) -> ApprovalRecord:
    """Who approved this irreversible action, or raise ``approval_required``.

    The returned record carries ``action_hash``, the hash of the action it covers.
    """
    wanted = action_hash(tool=tool, target=target, request=request)
    if step_id in (run.approvals or []) and preapproval_stands(run):
        creator = run.created_by.get_username() if run.created_by_id else None  # type: ignore[union-attr]
        return {
            "source": "start",
            "request_id": None,
            "by": creator,
            "comment": "Approved when the run was started.",
            "at": run.created_at.isoformat(),
            "action_hash": wanted,
        }
    # Only a decision about this very action counts, and the newest one: a later "deny"
    # of the same action withdraws an earlier "approve". An approval of something else
    # in the same step (another recipient, another tool) covers nothing here.
    answered = (
        InputRequest.objects.select_related("answered_by")
        .filter(
            run=run,
            kind=RequestKind.AUTH_REQUIRED,
            step_id=step_id,
            status=RequestStatus.ANSWERED,
        )
        .order_by("-answered_at", "-created_at")
    )
    request = next(
        (r for r in answered if approved_action_hash(r.action, r.answer) == wanted), None
    )
    answer = request.answer if request is not None and isinstance(request.answer, dict) else {}
    who = (
        request.answered_by.get_username()
        if request is not None and request.answered_by is not None
        else None
    )
    if request is not None and answer.get("decision") == "approve":
        return {
            "source": "request",
            "request_id": request.id,
            "by": who,
            "comment": str(answer.get("comment") or ""),
            "at": request.answered_at.isoformat() if request.answered_at else None,
            "action_hash": wanted,
            **_edit_facts(request, answer),
        }
    extra: dict[str, Any] = {
        "step_id": step_id,
        "tool": tool,
        "target": target,
        "reversibility": Reversibility.IRREVERSIBLE,
        "action_hash": wanted,
    }
    if request is not None:
        extra.update(request_id=request.id, denied_by=who)
    # Approved with edits (issue 18): the plan itself is not approved, the edit is. Say so,
    # and how to run the edit, to a worker that began with the plan (the in-process SDK
    # begins with the edit at once).
    edited = next(
        (
            r
            for r in answered
            if approved_action_hash(r.action) == wanted
            and isinstance(r.answer, dict)
            and r.answer.get("decision") == "approve"
            and "edited" in r.answer
        ),
        None,
    )
    if edited is not None and isinstance(edited.answer, dict):
        extra.update(
            request_id=edited.id,
            edited=edited.answer["edited"],
            edited_idempotency_key=edited_idempotency_key(
                run_id=run.id, step_id=step_id, tool=tool, request=edited.answer["edited"]
            ),
        )
        raise HoldpointError(
            "approval_required",
            f"{tool} on {target} was approved with edits: begin again with the edited "
            "request and its own idempotency_key (edited, edited_idempotency_key).",
            **extra,
        )
    raise HoldpointError(
        "approval_required",
        f"{tool} on {target} cannot be undone; step {step_id!r} needs an approval first.",
        **extra,
    )


def _check_schema(the_tool: Tool, request: Any) -> None:
    """Refuse a request that does not fit the tool's ``request_schema`` (docs/tools.md),
    with a pointer per failing field, before anything is written."""
    errors = request_errors(the_tool, request)
    if errors:
        first = errors[0]
        raise HoldpointError(
            "invalid_input",
            f"{the_tool.name}: the request does not match the tool's request schema "
            f"(docs/tools.md): {first['pointer']}: {first['message']}",
            errors=errors,
        )


def _validate(the_tool: Tool, method: str, value: Any, *, pointer: str | None) -> None:
    """Let the tool refuse what can never succeed, before anything is written: a refused
    destination is ``destination_not_allowed``, anything else ``invalid_input``."""
    check = getattr(the_tool, method, None)
    if not callable(check):
        return
    try:
        check(value)
    except ActionFailed as exc:
        code = getattr(exc, "code", "invalid_input")
        extra = {k: v for k, v in exc.details.items() if k in ("host", "address", "header")}
        if pointer is not None:
            extra["errors"] = [{"pointer": pointer, "message": exc.message}]
        what = the_tool.name if pointer is not None else f"{the_tool.name} compensating_action"
        raise HoldpointError(code, f"{what}: {exc.message}", **extra) from None


def _step_of(step_id: str) -> str:
    """The step a ledger or hold-point key belongs to: ``write`` of ``write.config_store``."""
    return step_id.split(".", 1)[0]


def approval_record(
    run: Run, *, step_id: str, tool: str = "", target: str = ""
) -> ApprovalRecord | None:
    """Who approved this effect, for the audit trail (issue 15, point 5).

    Any effect, not only an irreversible one, done under an approval records it: the
    newest answered ``auth_required`` request of this run that is about it, when it said
    approve. About it: asked in the same step (``write.approve`` before
    ``write.config_store``), or naming the same tool and target in its action (an
    ``approve`` step before a ``write`` step, as the demo agent does). Else a start-time
    approval of that step. None when there is none, or when the newest decision was a
    denial. Never refuses anything: ``approval_for`` does that.
    """
    step = _step_of(step_id)
    for approved in run.approvals if preapproval_stands(run) else []:
        if isinstance(approved, str) and (approved == step_id or _step_of(approved) == step):
            creator = run.created_by.get_username() if run.created_by_id else None  # type: ignore[union-attr]
            return {
                "source": "start",
                "request_id": None,
                "by": creator,
                "comment": "Approved when the run was started.",
                "at": run.created_at.isoformat(),
            }
    request = (
        InputRequest.objects.select_related("answered_by")
        .filter(
            run=run,
            kind=RequestKind.AUTH_REQUIRED,
            status=RequestStatus.ANSWERED,
        )
        .filter(
            Q(step_id__startswith=f"{step}.")
            | (Q(action__tool=tool, action__target=target) if tool and target else Q(pk=None))
        )
        .order_by("-answered_at", "-created_at")
        .first()
    )
    answer = request.answer if request is not None and isinstance(request.answer, dict) else {}
    if request is None or answer.get("decision") != "approve":
        return None
    return {
        "source": "request",
        "request_id": request.id,
        "by": request.answered_by.get_username() if request.answered_by is not None else None,
        "comment": str(answer.get("comment") or ""),
        "at": request.answered_at.isoformat() if request.answered_at else None,
        **_edit_facts(request, answer),
    }


def _edit_facts(request: InputRequest, answer: dict[str, Any]) -> ApprovalRecord:
    """For the audit trail: what the approval covered when an approver edited the plan
    (the original next to the edit), and everyone whose approval counted."""
    facts: ApprovalRecord = {}
    if isinstance(answer.get("approvers"), list):
        facts["approvers"] = answer["approvers"]
    if "edited" in answer:
        action = request.action if isinstance(request.action, dict) else {}
        found = action.get("editable")
        editable: dict[str, Any] = found if isinstance(found, dict) else {}
        facts["edited"] = answer["edited"]
        facts["original"] = editable.get("value", action.get("change"))
        editor = editor_of(request)
        if editor is not None:
            facts["edited_by"] = editor
    return facts


def _approval(
    run: Run, *, step_id: str, tool: str, target: str, request: Any, reversibility: str
) -> ApprovalRecord | None:
    """An irreversible effect needs its approval of exactly this action (or raises); any
    other records one if given."""
    if reversibility == Reversibility.IRREVERSIBLE:
        return approval_for(run, step_id=step_id, tool=tool, target=target, request=request)
    return approval_record(run, step_id=step_id, tool=tool, target=target)


def _current_record(
    run: Run, *, step_id: str, tool: str, supplied_key: str | None
) -> tuple[SideEffect | None, int, str]:
    """The record that decides, with the generation and key a new record would take."""
    if supplied_key is not None:
        effect = SideEffect.objects.filter(idempotency_key=supplied_key).first()
        if effect is not None and (
            effect.run_id != run.id or effect.step_id != step_id or effect.tool != tool
        ):
            raise HoldpointError(
                "invalid_input",
                "This idempotency_key already names another side effect.",
                operation_id=effect.operation_id if effect.run_id == run.id else None,
            )
        if effect is not None and effect.status == SideEffectStatus.COMPENSATED:
            raise HoldpointError(
                "invalid_state",
                "The side effect of this idempotency_key was compensated; to act again, "
                "use a new key.",
                operation_id=effect.operation_id,
            )
        return effect, 0, supplied_key
    generation = 0
    while True:
        key = idempotency_key_for(run_id=run.id, step_id=step_id, tool=tool, generation=generation)
        effect = SideEffect.objects.filter(idempotency_key=key).first()
        if effect is None or effect.status != SideEffectStatus.COMPENSATED:
            return effect, generation, key
        generation += 1


@dataclass(frozen=True)
class Intent:
    """A side effect as the worker asks for it, checked before the run is locked: the tool
    (the run's agent's), what it will be given (secret headers redacted for storing), how
    far it can be undone, and how it would be undone."""

    step_id: str
    tool: str
    target: str
    request: Any
    reversibility: str
    compensating_action: Any


def _checked_intent(
    *,
    attempt_id: str,
    step_id: str,
    tool: str,
    target: str,
    request: Any,
    reversibility: str | None,
    compensating_action: Any,
    idempotency_key: str | None,
) -> Intent:
    """Everything that can refuse a begin without the run's lock: the tool is the run's
    agent's (its own declaration, or a tool of the server; never another agent's), the
    texts, the request against the tool's schema and its own checks, the reversibility the
    call may claim, the supplied key. A tool's checks may take time and need no lock."""
    agent = Attempt.objects.filter(pk=attempt_id).values_list("run__agent", flat=True).first()
    if agent is None:
        raise HoldpointError("not_found", f"There is no attempt {attempt_id!r}.")
    the_tool = tool_for_agent(agent, tool)
    check_text(step_id, "step_id", 100)
    check_text(target, "target", 500)
    if not isinstance(request, dict):
        raise HoldpointError("invalid_input", "request must be a JSON object.")
    if compensating_action is not None and not isinstance(compensating_action, dict):
        raise HoldpointError("invalid_input", "compensating_action must be a JSON object.")
    effective = effective_reversibility(the_tool, reversibility, compensating_action)
    _check_schema(the_tool, request)
    _validate(the_tool, "validate", request, pointer="/")
    if compensating_action is not None:
        _validate(the_tool, "validate_compensating_action", compensating_action, pointer=None)
    if idempotency_key is not None:
        check_supplied_key(idempotency_key)
    planned = compensating_action
    plan = getattr(the_tool, "plan_compensation", None)
    if planned is None and effective != Reversibility.IRREVERSIBLE and callable(plan):
        planned = plan(request)
    # Secret headers (Authorization, cookies, API keys…) are never stored: the ledger, its
    # events and the report keep "[redacted]"; the caller still holds the real request and
    # hands it to the tool in memory (docs/security.md).
    return Intent(
        step_id=step_id,
        tool=tool,
        target=target,
        request=redact_request(request),
        reversibility=effective,
        compensating_action=redact_request(planned),
    )


@transaction.atomic(durable=True)
def side_effect_begin(
    *,
    attempt_id: str,
    lease_epoch: int,
    cancel_epoch: int,
    step_id: str,
    tool: str,
    target: str,
    request: Any,
    reversibility: str | None = None,
    compensating_action: Any = None,
    idempotency_key: str | None = None,
    worker_token_id: int | None = None,
) -> Begin:
    """Write the intent before the act (fenced), or say what the ledger already knows.

    Raises ``side_effect_unknown`` (the key's outcome is unknown; nothing changes),
    ``approval_required`` (irreversible and not approved; nothing changes), or the
    fence's ``stale_after_cancel`` / ``stale_worker``. ``idempotency_key`` is for
    workers that bring their own; by default the ledger derives it from run, step
    and tool. What it answers follows the decision table (``DECISIONS``), one function
    a row.
    """
    intent = _checked_intent(
        attempt_id=attempt_id,
        step_id=step_id,
        tool=tool,
        target=target,
        request=request,
        reversibility=reversibility,
        compensating_action=compensating_action,
        idempotency_key=idempotency_key,
    )
    fenced = lock_for_worker_write(
        attempt_id=attempt_id,
        lease_epoch=lease_epoch,
        cancel_epoch=cancel_epoch,
        worker_token_id=worker_token_id,
    )
    run, attempt = fenced.run, fenced.attempt
    effect, generation, key = _current_record(
        run, step_id=step_id, tool=tool, supplied_key=idempotency_key
    )
    if effect is None:
        return _begin_new(run, attempt, intent, generation=generation, key=key)
    decision = decision_for(effect.status)
    if decision == "refuse":
        raise HoldpointError(
            "side_effect_unknown",
            f"Whether {effect.tool} on {effect.target} happened is unknown; automatic retries "
            "stop until a person or the reconciler settles it.",
            operation_id=effect.operation_id,
            idempotency_key=effect.idempotency_key,
        )
    if decision == "look_up":
        return _begin_look_up(run, attempt, intent, effect)
    if decision == "reuse":
        emit(
            run,
            SideEffectEvent.REUSED,
            f"worker:{attempt.worker_id}",
            effect,
            attempt_id=attempt.id,
            external_reference=effect.external_reference,
        )
        return _answer("reuse", effect)
    return _begin_again(run, attempt, intent, effect)


def _intent_approval(run: Run, intent: Intent) -> Any:
    return _approval(
        run,
        step_id=intent.step_id,
        tool=intent.tool,
        target=intent.target,
        request=intent.request,
        reversibility=intent.reversibility,
    )


def _begin_new(run: Run, attempt: Attempt, intent: Intent, *, generation: int, key: str) -> Begin:
    """No record: write ``pending`` (an irreversible one only with its approval), act."""
    approval = _intent_approval(run, intent)
    effect = SideEffect(
        run=run,
        attempt=attempt,
        step_id=intent.step_id,
        tool=intent.tool,
        generation=generation,
        idempotency_key=key,
        target=intent.target,
        request=intent.request,
        status=SideEffectStatus.PENDING,
        reversibility=intent.reversibility,
        compensating_action=intent.compensating_action,
        approval=approval,
    )
    try:
        # A savepoint: a key taken meanwhile by another run must not break our transaction.
        with transaction.atomic():
            effect.save(force_insert=True)
    except IntegrityError:
        raise HoldpointError(
            "invalid_input", "This idempotency_key already names another side effect."
        ) from None
    emit(
        run,
        SideEffectEvent.BEGUN,
        f"worker:{attempt.worker_id}",
        effect,
        attempt_id=attempt.id,
        idempotency_key=key,
        reversibility=intent.reversibility,
        generation=generation,
        approved_by=approval["by"] if approval else None,
    )
    return _answer("act", effect)


def _begin_look_up(run: Run, attempt: Attempt, intent: Intent, effect: SideEffect) -> Begin:
    """Pending: the worker that wrote the intent is gone (or this is a repeat of the same
    call), and the act may or may not have happened. Responsibility moves to this attempt,
    which asks the external system by key before anything else."""
    recorded = action_hash(tool=effect.tool, target=effect.target, request=effect.request)
    if intent.reversibility == Reversibility.IRREVERSIBLE and recorded != action_hash(
        tool=intent.tool, target=intent.target, request=intent.request
    ):
        # The re-run would do something else than what was approved and recorded: a
        # look-up may end in an act, so that other action needs its own approval.
        approval_for(
            run,
            step_id=intent.step_id,
            tool=intent.tool,
            target=intent.target,
            request=intent.request,
        )
    previous_attempt = effect.attempt_id
    effect.attempt = attempt
    effect.save(update_fields=["attempt", "updated_at"])
    emit(
        run,
        SideEffectEvent.LOOK_UP,
        f"worker:{attempt.worker_id}",
        effect,
        attempt_id=attempt.id,
        previous_attempt_id=previous_attempt,
        idempotency_key=effect.idempotency_key,
    )
    return _answer("look_up", effect)


def _begin_again(run: Run, attempt: Attempt, intent: Intent, effect: SideEffect) -> Begin:
    """Failed: it did not happen, so it may be done now. The same key is sent again: if the
    "failure" was wrong after all, the external system recognises the key."""
    assert effect.status == SideEffectStatus.FAILED, effect.status
    approval = _intent_approval(run, intent)
    previous = {"error": effect.error, "resolution": effect.resolution or None}
    _rearm(
        effect,
        attempt=attempt,
        target=intent.target,
        request=intent.request,
        reversibility=intent.reversibility,
        compensating_action=intent.compensating_action,
        approval=approval,
    )
    emit(
        run,
        SideEffectEvent.BEGUN,
        f"worker:{attempt.worker_id}",
        effect,
        attempt_id=attempt.id,
        idempotency_key=effect.idempotency_key,
        reversibility=intent.reversibility,
        generation=effect.generation,
        approved_by=approval["by"] if approval else None,
        again_after=previous,
    )
    return _answer("act", effect)


def _rearm(
    effect: SideEffect,
    *,
    attempt: Attempt,
    target: str,
    request: dict[str, Any],
    reversibility: str,
    compensating_action: Any,
    approval: dict[str, Any] | None,
) -> None:
    effect.attempt = attempt
    effect.target = target
    effect.request = request
    effect.reversibility = reversibility
    effect.compensating_action = compensating_action
    effect.approval = approval
    effect.status = SideEffectStatus.PENDING
    effect.external_reference = ""
    effect.result = None
    effect.error = None
    effect.late = False
    effect.outcome_at = None
    effect.outcome_actor = ""
    effect.resolution = ""
    effect.resolution_note = ""
    effect.resolved_by = None
    effect.resolved_actor = ""
    effect.resolved_at = None
    effect.save()


def _answer(decision: Decision, effect: SideEffect) -> Begin:
    reuse = decision == "reuse"
    return Begin(
        decision=decision,
        operation_id=effect.operation_id,
        idempotency_key=effect.idempotency_key,
        result=effect.result if reuse else None,
        external_reference=effect.external_reference if reuse else "",
        reversibility=effect.reversibility,
    )
