"""The ``ctx`` a step receives: hold points, side effects, observations, cost and log.

Written once, for every backend (``holdpoint_client/backend.py``): the run store in the
server's process, the HTTP worker protocol, and the in-memory store of the test harness.
An agent's steps do not know which one they run on.

Every ``ctx`` call is a safe point, ``next`` and ``done`` included: it raises (unwinding
the step) when the run was cancelled, the lease was lost or the step ran past its
``timeout``, so a step that calls ``ctx`` stops quickly. The deadline is read on the
backend's clock (the fake clock of the harness, the monotonic clock of a worker), also
right after a side effect's outcome is recorded.

Hold points, side effects and approvals are identified by a *key* within the step
(``step_key`` in ``backend.py``: ``<step>.<kind>``, ``<step>.<kind>#2``…, or
``<step>.<key>`` with ``key=``). The key is how a re-run of the step finds the answer to
its question and the ledger finds the side effect it already did.

An approval covers the action it showed (tool, target, request) and nothing else: a
re-run of the step that would do something else asks again, in a new hold point. What
people approved either happens or they are told (``approvals.py``): a step run by an
attempt resumed with an approval uses it, or asks anew with a note saying why it was not
applied, or its attempt fails ``ApprovalNotApplied``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from holdpoint_client.approvals import (
    OwedApproval,
    approval_note,
    approval_options,
    choice_schema,
    not_applied_message,
    not_applied_reason,
    owed_approval,
    typed_value,
)
from holdpoint_client.backend import (
    Answer,
    ApprovalRequired,
    Backend,
    Effect,
    HoldPoint,
    Intent,
    Refused,
    Report,
    canonical_json,
    step_key,
    to_json,
)
from holdpoint_client.control import HoldPointReached, SideEffectUnknown, StepTimeout
from holdpoint_client.tools import ActionFailed, OutcomeUnknown
from holdpoint_client.typed import is_typed, schema_of
from holdpoint_client.types import (
    Approval,
    ApprovalDenied,
    Confirmed,
    CostBudgetExceeded,
    Done,
    EditRefused,
    Next,
    SideEffectFailed,
)

logger = logging.getLogger("holdpoint_client")

# Observed values up to this size are shown to the person with the question; larger
# ones are kept as a fingerprint only.
_OBSERVED_VALUE_MAX = 2000


def fingerprint(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


_PAIRS = (("from", "to"), ("before", "after"), ("old", "new"))


def _pair(value: Any) -> tuple[Any, Any] | None:
    if isinstance(value, dict):
        for old, new in _PAIRS:
            if set(value) == {old, new}:
                return value[old], value[new]
    return None


def change_is_empty(detail: Any) -> bool:
    """Whether an approval's planned change changes nothing: it states its change as
    from/to (before/after, old/new) pairs, at the top or field by field, and every pair's
    two sides are equal. Anything else (no pairs, free text) is taken to change something."""
    if not isinstance(detail, dict):
        return False
    top = _pair(detail)
    if top is not None:
        return canonical_json(top[0]) == canonical_json(top[1])
    if "before" in detail and "after" in detail:
        return canonical_json(detail["before"]) == canonical_json(detail["after"])
    pairs = [p for p in (_pair(v) for v in detail.values()) if p is not None]
    return bool(pairs) and all(canonical_json(a) == canonical_json(b) for a, b in pairs)


def approval_of(answer: Answer) -> Approval:
    """The step's view of an answered approval."""
    value = answer.value if isinstance(answer.value, dict) else {}
    approvers = value.get("approvers")
    return Approval(
        approved=value.get("decision") == "approve",
        comment=str(value.get("comment") or ""),
        answered_by=answer.answered_by,
        request_id=answer.request_id,
        decision=str(value.get("decision") or ""),
        edited=value.get("edited"),
        approvers=tuple(str(a) for a in approvers) if isinstance(approvers, list) else (),
    )


def answer_as_owed(answer: Answer) -> OwedApproval | None:
    """An answered approval as ``owed_approval`` reads a lease's ``resume_request``."""
    return owed_approval(
        {
            "request_id": answer.request_id,
            "kind": answer.kind,
            "step_id": answer.step_id,
            "answer": answer.value,
            "answered_by": answer.answered_by,
            "action": answer.action,
        }
    )


