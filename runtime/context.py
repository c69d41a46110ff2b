"""The ``ctx`` a step receives: hold points, side effects, observations, cost and log.

Every ``ctx`` call is a safe point: it raises (unwinding the step) when the run was
cancelled or the lease was lost, so a step that calls ``ctx`` stops quickly.

Hold points, side effects and approvals are identified by a *key* within the step:
``<step>.<kind>`` for the first call of a kind in a step run (``kind`` is ``ask``,
``approve`` or the tool's name), ``<step>.<kind>#2`` for the second, and so on; or
``<step>.<key>`` when the call passes ``key=``. The key is how a re-run of the step
finds the answer to its question and the ledger finds the side effect it already did.
A key longer than the 100 characters a hold point keeps is shortened to a prefix and
a hash of the whole key (``hold_point_key``), so two long keys never become one.

An approval covers the action it showed (tool, target, request) and nothing else: a
re-run of the step that would do something else asks again, in a new hold point.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections import Counter
from decimal import Decimal, InvalidOperation
from typing import Any

from runs import services
from runs.errors import HoldpointError
from runs.schemas import canonical_json
from runtime.control import AttemptControl, HoldPointReached, SideEffectUnknown, StepTimeout
from runtime.questions import approval_options, choice_schema, typed_value
from runtime.selectors import Answer
from runtime.typed import is_typed, schema_of
from runtime.types import (
    Approval,
    ApprovalDenied,
    Confirmed,
    CostBudgetExceeded,
    Done,
    Next,
    SideEffectFailed,
)

logger = logging.getLogger("runtime")

# Observed values up to this size are shown to the person with the question; larger
# ones are kept as a fingerprint only.
_OBSERVED_VALUE_MAX = 2000


def to_json(value: Any, what: str) -> Any:
    """Return ``value`` as it will come back from the database, or raise ``TypeError``."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"The {what} must be JSON: {exc}") from None


MAX_KEY_LENGTH = 100  # InputRequest.step_id and SideEffect.step_id
_KEY_DIGEST = 20


def hold_point_key(raw: str) -> str:
    """``raw`` when it fits; else its start and a hash of all of it, within 100 characters.

    Cutting at 100 characters would make two keys that share their first 100 characters
    one key, and an answer or a side effect of one would be taken for the other.
    """
    if len(raw) <= MAX_KEY_LENGTH:
        return raw
    digest = hashlib.sha256(raw.encode("utf-8")).hexdigest()[:_KEY_DIGEST]
    return f"{raw[: MAX_KEY_LENGTH - _KEY_DIGEST - 1]}~{digest}"


def covers(answer: Answer, *, tool: str, target: str, request: Any) -> bool:
    """Whether the answered approval was asked about exactly this action, as planned (the
    ledger's hash of what the card showed; an approver's edit is applied after)."""
    from ledger.services import action_hash, approved_action_hash

    return approved_action_hash(answer.action) == action_hash(
        tool=tool, target=target, request=request
    )


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


def with_secrets(edited: Any, planned: Any) -> Any:
    """An approver's edit of a request, with the secret header values the card showed
    redacted put back from the plan the step holds in memory (the ledger never had them)."""
    from ledger.outbound import REDACTED

    if not (isinstance(edited, dict) and isinstance(planned, dict)):
        return edited
    headers, original = edited.get("headers"), planned.get("headers")
    if not (isinstance(headers, dict) and isinstance(original, dict)):
        return edited
    restored = {
        name: original[name] if value == REDACTED and name in original else value
        for name, value in headers.items()
    }
    return {**edited, "headers": restored}


def _editable_request(tool: Any, request: Any) -> dict[str, Any] | None:
    """What an approver of an irreversible call may edit: the request (secrets redacted),
    when the tool offers a form for it (``edit_schema``) and the plan fits it."""
    from ledger.outbound import redact_request
    from runs.schemas import validation_errors

    schema = getattr(tool, "edit_schema", None)
    shown = redact_request(request)
    if not isinstance(schema, dict) or validation_errors(schema, shown):
        return None
    return {"schema": schema, "value": shown}


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


def _tool_reversibility(name: str) -> str:
    from ledger.tools import get_tool

    try:
        return str(get_tool(name).reversibility)
    except HoldpointError:
        return ""


