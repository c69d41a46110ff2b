"""The ``ctx`` a step receives: the same calls as ``runtime.context.Context`` in process.

Every ``ctx`` call is a safe point: it unwinds the step when the run was cancelled or
the lease was lost. Hold points and side effects are identified by a key within the
step, ``<step>.<kind>`` (``#2``, ``#3``… for later calls of the kind), or
``<step>.<key>`` with ``key=``; a re-run of the step finds its answer, and the ledger
its side effect, by that key (docs/protocol.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from holdpoint_client.control import AttemptControl, HoldPointReached, SideEffectUnknown
from holdpoint_client.http import Problem
from holdpoint_client.tools import ActionFailed, OutcomeUnknown, Tool
from holdpoint_client.types import (
    Approval,
    ApprovalDenied,
    Confirmed,
    CostBudgetExceeded,
    Done,
    Next,
    SideEffectFailed,
)

logger = logging.getLogger("holdpoint_client")

MAX_KEY_LENGTH = 100
_KEY_DIGEST = 20
_OBSERVED_VALUE_MAX = 2000


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def to_json(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"The {what} must be JSON: {exc}") from None


def hold_point_key(raw: str) -> str:
    """``raw`` when it fits in 100 characters, else its start and a hash of all of it."""
    if len(raw) <= MAX_KEY_LENGTH:
        return raw
    digest = hashlib.sha256(raw.encode("utf-8")).hexdigest()[:_KEY_DIGEST]
    return f"{raw[: MAX_KEY_LENGTH - _KEY_DIGEST - 1]}~{digest}"


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
    """Whether an approval's planned change changes nothing (every from equals its to)."""
    if not isinstance(detail, dict):
        return False
    top = _pair(detail)
    if top is not None:
        return canonical_json(top[0]) == canonical_json(top[1])
    if "before" in detail and "after" in detail:
        return canonical_json(detail["before"]) == canonical_json(detail["after"])
    pairs = [p for p in (_pair(v) for v in detail.values()) if p is not None]
    return bool(pairs) and all(canonical_json(a) == canonical_json(b) for a, b in pairs)


def covers(answer: dict[str, Any], *, tool: str, target: str, change: Any) -> bool:
    """Whether an answered approval showed exactly this action."""
    action = answer.get("action") or {}
    return (
        str(action.get("tool", "")) == tool
        and str(action.get("target", "")) == target
        and canonical_json(action.get("change")) == canonical_json(change)
    )


def _approval(answer: dict[str, Any]) -> Approval:
    """The step's view of an answered approval (as ``runtime.context.approval_of``)."""
    value = answer.get("answer")
    value = value if isinstance(value, dict) else {}
    approvers = value.get("approvers")
    return Approval(
        approved=value.get("decision") == "approve",
        comment=str(value.get("comment") or ""),
        answered_by=answer.get("answered_by"),
        request_id=str(answer.get("request_id", "")),
        decision=str(value.get("decision") or ""),
        edited=value.get("edited"),
        approvers=tuple(str(a) for a in approvers) if isinstance(approvers, list) else (),
    )


# Secret header values are never stored by the server (``ledger/outbound.py`` redacts
# them): the same rule here, so that an editable request shows the placeholder, and an
# approver's edit gets the real values back from the plan this process holds.
REDACTED = "[redacted]"
_SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"}
)
_SECRET_WORDS = ("token", "secret", "key", "password", "passwd", "auth", "session", "signature")


def _is_secret_header(name: str) -> bool:
    lowered = name.lower()
    return lowered in _SECRET_HEADERS or any(word in lowered for word in _SECRET_WORDS)


def redact_request(request: Any) -> Any:
    """``request`` with secret header values replaced by ``[redacted]``."""
    if not (isinstance(request, dict) and isinstance(request.get("headers"), dict)):
        return request
    headers = {
        name: REDACTED if isinstance(name, str) and _is_secret_header(name) else value
        for name, value in request["headers"].items()
    }
    return {**request, "headers": headers}


def with_secrets(edited: Any, planned: Any) -> Any:
    """An approver's edit of a request, with the secret header values the card showed
    redacted put back from the plan (the server never had them)."""
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


