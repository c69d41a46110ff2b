"""The run store in process under the agent SDK's one runtime: what ``manage.py runagents``
(``worker.py``) runs each claimed attempt on.

The SDK (``holdpoint_client``: ``ctx``, the executor, the control) asks its ``Backend``
for writes; here each is a call of a run-store or ledger service with the attempt's
epochs, fenced under the run's row lock. A refusal by the fence unwinds the step:
``stale_worker`` means someone else owns the run (write nothing more),
``stale_after_cancel`` means stop and acknowledge the cancel. Any other refusal
(``HoldpointError``) is the store refusing what the step asked (``Refused``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from decimal import Decimal
from typing import Any, TypeVar

from holdpoint_client.agent import Agent
from holdpoint_client.backend import (
    ApprovalRequired,
    AttemptLease,
    BackendBase,
    Begin,
    Effect,
    HoldPoint,
    Intent,
    Refused,
    Report,
    with_secrets,
)
from holdpoint_client.tools import Tool

from runs import services
from runs.errors import HoldpointError
from runtime.control import AttemptControl, CancelRequested, LeaseLost, SideEffectUnknown
from runtime.selectors import answers_for

logger = logging.getLogger("runtime")

T = TypeVar("T")


def attempt_lease(lease: services.Lease) -> AttemptLease:
    """The run store's lease as the runtime reads it (the answers by the matching rule)."""
    return AttemptLease(
        run_id=lease.run_id,
        attempt_id=lease.attempt_id,
        agent=lease.agent,
        number=lease.number,
        reason=lease.reason,
        input=lease.input,
        approvals=tuple(lease.approvals or ()),
        resume_from=dict(lease.resume_from) if lease.resume_from else None,
        resume_request=dict(lease.resume_request) if lease.resume_request else None,
        pause_before=tuple(lease.pause_before or ()),
        run_cost=Decimal(lease.run_cost),
        answers=answers_for(lease) if lease.resume_from else {},
        agent_version=lease.agent_version,
    )