class Context:
    """What a step can do besides computing its next state. One per step run."""

    def __init__(
        self,
        *,
        control: AttemptControl,
        step: str,
        checkpoint_id: str,
        answers: dict[str, Answer],
        resumed: bool,
        cost_before: Decimal,
        cost_budget: float | None,
        input_type: type | None = None,
        timeout: float | None = None,
    ) -> None:
        self._control = control
        self._input_type = input_type
        self._typed_input: Any = None
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout if timeout is not None else None
        self._lease = control.lease
        self._answers = answers
        self._counts: Counter[str] = Counter()
        self._observed: dict[str, Any] = {}
        self._changed: set[str] = set()
        self._cost_before = cost_before
        self._cost_budget = cost_budget
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
    def input(self) -> Any:
        """The run's input: JSON, or an instance of the agent's input type (a Pydantic
        model or a dataclass given as ``input_schema``)."""
        if self._input_type is None:
            return self._lease.input
        if self._typed_input is None:
            # Built once per step run: the step sees one instance, however often it reads it.
            self._typed_input = typed_value(self._input_type, self._lease.input, "input")
        return self._typed_input

    # Results of a step ----------------------------------------------------------------

    def next(self, step: str, state: Any = None) -> Next:
        """Go on with ``step``; ``state`` is saved in a checkpoint before it runs."""
        return Next(step=step, state={} if state is None else state)

    def done(self, result: Any = None) -> Done:
        """Finish the run successfully with ``result``."""
        return Done(result=result)

    # Safe points ----------------------------------------------------------------------

    def check(self) -> None:
        """Stop here if the run was cancelled, the lease was lost or the step ran past its
        ``timeout``. Long loops call it."""
        self._control.check()
        if self._deadline is not None and time.monotonic() >= self._deadline:
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
            wait = min(wait, max(0.0, self._deadline - time.monotonic()))
        self._control.wake.wait(wait)
        self.check()

    # Keys -----------------------------------------------------------------------------

    def _key(self, kind: str, key: str | None) -> str:
        if key:
            return hold_point_key(f"{self.step}.{key}")
        self._counts[kind] += 1
        n = self._counts[kind]
        return hold_point_key(f"{self.step}.{kind}" if n == 1 else f"{self.step}.{kind}#{n}")

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
            return str((answer.value or {}).get("choice", ""))
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
            and covers(answer, tool=tool or action, target=target, request=change)
        ):
            return approval_of(answer)
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
            return Approval(approved=True, comment="", unchanged=True)
        if tool and not reversibility:
            reversibility = _tool_reversibility(tool)
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
        self._control.finishing.set()
        request = self._control.write(
            services.attempt_interrupt,
            checkpoint_id=self.checkpoint_id,
            kind=kind,
            prompt=prompt,
            accepted_schema=accepted_schema,
            expires_in=expires_in,
            context=shown,
            reason=reason,
            step_id=step_id,
            action=action,
            cost=self._control.cost_arg(),
        )
        raise HoldPointReached(request.id)

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
        from ledger import services as ledger
        from ledger.tools import ActionFailed, OutcomeUnknown, get_tool

        self.check()
        asked = approval_options(approval)
        step_id = self._key(tool, key)
        the_tool = get_tool(tool)
        if (
            reversibility is None
            and compensate is not None
            and the_tool.reversibility == "irreversible"
        ):
            reversibility = "compensable"
        request = to_json(request, "side-effect request")
        edited_key: dict[str, str] = {}
        answer = self._answers.get(step_id)
        if (
            answer is not None
            and answer.kind == "auth_required"
            and isinstance(answer.value, dict)
            and answer.value.get("decision") == "approve"
            and "edited" in answer.value
            and covers(answer, tool=tool, target=target, request=request)
        ):
            # Approved with edits: the edited request is what runs, under its own key.
            request = with_secrets(answer.value["edited"], request)
            edited_key["idempotency_key"] = ledger.edited_idempotency_key(
                run_id=self.run_id, step_id=step_id, tool=tool, request=request
            )
        try:
            begin = self._control.write(
                ledger.side_effect_begin,
                step_id=step_id,
                tool=tool,
                target=target,
                request=request,
                reversibility=reversibility,
                compensating_action=to_json(compensate, "compensating action"),
                **edited_key,
            )
        except HoldpointError as exc:
            if exc.code == "side_effect_unknown":
                raise SideEffectUnknown(
                    exc.detail, operation_id=str(exc.extra.get("operation_id", ""))
                ) from exc
            if exc.code == "approval_required":
                self._approval_for_irreversible(step_id, tool, target, request, exc, asked)
            raise
        if begin.decision == "reuse":
            return Confirmed(
                operation_id=begin.operation_id,
                external_reference=begin.external_reference,
                result=begin.result,
                decision="reuse",
            )
        record = functools.partial(
            ledger.side_effect_record_outcome,
            operation_id=begin.operation_id,
            lease_epoch=self._lease.lease_epoch,
            cancel_epoch=self._lease.cancel_epoch,
        )
        if begin.decision == "look_up":
            # An earlier attempt wrote the intent and vanished: ask the external system
            # what became of the key before doing anything.
            try:
                outcome = the_tool.lookup(begin.idempotency_key)
            except OutcomeUnknown as exc:
                record(status="unknown", error=exc.as_error())
                raise SideEffectUnknown(
                    f"{tool} on {target}: {exc.message}", operation_id=begin.operation_id
                ) from exc
            if outcome is not None:
                effect = record(
                    status=outcome.status,
                    external_reference=outcome.external_reference or None,
                    result=outcome.result,
                    error=outcome.error,
                )
                return self._settled(effect, tool, target, "look_up")
        # "act", or a look-up that found no record: the action did not happen; do it now,
        # with the key that was recorded before it.
        try:
            done = the_tool.execute(request, begin.idempotency_key)
        except ActionFailed as exc:
            effect = record(status="failed", error=exc.as_error())
        except OutcomeUnknown as exc:
            effect = record(status="unknown", error=exc.as_error())
        except Exception as exc:
            # A failure inside the tool once it may have started: nobody can tell what it did.
            logger.exception("attempt %s: %s on %s raised", self.attempt_id, tool, target)
            effect = record(
                status="unknown", error={"type": type(exc).__name__, "message": str(exc)[:2000]}
            )
        else:
            effect = record(
                status="confirmed",
                external_reference=done.external_reference,
                result=done.result,
            )
        return self._settled(effect, tool, target, begin.decision)

    def _settled(self, effect: Any, tool: str, target: str, decision: str) -> Confirmed:
        """Turn the recorded effect into the step's answer (or the step's end)."""
        # The outcome is recorded whoever we are now; if the lease went meanwhile, stop here.
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
        exc: HoldpointError,
        asked: dict[str, Any] | None = None,
    ) -> None:
        """The ledger wants an approval for this irreversible call: use the answer to this
        step's question if it was about this very call, else ask (the same hold point as
        ``approve``; an approval of another action in the step covers nothing here)."""
        from ledger.tools import get_tool

        answer = self._answers.get(step_id)
        if (
            answer is not None
            and answer.kind == "auth_required"
            and covers(answer, tool=tool, target=target, request=request)
        ):
            approval = approval_of(answer)
            if approval.responded:
                raise ApprovalDenied(
                    f"{tool} on {target} was sent back"
                    + (f" by {approval.answered_by}" if approval.answered_by else "")
                    + f": {approval.comment}",
                    approval=approval,
                )
            if approval.denied:
                raise ApprovalDenied(
                    f"{tool} on {target} was denied"
                    + (f" by {approval.answered_by}" if approval.answered_by else "")
                    + (f": {approval.comment}" if approval.comment else "."),
                    approval=approval,
                )
            raise exc  # Approved, yet the ledger refuses: let the attempt fail and say so.
        asked = asked or {}
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
                **(
                    {"editable": editable}
                    if (editable := _editable_request(get_tool(tool), request))
                    else {}
                ),
            },
        )

    # Observations ---------------------------------------------------------------------

    def observe(self, name: str, read: Any, *args: Any, **kwargs: Any) -> Any:
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
        before = self._observed_before(name)
        if before is not None and before.get("fingerprint") != print_:
            self._changed.add(name)
            self.log(
                f"{name} changed while the run was waiting",
                level="warning",
                name=name,
                before=before.get("value"),
                after=summary.get("value"),
            )
        return value

    def _observed_before(self, name: str) -> dict[str, Any] | None:
        found = None
        for answer in self._answers.values():
            observed = (answer.context or {}).get("observed") or {}
            if isinstance(observed, dict) and isinstance(observed.get(name), dict):
                found = observed[name]
        return found

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
        if self._cost_budget is not None and self._cost_before + total > Decimal(
            str(self._cost_budget)
        ):
            raise CostBudgetExceeded(
                f"The run has cost {self._cost_before + total}, past its budget of "
                f"{self._cost_budget}."
            )
        return total

    def log(self, message: str, level: str = "info", **data: Any) -> None:
        """Add a line to the run's timeline (event ``agent.log``)."""
        self._control.write(
            services.attempt_log,
            message=str(message)[:2000] or "(empty)",
            level=level,
            step=self.step,
            data=json.loads(json.dumps(data, default=str)) if data else None,
        )