class Context:
    def __init__(
        self,
        *,
        control: AttemptControl,
        tools: dict[str, Tool],
        approval_policy: dict[str, Any],
        step: str,
        checkpoint_id: str,
        answers: dict[str, dict[str, Any]],
        resumed: bool,
        cost_before: Decimal,
        cost_budget: float | None,
    ) -> None:
        self._control = control
        self._lease = control.lease
        self._tools = tools
        self._approval_policy = approval_policy
        self._answers = answers
        self._counts: Counter[str] = Counter()
        self._observed: dict[str, Any] = {}
        self._changed: set[str] = set()
        self._cost_before = cost_before
        self._cost_budget = cost_budget
        self.step = step
        self.checkpoint_id = checkpoint_id
        self.resumed = resumed

    # What the step is working on ------------------------------------------------------

    @property
    def run_id(self) -> str:
        return str(self._lease["run_id"])

    @property
    def attempt_id(self) -> str:
        return str(self._lease["attempt_id"])

    @property
    def attempt_number(self) -> int:
        return int(self._lease["number"])

    @property
    def attempt_reason(self) -> str:
        return str(self._lease["reason"])

    @property
    def input(self) -> Any:
        return self._lease["input"]

    @property
    def agent_version(self) -> int | None:
        """The declared version the run started with (its input was valid against that
        version's schema): a step may branch on it when the code moved on since."""
        version = self._lease.get("agent_version")
        return int(version) if version is not None else None

    # Results --------------------------------------------------------------------------

    def next(self, step: str, state: Any = None) -> Next:
        return Next(step=step, state={} if state is None else state)

    def done(self, result: Any = None) -> Done:
        return Done(result=result)

    # Safe points ----------------------------------------------------------------------

    def check(self) -> None:
        """Stop here if the run was cancelled or the lease was lost."""
        self._control.check()

    def sleep(self, seconds: float) -> None:
        """Wait, but wake at once (and unwind) on cancel or a lost lease."""
        self.check()
        self._control.wake.wait(max(0.0, seconds))
        self.check()

    def _key(self, kind: str, key: str | None) -> str:
        if key is not None:
            if not key:
                raise ValueError("key must not be empty")
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
        """Ask a person; return the answer. The first time this ends the attempt at a hold
        point; the answer resumes the step, and the same call returns it."""
        self.check()
        step_id = self._key("ask", key)
        answer = self._answers.get(step_id)
        if answer is not None and answer.get("kind") == "input_required":
            return answer.get("answer")
        self._hold(
            kind="input_required",
            step_id=step_id,
            prompt=prompt,
            accepted_schema=schema,
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
        """Ask for approval of ``action`` on ``target``; a denial is returned, not raised.

        ``editable`` (a JSON Schema, compact form allowed) lets the approver change the
        planned ``arguments`` (default: ``detail``) before approving; the step then gets
        ``approval.edited`` (checked against the schema by the server). A person may also
        send the request back with a comment (``approval.responded``: not approved).
        """
        self.check()
        step_id = self._key("approve", key)
        change = to_json(detail, "approval detail")
        answer = self._answers.get(step_id)
        if (
            answer is not None
            and answer.get("kind") == "auth_required"
            and covers(answer, tool=tool or action, target=target, change=change)
        ):
            return _approval(answer)
        if step_id in (self._lease.get("approvals") or []):
            return Approval(approved=True, comment="Approved when the run was started.")
        if change_is_empty(change):
            self.log(
                f"Did not ask for approval of {action} on {target}: "
                "the planned change is empty (nothing would change).",
                event="approval_skipped",
                action=action,
                target=target,
            )
            return Approval(approved=True, unchanged=True)
        if tool and not reversibility and tool in self._tools:
            reversibility = self._tools[tool].reversibility
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
            shown.setdefault("observed", self._observed)
        body: dict[str, Any] = {
            "checkpoint_id": self.checkpoint_id,
            "kind": kind,
            "prompt": prompt,
            "accepted_schema": accepted_schema,
            "context": shown,
            "reason": reason,
            "step_id": step_id,
        }
        if expires_in is not None:
            body["expires_in"] = expires_in
        if action is not None:
            body["action"] = action
        self._control.finishing.set()
        request = self._control.write("interrupt", body)
        raise HoldPointReached(str(request["request_id"]))

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
    ) -> Confirmed:
        """Act on the world through the ledger; return the confirmed outcome.

        The server writes the intent (fenced) before the tool acts here, with the
        idempotency key the tool passes on; a re-run finds the record and reuses a
        confirmed effect, looks up a pending one first, and never repeats an act.
        """
        self.check()
        the_tool = self._tools.get(tool)
        if the_tool is None:
            raise SideEffectFailed(
                f"This agent has no tool named {tool!r} (its tools: {', '.join(self._tools)}).",
                operation_id="",
            )
        if tool in (self._approval_policy.get("ask_before") or []):
            approval = self.approve(tool, target, request, tool=tool, key=f"{key or tool}.approve")
            if approval.denied:
                raise ApprovalDenied(f"{tool} on {target} was denied.", approval=approval)
        step_id = self._key(tool, key)
        if (
            reversibility is None
            and compensate is not None
            and the_tool.reversibility == "irreversible"
        ):
            reversibility = "compensable"
        request = to_json(request, "side-effect request")
        body: dict[str, Any] = {
            "step_id": step_id,
            "tool": tool,
            "target": target,
            "request": request,
        }
        if reversibility is not None:
            body["reversibility"] = reversibility
        if compensate is not None:
            body["compensating_action"] = to_json(compensate, "compensating action")
        try:
            try:
                begin = self._control.write("side-effects", body, with_cost=False)
            except Problem as exc:
                if not (
                    exc.code == "approval_required"
                    and isinstance(exc.body.get("edited"), dict)
                    and exc.body.get("edited_idempotency_key")
                ):
                    raise
                # Approved with edits: the edited request is what runs, under its own key
                # (the server says which; the plan itself was not approved).
                request = with_secrets(exc.body["edited"], request)
                body = {
                    **body,
                    "request": request,
                    "idempotency_key": str(exc.body["edited_idempotency_key"]),
                }
                begin = self._control.write("side-effects", body, with_cost=False)
        except Problem as exc:
            if exc.code == "side_effect_unknown":
                raise SideEffectUnknown(
                    exc.detail, operation_id=str(exc.body.get("operation_id", ""))
                ) from exc
            if exc.code == "approval_required" and "idempotency_key" not in body:
                self._approval_for_irreversible(step_id, tool, target, request, exc)
            raise
        decision = begin["decision"]
        operation_id = str(begin["operation_id"])
        if decision == "reuse":
            return Confirmed(
                operation_id=operation_id,
                external_reference=str(begin.get("external_reference") or ""),
                result=begin.get("result"),
                decision="reuse",
            )
        key_ = str(begin["idempotency_key"])
        if decision == "look_up":
            try:
                outcome = the_tool.lookup(key_)
            except OutcomeUnknown as exc:
                self._control.outcome(operation_id, {"status": "unknown", "error": exc.as_error()})
                raise SideEffectUnknown(
                    f"{tool} on {target}: {exc.message}", operation_id=operation_id
                ) from exc
            if outcome is not None:
                effect = self._control.outcome(
                    operation_id,
                    {
                        "status": outcome.status,
                        "external_reference": outcome.external_reference or None,
                        "result": to_json(outcome.result, "tool result"),
                        "error": to_json(outcome.error, "tool error"),
                    },
                )
                return self._settled(effect, tool, target, "look_up")
        # Never act on a lease that may be gone: the last safe point before the act.
        self.check()
        try:
            done = the_tool.execute(request, key_)
        except ActionFailed as exc:
            effect = self._control.outcome(
                operation_id, {"status": "failed", "error": exc.as_error()}
            )
        except OutcomeUnknown as exc:
            effect = self._control.outcome(
                operation_id, {"status": "unknown", "error": exc.as_error()}
            )
        except Exception as exc:
            logger.exception("attempt %s: %s on %s raised", self.attempt_id, tool, target)
            effect = self._control.outcome(
                operation_id,
                {
                    "status": "unknown",
                    "error": {"type": type(exc).__name__, "message": str(exc)[:2000]},
                },
            )
        else:
            effect = self._control.outcome(
                operation_id,
                {
                    "status": "confirmed",
                    "external_reference": done.external_reference,
                    "result": to_json(done.result, "tool result"),
                },
            )
        return self._settled(effect, tool, target, decision)

    def _settled(self, effect: dict[str, Any], tool: str, target: str, decision: str) -> Confirmed:
        self.check()
        status = effect.get("status")
        if status in ("confirmed", "compensation_failed"):
            return Confirmed(
                operation_id=str(effect["operation_id"]),
                external_reference=str(effect.get("external_reference") or ""),
                result=effect.get("result"),
                decision=decision,
            )
        error = effect.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        if status == "failed":
            raise SideEffectFailed(
                f"{tool} on {target} failed: {message or 'refused'}",
                operation_id=str(effect["operation_id"]),
                error=error,
            )
        raise SideEffectUnknown(
            f"{tool} on {target}: {message or 'the outcome is unknown'}",
            operation_id=str(effect["operation_id"]),
        )

    def _approval_for_irreversible(
        self, step_id: str, tool: str, target: str, request: Any, exc: Problem
    ) -> None:
        """The ledger wants an approval of this very call: a denial of it raises
        ``ApprovalDenied``; without a decision, ask (an approval hold point)."""
        if exc.body.get("request_id"):
            answer = self._answers.get(step_id) or {}
            approval = (
                _approval(answer)
                if answer
                else Approval(approved=False, answered_by=exc.body.get("denied_by"))
            )
            who = approval.answered_by or exc.body.get("denied_by")
            if approval.responded:
                raise ApprovalDenied(
                    f"{tool} on {target} was sent back"
                    + (f" by {who}" if who else "")
                    + f": {approval.comment}",
                    approval=approval,
                )
            raise ApprovalDenied(
                f"{tool} on {target} was denied"
                + (f" by {who}" if who else "")
                + (f": {approval.comment}" if approval.comment else "."),
                approval=approval,
            )
        asked = self._answers.get(step_id)
        if asked is not None and covers(asked, tool=tool, target=target, change=request):
            raise exc  # Answered about this call, yet refused: fail the attempt and say so.
        action: dict[str, Any] = {
            "tool": tool,
            "action": tool,
            "target": target,
            "change": request,
            "reversibility": "irreversible",
        }
        # A tool with ``edit_schema`` (a JSON Schema of its request) lets the approver
        # edit the call before approving it; secret header values are shown redacted.
        edit_schema = getattr(self._tools.get(tool), "edit_schema", None)
        hold = functools.partial(
            self._hold,
            kind="auth_required",
            step_id=step_id,
            prompt=f"Approve {tool} on {target}? It cannot be undone.",
            accepted_schema=None,
            expires_in=None,
            context=None,
            reason=exc.detail,
        )
        if isinstance(edit_schema, dict):
            try:
                hold(
                    action={
                        **action,
                        "editable": {"schema": edit_schema, "value": redact_request(request)},
                    }
                )
            except Problem as refused:
                pointers = [
                    str(e.get("pointer", ""))
                    for e in refused.body.get("errors") or []
                    if isinstance(e, dict)
                ]
                if not (
                    refused.code == "invalid_input"
                    and pointers
                    and all(p.startswith("/action/editable") for p in pointers)
                ):
                    raise
                # The plan does not fit the tool's form: ask without the form.
        hold(action=action)

    # Observations ---------------------------------------------------------------------

    def observe(self, name: str, read: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Read something volatile and return it; remembered with any question this step
        asks, so that after the answer ``ctx.changed(name)`` says whether it changed."""
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
            observed = (answer.get("context") or {}).get("observed") or {}
            if isinstance(observed, dict) and isinstance(observed.get(name), dict):
                before = observed[name]
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

    def changed(self, name: str) -> bool:
        return name in self._changed

    # Cost and log ---------------------------------------------------------------------

    def cost(self, amount: float | Decimal | str) -> Decimal:
        """Add ``amount`` to this attempt's cost (sent with the next heartbeat and write)."""
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
        body: dict[str, Any] = {
            "message": str(message)[:2000] or "(empty)",
            "level": level,
            "step": self.step,
        }
        if data:
            body["data"] = json.loads(json.dumps(data, default=str))
        self._control.write("log", body, with_cost=False)