class RunStoreBackend(BackendBase):
    """One attempt's store in this process: the run store's services and the ledger's."""

    refused_type = "HoldpointError"

    def __init__(self, control: AttemptControl, agent: Agent | None = None) -> None:
        self.control = control
        self.agent = agent
        self.store_lease = control.lease
        self.lease = attempt_lease(control.lease)

    def _write(self, service: Callable[..., T], **kwargs: Any) -> T:
        """Call a fenced run service with this attempt's epochs (the one path of writes)."""
        self.control.check()
        lease = self.store_lease
        try:
            return service(
                attempt_id=lease.attempt_id,
                lease_epoch=lease.lease_epoch,
                cancel_epoch=lease.cancel_epoch,
                **kwargs,
            )
        except HoldpointError as exc:
            if exc.code == "stale_worker":
                self.control.mark_stale(f"{service.__name__} refused ({exc.code}): {exc.detail}")
                raise LeaseLost(exc.detail) from exc
            if exc.code == "stale_after_cancel":
                self.control.request_cancel(f"{service.__name__} refused ({exc.code})")
                raise CancelRequested() from exc
            raise Refused(exc.code, exc.detail) from exc

    # Writes ----------------------------------------------------------------------------

    def checkpoint(self, *, step: str, state: Any) -> tuple[str, bool]:
        saved = self._write(
            services.checkpoint_save, step=step, state=state, cost=self.control.cost_arg()
        )
        return saved.id, bool(saved.pause_requested)

    def interrupt(self, hold: HoldPoint) -> str:
        checkpoint_id, kind, prompt = hold.checkpoint_id, hold.kind, hold.prompt
        accepted_schema, expires_in, context = hold.accepted_schema, hold.expires_in, hold.context
        reason, step_id, action = hold.reason, hold.step_id, hold.action
        request = self._write(
            services.attempt_interrupt,
            checkpoint_id=checkpoint_id,
            kind=kind,
            prompt=prompt,
            accepted_schema=accepted_schema,
            expires_in=expires_in,
            context=context or {},
            reason=reason,
            step_id=step_id,
            action=action,
            cost=self.control.cost_arg(),
        )
        return str(request.id)

    def complete(self, *, result: Any) -> None:
        self._write(services.attempt_complete, result=result, cost=self.control.cost_arg())

    def fail(self, *, error: dict[str, Any]) -> None:
        self._write(services.attempt_fail, error=error, cost=self.control.cost_arg())

    def release(self, reason: str) -> bool:
        try:
            services.attempt_release(
                attempt_id=self.store_lease.attempt_id,
                lease_epoch=self.store_lease.lease_epoch,
                reason=reason,
            )
        except HoldpointError as exc:
            # stale_worker: someone else owns the run already; nothing more to write.
            logger.info("attempt %s: release refused: %s", self.lease.attempt_id, exc.code)
            return False
        return True

    def log(self, *, step: str, message: str, level: str, data: dict[str, Any] | None) -> None:
        self._write(services.attempt_log, message=message, level=level, step=step, data=data)

    # The ledger ------------------------------------------------------------------------

    def tool(self, name: str) -> Tool:
        from ledger.tools import get_tool

        try:
            return get_tool(name)
        except HoldpointError as exc:
            raise Refused(exc.code, exc.detail) from exc

    def tool_reversibility(self, name: str) -> str:
        from ledger.tools import get_tool

        try:
            return str(get_tool(name).reversibility)
        except HoldpointError:
            return ""

    def asks_before(self, tool: str) -> bool:
        # The agent's ``ask_before``; the ledger asks itself for an irreversible call
        # (``side_effect_begin``), in this process.
        return self.agent is not None and self.agent.asks_before(tool)

    def editable(self, tool: str, request: Any) -> dict[str, Any] | None:
        """What an approver of an irreversible call may edit: the request (secrets
        redacted), when the tool offers a form for it (``edit_schema``) and the plan fits."""
        from ledger.outbound import redact_request
        from ledger.tools import get_tool
        from runs.schemas import validation_errors

        schema = getattr(get_tool(tool), "edit_schema", None)
        shown = redact_request(request)
        if not isinstance(schema, dict) or validation_errors(schema, shown):
            return None
        return {"schema": schema, "value": shown}

    def begin_side_effect(self, intent: Intent) -> Begin:
        step_id, tool, target, request = intent.step_id, intent.tool, intent.target, intent.request
        reversibility, answer = intent.reversibility, intent.answer
        compensating_action = intent.compensating_action
        from ledger import services as ledger

        edited_key: dict[str, str] = {}
        if (
            answer is not None
            and isinstance(answer.value, dict)
            and answer.value.get("decision") == "approve"
            and "edited" in answer.value
        ):
            # Approved with edits: the edited request is what runs, under its own key.
            request = with_secrets(answer.value["edited"], request)
            edited_key["idempotency_key"] = ledger.edited_idempotency_key(
                run_id=self.lease.run_id, step_id=step_id, tool=tool, request=request
            )
        try:
            begin = self._write(
                ledger.side_effect_begin,
                step_id=step_id,
                tool=tool,
                target=target,
                request=request,
                reversibility=reversibility,
                compensating_action=compensating_action,
                **edited_key,
            )
        except Refused as exc:
            if exc.code == "side_effect_unknown":
                cause = exc.__cause__
                extra = cause.extra if isinstance(cause, HoldpointError) else {}
                raise SideEffectUnknown(
                    exc.detail, operation_id=str(extra.get("operation_id", ""))
                ) from exc
            if exc.code == "approval_required":
                raise ApprovalRequired(exc.detail) from exc
            raise
        return Begin(
            decision=begin.decision,
            operation_id=begin.operation_id,
            idempotency_key=begin.idempotency_key,
            external_reference=begin.external_reference,
            result=begin.result,
            request=request,
        )

    def record_outcome(self, operation_id: str, report: Report) -> Effect:
        from ledger import services as ledger

        effect = ledger.side_effect_record_outcome(
            operation_id=operation_id,
            lease_epoch=self.store_lease.lease_epoch,
            cancel_epoch=self.store_lease.cancel_epoch,
            status=report.status,
            external_reference=report.external_reference,
            result=report.result,
            error=report.error,
        )
        return Effect(
            operation_id=effect.operation_id,
            status=str(effect.status),
            external_reference=effect.external_reference,
            result=effect.result,
            error=effect.error,
        )