class Context:
    """What a step can do besides computing its next state. One per step run."""

    def __init__(
        self,
        *,
        backend: Backend,
        step: str,
        checkpoint_id: str,
        answers: dict[str, Answer],
        resumed: bool,
        cost_budget: float | None = None,
        input_type: type | None = None,
        timeout: float | None = None,
        owed: OwedApproval | None = None,
    ) -> None:
        self._backend = backend
        self._control = backend.control
        self._lease = backend.lease
        self._input_type = input_type
        self._typed_input: Any = None
        self._timeout = timeout
        self._deadline = backend.now() + timeout if timeout is not None else None
        self._answers = answers
        self._counts: Counter[str] = Counter()
        self._observed: dict[str, Any] = {}
        self._changed: set[str] = set()
        self._cost_budget = cost_budget
        # The approval this step run was resumed with, which it must use (issue 24); what
        # changed while it waited, the approvals it skipped as empty, and the last approval
        # with an edit it got (what ``EditRefused`` refuses).
        self._owed = owed
        self._changes: dict[str, tuple[Any, Any]] = {}
        self._skipped: list[str] = []
        self._edited: tuple[Answer, dict[str, Any]] | None = None
        self.step = step
        self.checkpoint_id = checkpoint_id
        # True when this step already ran from this checkpoint in an earlier attempt (after a
        # hold point, a crash or a failure): anything observed then may have changed.
        self.resumed = resumed

    # What the step is working on ------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self._lease.run_id

    @property
    def attempt_id(self) -> str:
        return self._lease.attempt_id

    @property
    def attempt_number(self) -> int:
        return self._lease.number

    @property
    def attempt_reason(self) -> str:
        return self._lease.reason

    @property
    def agent_version(self) -> int | None:
        """The declared version the run started with (its input was valid against that
        version's schema): a step may branch on it when the code moved on since."""
        return self._lease.agent_version

    @property
    def input(self) -> Any:
        """The run's input: JSON, or an instance of the agent's input type (a Pydantic
        model or a dataclass given as ``input_schema``)."""
        if self._input_type is None:
            return self._lease.input
        if self._typed_input is None:
            # Built once per step run: the step sees one instance, however often it reads it.
            self._typed_input = typed_value(self._input_type, self._lease.input, "input")
        return self._typed_input

    # Results of a step (safe points too) ----------------------------------------------

    @property
    def pause_requested(self) -> bool:
        """A pause was asked for (the run's or its agent's): a step that waits may return
        at its boundary, where the executor saves the checkpoint and releases the attempt."""
        return self._control.pause.is_set()

    def next(self, step: str, state: Any = None) -> Next:
        """Go on with ``step``; ``state`` is saved in a checkpoint before it runs."""
        self.check()
        return Next(step=step, state={} if state is None else state)

    def done(self, result: Any = None) -> Done:
        """Finish the run successfully with ``result``."""
        self.check()
        return Done(result=result)

    # Safe points ----------------------------------------------------------------------

    def check(self) -> None:
        """Stop here if the run was cancelled, the lease was lost or the step ran past its
        ``timeout``. Long loops call it."""
        self._control.check()
        if self._deadline is not None and self._backend.now() >= self._deadline:
            raise StepTimeout(
                f"Step {self.step!r} ran past its timeout of {self._timeout:g} s and was "
                "stopped at a safe point."
            )

    def sleep(self, seconds: float) -> None:
        """Wait, but wake at once (and unwind) when the run is cancelled, the lease lost or
        the step's timeout reached."""
        self.check()
        wait = max(0.0, seconds)
        if self._deadline is not None:
            wait = min(wait, max(0.0, self._deadline - self._backend.now()))
        self._backend.sleep(wait)
        self.check()

    def _key(self, kind: str, key: str | None) -> str:
        if key is None:
            self._counts[kind] += 1
        return step_key(self.step, kind, key, self._counts[kind])

    # Hold points ----------------------------------------------------------------------

    def ask(
        self,
        prompt: str,
        schema: Any,
        expires_in: float | None = None,
        *,
        context: dict[str, Any] | None = None,
        reason: str = "",
        key: str | None = None,
    ) -> Any:
        """Ask a person; return the answer (valid against ``schema``).

        ``schema`` is JSON Schema (or the compact form), or a Pydantic model or a dataclass:
        then its JSON Schema is what the answer is checked against, and the answer comes
        back as an instance of it.

        The first time, this saves an ``input_required`` hold point on the checkpoint the
        step started from and ends the attempt. When the person answers, a new attempt
        runs this step again from that checkpoint, and the same ``ask`` (same key)
        returns the answer instead of asking again.
        """
        self.check()
        step_id = self._key("ask", key)
        answer = self._answers.get(step_id)
        answer_type = schema if is_typed(schema) else None
        if answer is not None and answer.kind == "input_required":
            return typed_value(answer_type, answer.value, f"answer to {step_id}")
        self._hold(
            kind="input_required",
            step_id=step_id,
            prompt=prompt,
            accepted_schema=schema_of(schema) if answer_type is not None else schema,
            expires_in=expires_in,
            context=context,
            reason=reason,
        )
        raise AssertionError("unreachable")  # pragma: no cover

    def choose(
        self,
        prompt: str,
        options: list[str] | dict[str, str],
        expires_in: float | None = None,
        *,
        context: dict[str, Any] | None = None,
        reason: str = "",
        key: str | None = None,
    ) -> str:
        """Ask a person to pick one of ``options``; return the value picked.

        ``options`` is a list of values, or a dict of value to the label people read. The
        dashboard shows up to three as one button each, more as radio buttons. A hold point
        like ``ask`` (key ``<step>.choose``), answered ``{"choice": value}``.
        """
        self.check()
        step_id = self._key("choose", key)
        answer = self._answers.get(step_id)
        if answer is not None and answer.kind == "input_required":
            value = answer.value
            return str(value.get("choice", "") if isinstance(value, dict) else value)
        self._hold(
            kind="input_required",
            step_id=step_id,
            prompt=prompt,
            accepted_schema=choice_schema(options),
            expires_in=expires_in,
            context=context,
            reason=reason,
        )
        raise AssertionError("unreachable")  # pragma: no cover

    def approve(
        self,
        action: str,
        target: str,
        detail: Any = None,
        expires_in: float | None = None,
        *,
        tool: str | None = None,
        reversibility: str | None = None,
        prompt: str | None = None,
        context: dict[str, Any] | None = None,
        reason: str = "",
        key: str | None = None,
        editable: Any = None,
        arguments: Any = None,
    ) -> Approval:
        """Ask for approval of ``action`` on ``target``; return the decision.

        A denial is returned, not raised: ``if approval.denied: ...``. An approval
        given when the run was started (``approvals=[step_id]``) is used without asking.
        An answer covers the action, target and detail it showed: called again with
        others, the step asks again.

        ``editable`` (a JSON Schema, compact form allowed) lets the approver change the
        planned ``arguments`` (default: ``detail``) before approving; the step then gets
        ``approval.edited``, checked against the schema. A person may also send the
        request back with a comment instead (``approval.responded``: not approved).
        """
        self.check()
        step_id = self._key("approve", key)
        change = to_json(detail, "approval detail")
        answer = self._answers.get(step_id)
        if (
            answer is not None
            and answer.kind == "auth_required"
            and self._backend.covers(answer, tool=tool or action, target=target, change=change)
        ):
            approval = approval_of(answer)
            self._use(answer)
            if approval.approved and approval.edited is not None:
                self._edited = (
                    answer,
                    {
                        "prompt": prompt or f"Approve {action} on {target}?",
                        "expires_in": expires_in,
                        "context": context,
                        "reason": reason,
                    },
                )
            return approval
        if step_id in self._lease.approvals:
            return Approval(approved=True, comment="Approved when the run was started.")
        if change_is_empty(change):
            # Never ask a person to approve nothing (issue 15): the step goes on, and the
            # timeline says why nobody was asked.
            self.log(
                f"Did not ask for approval of {action} on {target}: "
                "the planned change is empty (nothing would change).",
                event="approval_skipped",
                action=action,
                target=target,
            )
            self._skipped.append(f"{action} on {target}")
            return Approval(approved=True, comment="", unchanged=True)
        if tool and not reversibility:
            reversibility = self._backend.tool_reversibility(tool)
        self._hold(
            kind="auth_required",
            step_id=step_id,
            prompt=prompt or f"Approve {action} on {target}?",
            accepted_schema=None,
            expires_in=expires_in,
            context=context,
            reason=reason,
            action={
                "tool": tool or action,
                "action": action,
                "target": target,
                "change": change,
                "reversibility": reversibility or "",
                **(
                    {
                        "editable": {
                            "schema": to_json(editable, "editable schema"),
                            "value": to_json(
                                change if arguments is None else arguments, "approval arguments"
                            ),
                        }
                    }
                    if editable is not None
                    else {}
                ),
            },
        )
        raise AssertionError("unreachable")  # pragma: no cover

    def _hold(
        self,
        *,
        kind: str,
        step_id: str,
        prompt: str,
        accepted_schema: Any,
        expires_in: float | None,
        context: dict[str, Any] | None,
        reason: str,
        action: dict[str, Any] | None = None,
    ) -> None:
        shown = dict(to_json(context or {}, "hold point context"))
        if self._observed:
            # What the step saw when it asked, so the person sees it too and a re-run can
            # tell whether it changed while the run was waiting.
            shown.setdefault("observed", self._observed)
        owed = self._owed
        if owed is not None and not owed.settled:
            # Asked anew instead of using what people approved: the new card says why.
            owed.settled = True
            shown.setdefault(
                "superseded_approval",
                approval_note(
                    owed,
                    not_applied_reason(
                        owed,
                        changed=self._changed_list(),
                        asked=action,
                        asked_kind=kind,
                        asked_key=step_id,
                    ),
                ),
            )
        self._control.finishing.set()
        request_id = self._backend.interrupt(
            HoldPoint(
                checkpoint_id=self.checkpoint_id,
                kind=kind,
                prompt=prompt,
                accepted_schema=accepted_schema,
                expires_in=expires_in,
                context=shown,
                reason=reason,
                step_id=step_id,
                action=action,
            )
        )
        raise HoldPointReached(request_id)

    # Side effects ---------------------------------------------------------------------

    def side_effect(
        self,
        tool: str,
        target: str,
        request: dict[str, Any],
        *,
        compensate: dict[str, Any] | None = None,
        reversibility: str | None = None,
        key: str | None = None,
        approval: dict[str, Any] | None = None,
    ) -> Confirmed:
        """Act on the world through the ledger; return the confirmed outcome.

        ``approval`` shapes the question an irreversible call asks first: ``{"prompt":
        …, "expires_in": seconds, "context": {…}}`` (each optional; see
        ``approval_options``).

        The intent is written to the ledger (and committed) before the tool acts, with an
        idempotency key the tool passes on. When the step runs again (resume, retry, a
        crash), the same call finds the record: a confirmed effect is reused, never
        repeated; one left pending is looked up by its key first. An irreversible tool
        (e-mail, a plain webhook) asks for approval first unless the run was started
        with it (``approvals=[step_id]``); a denial raises ``ApprovalDenied``.
        ``compensate`` says how to undo this call (it declares an irreversible tool's call
        ``compensable``). An outcome nobody can tell stops the run (``side_effect_unknown``);
        a refusal raises ``SideEffectFailed``. Secret headers in ``request`` (``Authorization``,
        cookies, API keys…) are handed to the tool as given but stored redacted: pass them
        in ``request`` every time the step runs (the ledger cannot give them back).
        """
        self.check()
        asked = approval_options(approval)
        backend = self._backend
        the_tool = backend.tool(tool)
        if backend.asks_before(tool):
            granted = self.approve(tool, target, request, tool=tool, key=f"{key or tool}.approve")
            if granted.denied:
                raise ApprovalDenied(f"{tool} on {target} was denied.", approval=granted)
        step_id = self._key(tool, key)
        if (
            reversibility is None
            and compensate is not None
            and the_tool.reversibility == "irreversible"
        ):
            reversibility = "compensable"
        request = to_json(request, "side-effect request")
        answer = self._answers.get(step_id)
        if (
            answer is not None
            and answer.kind == "auth_required"
            and backend.covers(answer, tool=tool, target=target, change=request)
        ):
            self._use(answer)
        else:
            answer = None
        try:
            begin = backend.begin_side_effect(
                Intent(
                    step_id=step_id,
                    tool=tool,
                    target=target,
                    request=request,
                    reversibility=reversibility,
                    compensating_action=to_json(compensate, "compensating action"),
                    answer=answer,
                )
            )
        except ApprovalRequired as exc:
            self._approval_for_irreversible(step_id, tool, target, request, exc, asked)
            raise AssertionError("unreachable") from exc  # pragma: no cover
        if begin.decision == "reuse":
            return Confirmed(
                operation_id=begin.operation_id,
                external_reference=begin.external_reference,
                result=begin.result,
                decision="reuse",
            )
        if begin.decision == "look_up":
            # An earlier attempt wrote the intent and vanished: ask the external system
            # what became of the key before doing anything.
            try:
                outcome = the_tool.lookup(begin.idempotency_key)
            except OutcomeUnknown as exc:
                backend.record_outcome(begin.operation_id, Report("unknown", error=exc.as_error()))
                raise SideEffectUnknown(
                    f"{tool} on {target}: {exc.message}", operation_id=begin.operation_id
                ) from exc
            if outcome is not None:
                effect = backend.record_outcome(
                    begin.operation_id,
                    Report(
                        outcome.status,
                        external_reference=outcome.external_reference or None,
                        result=to_json(outcome.result, "tool result"),
                        error=to_json(outcome.error, "tool error"),
                    ),
                )
                return self._settled(effect, tool, target, "look_up")
        # "act", or a look-up that found no record: the action did not happen. Never act
        # on a lease that may be gone: the last safe point before the act.
        self._control.check()
        try:
            done = the_tool.execute(begin.request, begin.idempotency_key)
        except ActionFailed as exc:
            effect = backend.record_outcome(
                begin.operation_id, Report("failed", error=exc.as_error())
            )
        except OutcomeUnknown as exc:
            effect = backend.record_outcome(
                begin.operation_id, Report("unknown", error=exc.as_error())
            )
        except Exception as exc:
            # A failure inside the tool once it may have started: nobody can tell what it did.
            logger.exception("attempt %s: %s on %s raised", self.attempt_id, tool, target)
            effect = backend.record_outcome(
                begin.operation_id,
                Report("unknown", error={"type": type(exc).__name__, "message": str(exc)[:2000]}),
            )
        else:
            effect = backend.record_outcome(
                begin.operation_id,
                Report(
                    "confirmed",
                    external_reference=done.external_reference,
                    result=to_json(done.result, "tool result"),
                ),
            )
        return self._settled(effect, tool, target, begin.decision)

    def _settled(self, effect: Effect, tool: str, target: str, decision: str) -> Confirmed:
        """Turn the recorded effect into the step's answer (or the step's end)."""
        # The outcome is recorded whoever we are now: if the lease went meanwhile, the run
        # was cancelled or the step's deadline passed while the tool acted, stop here.
        self.check()
        if effect.status in ("confirmed", "compensation_failed"):
            return Confirmed(
                operation_id=effect.operation_id,
                external_reference=effect.external_reference,
                result=effect.result,
                decision=decision,
            )
        message = (effect.error or {}).get("message") if isinstance(effect.error, dict) else None
        if effect.status == "failed":
            raise SideEffectFailed(
                f"{tool} on {target} failed: {message or 'refused'}",
                operation_id=effect.operation_id,
                error=effect.error,
            )
        raise SideEffectUnknown(
            f"{tool} on {target}: {message or 'the outcome is unknown'}",
            operation_id=effect.operation_id,
        )

    def _approval_for_irreversible(
        self,
        step_id: str,
        tool: str,
        target: str,
        request: Any,
        exc: ApprovalRequired,
        asked: dict[str, Any],
    ) -> None:
        """The ledger wants an approval for this irreversible call: a decision on this very
        call that was not an approval raises ``ApprovalDenied``; an approval the ledger
        still refuses fails the attempt; else ask (the same hold point as ``approve``; an
        approval of another action in the step covers nothing here)."""
        answer = self._answers.get(step_id)
        if answer is not None and not (
            answer.kind == "auth_required"
            and self._backend.covers(answer, tool=tool, target=target, change=request)
        ):
            answer = None
        if answer is not None or exc.decided:
            approval = (
                approval_of(answer)
                if answer is not None
                else Approval(
                    approved=False,
                    answered_by=exc.denied_by,
                    comment=exc.comment,
                    decision=exc.decision,
                )
            )
            who = approval.answered_by or exc.denied_by
            by = f" by {who}" if who else ""
            if approval.responded:
                raise ApprovalDenied(
                    f"{tool} on {target} was sent back{by}: {approval.comment}",
                    approval=approval,
                )
            if approval.denied:
                raise ApprovalDenied(
                    f"{tool} on {target} was denied{by}"
                    + (f": {approval.comment}" if approval.comment else "."),
                    approval=approval,
                )
            # Approved, yet the ledger refuses: let the attempt fail and say so.
            raise Refused("approval_required", exc.detail) from exc
        editable = self._backend.editable(tool, request)
        self._hold(
            kind="auth_required",
            step_id=step_id,
            prompt=asked.get("prompt") or f"Approve {tool} on {target}? It cannot be undone.",
            accepted_schema=None,
            expires_in=asked.get("expires_in"),
            context=asked.get("context"),
            reason=exc.detail,
            action={
                "tool": tool,
                "action": tool,
                "target": target,
                "change": request,
                "reversibility": "irreversible",
                **({"title": asked["title"]} if asked.get("title") else {}),
                **({"editable": editable} if editable else {}),
            },
        )

    # What people approved ---------------------------------------------------------------

    def _use(self, answer: Answer) -> None:
        """The step uses the answered approval ``answer`` (a call it covers)."""
        if self._owed is not None and self._owed.request_id == answer.request_id:
            self._owed.settled = True

    def _changed_list(self) -> list[tuple[str, Any, Any]]:
        return [(name, *self._changes[name]) for name in sorted(self._changed)]

    def _approval_not_applied(self) -> str | None:
        """Why the step, which has ended, did not use the approval its attempt was resumed
        with (the ``ApprovalNotApplied`` failure's message); None when it did."""
        owed = self._owed
        if owed is None or owed.settled:
            return None
        return not_applied_message(
            owed,
            not_applied_reason(owed, changed=self._changed_list(), skipped=self._skipped),
        )

    def _ask_again_refused(self, refused: EditRefused) -> None:
        """The step refused the edit of its last approval with one (``EditRefused``): ask
        the same approval again (same hold point, same plan), saying why. Raises
        ``HoldPointReached``; returns only when the step got no approved edit to refuse."""
        if self._edited is None:
            return
        answer, asked = self._edited
        owed = answer_as_owed(answer)
        assert owed is not None
        shown = dict(to_json(asked["context"] or {}, "hold point context"))
        shown["refused_edit"] = approval_note(owed, refused.reason)
        self._hold(
            kind="auth_required",
            step_id=answer.step_id,
            prompt=asked["prompt"],
            accepted_schema=None,
            expires_in=asked["expires_in"],
            context=shown,
            reason=asked["reason"],
            action=answer.action,
        )

    # Observations ---------------------------------------------------------------------

    def observe(self, name: str, read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Read something volatile (a file, a config version, a price) and return it.

        ``read(*args, **kwargs)`` runs every time the step runs, never from a cache. The
        value is remembered with any question this step asks; when the step runs again
        after the answer, ``ctx.changed(name)`` says whether it changed while waiting,
        and the change is logged on the run's timeline.
        """
        self.check()
        value = read(*args, **kwargs)
        as_json = to_json(value, f"observed value {name!r}")
        print_ = fingerprint(as_json)
        summary: dict[str, Any] = {"fingerprint": print_}
        if len(canonical_json(as_json)) <= _OBSERVED_VALUE_MAX:
            summary["value"] = as_json
        self._observed[name] = summary
        before = None
        for answer in self._answers.values():
            observed = (answer.context or {}).get("observed") or {}
            if isinstance(observed, dict) and isinstance(observed.get(name), dict):
                before = observed[name]
        if before is not None and before.get("fingerprint") != print_:
            self._changed.add(name)
            self._changes[name] = (before.get("value"), summary.get("value"))
            self.log(
                f"{name} changed while the run was waiting",
                level="warning",
                name=name,
                before=before.get("value"),
                after=summary.get("value"),
            )
        return value

    def changed(self, name: str) -> bool:
        """Whether ``name`` was observed with a different value when the question was asked."""
        return name in self._changed

    # Cost and log ---------------------------------------------------------------------

    def cost(self, amount: float | Decimal | str) -> Decimal:
        """Add ``amount`` to this attempt's cost; return the attempt's total.

        Past the agent's ``cost_budget`` (all attempts together) the step stops with
        ``CostBudgetExceeded``.
        """
        self.check()
        try:
            value = Decimal(str(amount))
        except InvalidOperation:
            raise ValueError(f"cost must be a number, not {amount!r}") from None
        if not value.is_finite() or value < 0:
            raise ValueError("cost must be a non-negative number")
        total = self._control.add_cost(value)
        before = self._lease.run_cost
        if self._cost_budget is not None and before + total > Decimal(str(self._cost_budget)):
            raise CostBudgetExceeded(
                f"The run has cost {before + total}, past its budget of {self._cost_budget}."
            )
        return total

    def log(self, message: str, level: str = "info", **data: Any) -> None:
        """Add a line to the run's timeline (event ``agent.log``). A safe point."""
        self.check()
        self._backend.log(
            step=self.step,
            message=str(message)[:2000] or "(empty)",
            level=level,
            data=json.loads(json.dumps(data, default=str)) if data else None,
        )
