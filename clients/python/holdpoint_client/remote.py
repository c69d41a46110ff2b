"""The HTTP worker protocol under the one runtime (docs/protocol.md): what
``holdpoint-worker`` (``worker.py``) runs each claimed attempt on.

The fence is the server's: a write with an old ``lease_epoch`` is refused
``stale_worker`` (another worker owns the run: write nothing more), one with an old
``cancel_epoch`` ``stale_after_cancel`` (acknowledge the cancel). On top of that the
client never acts on a lease it cannot vouch for: when the renewals stop (the server was
away) and the lease has run out by the client's reckoning, it is taken as lost before any
tool acts.

That reckoning never compares the clocks of two machines, and never dates a renewal by
when its request was sent: a watch is held by the server for a third of the lease, and on
a loaded machine its answer may take seconds more. The server answers how many seconds
the lease has left (``lease_seconds_left``, on its clock); the client counts them from
when the answer arrived, on its monotonic clock, less a margin for the answer's time on
the wire.
"""

from __future__ import annotations

import logging
import threading
import time
from decimal import Decimal
from typing import Any

from holdpoint_client.agent import Agent
from holdpoint_client.backend import (
    Answer,
    ApprovalRequired,
    AttemptLease,
    BackendBase,
    Begin,
    Effect,
    HoldPoint,
    Intent,
    Refused,
    Report,
    redact_request,
    with_secrets,
)
from holdpoint_client.control import (
    AttemptControl,
    CancelRequested,
    LeaseLost,
    SideEffectUnknown,
)
from holdpoint_client.executor import Outcome, run_attempt
from holdpoint_client.http import Api, Problem, ServerAway
from holdpoint_client.tools import Tool

logger = logging.getLogger("holdpoint_client")

# The share of the lease the client trusts: a renewal is trusted until the seconds the
# server said were left, less (1 - LEASE_TRUST) of the lease, after its answer arrived.
# The margin covers the answer's time on the wire and a clock that runs a little fast.
LEASE_TRUST = 0.8


class RemoteControl(AttemptControl):
    """An attempt's control over HTTP: the signals, plus the lease this side can vouch for."""

    def __init__(self, api: Api, lease: dict[str, Any], shutdown: threading.Event) -> None:
        super().__init__(str(lease["attempt_id"]), shutdown)
        self.api = api
        self.lease = lease
        self.lease_seconds = float(lease["lease_seconds"])
        # Until when (this process's monotonic clock) the lease is trusted: the claim's
        # answer, with a whole lease, arrived just now.
        self.trusted_until = time.monotonic() + self.lease_seconds * LEASE_TRUST

    def renewed(self, *, sent_at: float, received_at: float, seconds_left: Any = None) -> None:
        """A renewal succeeded: its request left at ``sent_at`` and its answer, saying the
        lease has ``seconds_left`` on the server's clock, arrived at ``received_at`` (both
        ``time.monotonic()``). A server that does not say (before ``lease_seconds_left``)
        renewed no earlier than the request was sent: the lease is dated from then."""
        try:
            left = float(seconds_left)
        except (TypeError, ValueError):
            until = sent_at + self.lease_seconds * LEASE_TRUST
        else:
            until = received_at + left - self.lease_seconds * (1 - LEASE_TRUST)
        with self._lock:
            self.trusted_until = max(self.trusted_until, until)

    def lease_trusted(self) -> bool:
        with self._lock:
            return time.monotonic() < self.trusted_until

    def vouch(self) -> None:
        if not self.lease_trusted():
            self.mark_stale("no renewal of the lease succeeded for its length")

    # Writes --------------------------------------------------------------------------

    def epochs(self) -> dict[str, Any]:
        return {
            "lease_epoch": self.lease["lease_epoch"],
            "cancel_epoch": self.lease["cancel_epoch"],
        }

    def write(self, action: str, body: dict[str, Any], *, with_cost: bool = True) -> Any:
        """POST a fenced write about this attempt; map the fence's refusals to unwinding."""
        self.check()
        payload = {**self.epochs(), **body}
        cost = self.cost_arg()
        if with_cost and cost is not None:
            payload["cost"] = cost
        try:
            _, data = self.api.call(
                "POST",
                f"/api/worker/attempts/{self.attempt_id}/{action}",
                payload,
                retry_for=self.lease_seconds * LEASE_TRUST,
            )
        except Problem as exc:
            if exc.code in ("stale_worker", "not_your_lease"):
                self.mark_stale(f"{action} refused ({exc.code}): {exc.detail}")
                raise LeaseLost(exc.detail) from exc
            if exc.code == "stale_after_cancel":
                self.request_cancel(f"{action} refused ({exc.code})")
                raise CancelRequested() from exc
            raise
        except ServerAway as exc:
            self.mark_stale(f"{action}: the server did not answer: {exc}")
            raise LeaseLost(str(exc)) from exc
        return data

    def outcome(self, operation_id: str, body: dict[str, Any]) -> Any:
        """Record what a tool did. Never fenced (an outcome is a fact), so it is sent even
        after the lease was lost, and retried until the server takes it."""
        _, data = self.api.call(
            "POST",
            f"/api/worker/side-effects/{operation_id}/outcome",
            {**body, **self.epochs()},
            retry_for=300.0,
            persist=True,
        )
        return data

    def release(self, reason: str) -> dict[str, Any] | None:
        try:
            _, data = self.api.call(
                "POST",
                f"/api/worker/attempts/{self.attempt_id}/release",
                {"lease_epoch": self.lease["lease_epoch"], "reason": reason},
                retry_for=10.0,
                persist=True,
            )
            return data if isinstance(data, dict) else {}
        except (Problem, ServerAway) as exc:
            logger.info("attempt %s: release refused: %s", self.attempt_id, exc)
            return None


# The longest a watch waits for a cancel or pause (under the HTTP client's timeout).
WATCH_MAX = 25.0


class Heartbeater:
    """Renews the lease every ``heartbeat_seconds`` and hears cancel and pause at once.

    Each renewal is a *watch* (``POST …/watch``): the server renews the lease, then holds
    the request until the run is cancelled or paused (its NOTIFY) or the interval is
    over; so the next renewal follows the answer, and a cancel arrives without waiting
    for the next heartbeat. Once a cancel or pause is known, plain renewals follow.
    """

    def __init__(self, control: RemoteControl) -> None:
        self.control = control
        self.every = float(control.lease.get("heartbeat_seconds") or control.lease_seconds / 3)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"hp-heartbeat-{control.attempt_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        # A watch in flight is answered when the attempt ends (the server wakes it).
        self._thread.join(0.2)

    def _run(self) -> None:
        control = self.control
        while not self._stop.is_set():
            known = control.cancel.is_set() or control.pause.is_set()
            if known and self._stop.wait(self.every):
                return
            wait = 0.0 if known else min(self.every, WATCH_MAX)
            sent_at = time.monotonic()
            try:
                _, data = control.api.call(
                    "POST",
                    f"/api/worker/attempts/{control.attempt_id}/watch",
                    {
                        "lease_epoch": control.lease["lease_epoch"],
                        "lease_seconds": control.lease_seconds,
                        "cost": control.cost_arg(),
                        "wait": wait,
                    },
                    timeout=wait + 15.0,
                    retry_for=self.every,
                    persist=True,
                )
                received_at = time.monotonic()
            except Problem as exc:
                if control.finishing.is_set() or self._stop.is_set():
                    return
                if exc.code in ("stale_worker", "not_your_lease", "not_found"):
                    control.mark_stale(f"heartbeat refused ({exc.code})")
                    return
                logger.warning("attempt %s: heartbeat refused: %s", control.attempt_id, exc)
                self._stop.wait(self.every)
                continue
            except ServerAway as exc:
                if self._stop.is_set() or control.stale.is_set():
                    return  # The attempt is over, or was let go (the worker stopped).
                logger.warning("attempt %s: heartbeat: %s", control.attempt_id, exc)
                if not control.lease_trusted():
                    control.mark_stale("the server was away for the lease's length")
                    return
                continue
            control.renewed(
                sent_at=sent_at,
                received_at=received_at,
                seconds_left=data.get("lease_seconds_left") if isinstance(data, dict) else None,
            )
            if data.get("cancel_requested"):
                control.request_cancel("heartbeat")
            if data.get("pause_requested"):
                control.request_pause("heartbeat")


# Lost for good: the attempt is another worker's, or gone.
LOST_CODES = ("stale_worker", "not_your_lease", "not_found")


class HeartbeatPool:
    """One renewal for all the attempts a worker process runs (``--concurrency N``): a
    single thread sends ``POST /api/worker/heartbeat`` with every attempt it holds, each
    with its ``lease_epoch``, instead of a watch per attempt. The server fences each
    attempt on its own and answers each in its place (renewed, or refused: that attempt
    is let go, the others go on).

    Like the watch, the call waits (``wait``) until an attempt that was quiet is cancelled
    or paused, or the interval is over; an attempt whose cancel or pause is already known
    is still renewed but does not cut the wait short. An attempt that starts while a call
    is held joins the next one (its claim gave it a whole lease; the next renewal comes
    within an interval). A server without the route (404, 405: written before it) gets a
    watch per attempt, as before."""

    def __init__(self, api: Api, shutdown: threading.Event) -> None:
        self.api = api
        self.shutdown = shutdown
        self._controls: dict[str, RemoteControl] = {}
        self._legacy: dict[str, Heartbeater] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, control: RemoteControl) -> None:
        with self._lock:
            if self._legacy is not None:
                beater = Heartbeater(control)
                self._legacy[control.attempt_id] = beater
                beater.start()
                return
            self._controls[control.attempt_id] = control
            first = self._thread is None
            if first:
                self._thread = threading.Thread(target=self._run, name="hp-heartbeat", daemon=True)
                self._thread.start()
        self._changed.set()
        if not first:
            # The loop's call may be held for a while yet: renew the newcomer at once, on
            # its own, so that its lease is vouched for as soon as a watch of its own would.
            threading.Thread(
                target=self._renew_now, args=(control,), name="hp-heartbeat-join", daemon=True
            ).start()

    def _renew_now(self, control: RemoteControl) -> None:
        sent_at = time.monotonic()
        try:
            _, data = self.api.call(
                "POST",
                "/api/worker/heartbeat",
                self._body([control], wait=0.0),
                retry_for=float(control.lease.get("heartbeat_seconds") or 1.0),
                persist=True,
            )
        except (Problem, ServerAway) as exc:
            logger.info("attempt %s: first renewal: %s", control.attempt_id, exc)
            return  # the loop renews it with the others
        self._answered([control], data, sent_at=sent_at, received_at=time.monotonic())

    @staticmethod
    def _body(controls: list[RemoteControl], *, wait: float) -> dict[str, Any]:
        return {
            "attempts": [
                {
                    "attempt_id": c.attempt_id,
                    "lease_epoch": c.lease["lease_epoch"],
                    **({"cost": c.cost_arg()} if c.cost_arg() is not None else {}),
                }
                for c in controls
            ],
            # One lease length for the batch: the shortest asked, so none is renewed for
            # longer than its attempt asked (all are renewed every interval).
            "lease_seconds": min(c.lease_seconds for c in controls),
            "wait": wait,
        }

    def remove(self, control: RemoteControl) -> None:
        with self._lock:
            self._controls.pop(control.attempt_id, None)
            beater = (self._legacy or {}).pop(control.attempt_id, None)
        if beater is not None:
            beater.stop()

    def stop(self) -> None:
        self._stop.set()
        self._changed.set()
        with self._lock:
            beaters = list((self._legacy or {}).values())
        for beater in beaters:
            beater.stop()
        if self._thread is not None:
            self._thread.join(0.2)

    def _held(self) -> list[RemoteControl]:
        with self._lock:
            return list(self._controls.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            controls = self._held()
            if not controls:
                self._changed.wait(0.5)
                self._changed.clear()
                continue
            every = min(
                float(c.lease.get("heartbeat_seconds") or c.lease_seconds / 3) for c in controls
            )
            quiet = [c for c in controls if not (c.cancel.is_set() or c.pause.is_set())]
            if not quiet and self._stop.wait(every):
                return
            # Held for half an interval (a watch of one attempt is held a whole one): an
            # attempt that ends, or one that starts, waits at most that for the next call,
            # so each lease is vouched for as soon as its own watch would vouch for it.
            wait = min(every / 2, WATCH_MAX) if quiet else 0.0
            sent_at = time.monotonic()
            try:
                _, data = self.api.call(
                    "POST",
                    "/api/worker/heartbeat",
                    self._body(controls, wait=wait),
                    timeout=wait + 15.0,
                    retry_for=every,
                    persist=True,
                )
            except Problem as exc:
                if exc.status in (404, 405):
                    self._fall_back()
                    return
                logger.warning("heartbeat refused: %s", exc)
                self._stop.wait(every)
                continue
            except ServerAway as exc:
                if self._stop.is_set():
                    return
                logger.warning("heartbeat: %s", exc)
                for control in controls:
                    if not control.lease_trusted():
                        control.mark_stale("the server was away for the lease's length")
                        self.remove(control)
                continue
            self._answered(controls, data, sent_at=sent_at, received_at=time.monotonic())

    def _answered(
        self, controls: list[RemoteControl], data: Any, *, sent_at: float, received_at: float
    ) -> None:
        by_id = {c.attempt_id: c for c in controls}
        answers = data.get("attempts") if isinstance(data, dict) else None
        for answer in answers or []:
            control = by_id.get(str(answer.get("attempt_id")))
            with self._lock:
                held = control is not None and control.attempt_id in self._controls
            if control is None or not held:
                continue  # its attempt ended while the call was out
            if not answer.get("ok"):
                problem = answer.get("problem") or {}
                code = str(problem.get("code") or "")
                if control.finishing.is_set():
                    continue
                if code in LOST_CODES:
                    control.mark_stale(f"heartbeat refused ({code})")
                    self.remove(control)
                else:
                    logger.warning("attempt %s: heartbeat refused: %s", control.attempt_id, code)
                continue
            control.renewed(
                sent_at=sent_at,
                received_at=received_at,
                seconds_left=answer.get("lease_seconds_left"),
            )
            if answer.get("cancel_requested"):
                control.request_cancel("heartbeat")
            if answer.get("pause_requested"):
                control.request_pause("heartbeat")

    def _fall_back(self) -> None:
        logger.info("the server has no batch heartbeat: a watch per attempt")
        with self._lock:
            self._legacy = {}
            controls, self._controls = list(self._controls.values()), {}
        for control in controls:
            self.add(control)


def lease_of(lease: dict[str, Any]) -> AttemptLease:
    """The worker protocol's lease (``POST /api/worker/claim``) as the runtime reads it."""
    answers = {
        str(a["step_id"]): Answer(
            request_id=str(a.get("request_id", "")),
            kind=str(a.get("kind", "")),
            step_id=str(a["step_id"]),
            value=a.get("answer"),
            answered_by=a.get("answered_by"),
            context=dict(a.get("context") or {}),
            action=dict(a.get("action") or {}),
        )
        for a in lease.get("answers") or []
    }
    version = lease.get("agent_version")
    return AttemptLease(
        run_id=str(lease["run_id"]),
        attempt_id=str(lease["attempt_id"]),
        agent=str(lease.get("agent", "")),
        number=int(lease["number"]),
        reason=str(lease.get("reason", "")),
        input=lease.get("input"),
        approvals=tuple(lease.get("approvals") or ()),
        resume_from=lease.get("resume_from") or None,
        resume_request=lease.get("resume_request") or None,
        pause_before=tuple(lease.get("pause_before") or ()),
        run_cost=Decimal(str(lease.get("run_cost") or "0")),
        answers=answers,
        agent_version=int(version) if version is not None else None,
    )


def _refused(exc: Problem) -> Refused:
    return Refused(exc.code, exc.detail)


class HttpBackend(BackendBase):
    """One attempt's store over the worker protocol. The agent's tools run here; the
    server's ledger decides whether they act."""

    refused_type = "Refused"

    def __init__(self, agent: Agent, control: RemoteControl) -> None:
        self.agent = agent
        self.control = control
        self.remote = control
        self.lease = lease_of(control.lease)

    def _write(self, action: str, body: dict[str, Any], *, with_cost: bool = True) -> Any:
        try:
            return self.remote.write(action, body, with_cost=with_cost)
        except Problem as exc:
            raise _refused(exc) from exc

    def checkpoint(self, *, step: str, state: Any) -> tuple[str, bool]:
        saved = self._write("checkpoint", {"step": step, "state": state})
        return str(saved["checkpoint_id"]), bool(saved.get("pause_requested"))

    def interrupt(self, hold: HoldPoint) -> str:
        checkpoint_id, kind, prompt = hold.checkpoint_id, hold.kind, hold.prompt
        accepted_schema, expires_in, context = hold.accepted_schema, hold.expires_in, hold.context
        reason, step_id, action = hold.reason, hold.step_id, hold.action
        body: dict[str, Any] = {
            "checkpoint_id": checkpoint_id,
            "kind": kind,
            "prompt": prompt,
            "accepted_schema": accepted_schema,
            "context": context or {},
            "reason": reason,
            "step_id": step_id,
        }
        if expires_in is not None:
            body["expires_in"] = expires_in
        if action is not None:
            body["action"] = action
        try:
            request = self.remote.write("interrupt", body)
        except Problem as exc:
            pointers = [
                str(e.get("pointer", ""))
                for e in exc.body.get("errors") or []
                if isinstance(e, dict)
            ]
            if not (
                action is not None
                and "editable" in action
                and exc.code == "invalid_input"
                and pointers
                and all(p.startswith("/action/editable") for p in pointers)
            ):
                raise _refused(exc) from exc
            # The plan does not fit the tool's edit form: ask without the form.
            body["action"] = {k: v for k, v in action.items() if k != "editable"}
            request = self._write("interrupt", body)
        return str(request["request_id"])

    def complete(self, *, result: Any) -> None:
        self._write("complete", {"result": result})

    def fail(self, *, error: dict[str, Any]) -> None:
        self._write("fail", {"error": error})

    def release(self, reason: str) -> bool:
        return self.remote.release(reason) is not None

    def log(self, *, step: str, message: str, level: str, data: dict[str, Any] | None) -> None:
        body: dict[str, Any] = {"message": message, "level": level, "step": step}
        if data:
            body["data"] = data
        self._write("log", body, with_cost=False)

    # The ledger ------------------------------------------------------------------------

    def tool(self, name: str) -> Tool:
        found = self.agent.tools.get(name)
        if found is None:
            raise Refused(
                "unknown_tool",
                f"This agent has no tool named {name!r} (its tools: {', '.join(self.agent.tools)}).",
            )
        return found

    def tool_reversibility(self, name: str) -> str:
        found = self.agent.tools.get(name)
        return found.reversibility if found is not None else ""

    def asks_before(self, tool: str) -> bool:
        return bool(self.agent.asks_before(tool))

    def editable(self, tool: str, request: Any) -> dict[str, Any] | None:
        # A tool with ``edit_schema`` (a JSON Schema of its request) lets the approver edit
        # the call before approving it (the server checks the plan fits; ``interrupt``
        # asks without the form when it does not); secret header values are shown redacted.
        schema = getattr(self.agent.tools.get(tool), "edit_schema", None)
        if not isinstance(schema, dict):
            return None
        return {"schema": schema, "value": redact_request(request)}

    def begin_side_effect(self, intent: Intent) -> Begin:
        step_id, tool, target, request = intent.step_id, intent.tool, intent.target, intent.request
        reversibility = intent.reversibility
        compensating_action = intent.compensating_action
        body: dict[str, Any] = {
            "step_id": step_id,
            "tool": tool,
            "target": target,
            "request": request,
        }
        if reversibility is not None:
            body["reversibility"] = reversibility
        if compensating_action is not None:
            body["compensating_action"] = compensating_action
        try:
            try:
                begin = self.remote.write("side-effects", body, with_cost=False)
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
                begin = self.remote.write("side-effects", body, with_cost=False)
        except Problem as exc:
            if exc.code == "side_effect_unknown":
                raise SideEffectUnknown(
                    exc.detail, operation_id=str(exc.body.get("operation_id", ""))
                ) from exc
            if exc.code == "approval_required" and "idempotency_key" not in body:
                raise ApprovalRequired(
                    exc.detail,
                    decided=bool(exc.body.get("request_id")),
                    denied_by=exc.body.get("denied_by"),
                ) from exc
            raise _refused(exc) from exc
        return Begin(
            decision=str(begin["decision"]),
            operation_id=str(begin["operation_id"]),
            idempotency_key=str(begin.get("idempotency_key") or ""),
            external_reference=str(begin.get("external_reference") or ""),
            result=begin.get("result"),
            request=request,
        )

    def record_outcome(self, operation_id: str, report: Report) -> Effect:
        body: dict[str, Any] = {"status": report.status}
        if report.external_reference is not None:
            body["external_reference"] = report.external_reference
        if report.result is not None:
            body["result"] = report.result
        if report.error is not None:
            body["error"] = report.error
        effect = self.remote.outcome(operation_id, body)
        return Effect(
            operation_id=str(effect.get("operation_id") or operation_id),
            status=str(effect.get("status")),
            external_reference=str(effect.get("external_reference") or ""),
            result=effect.get("result"),
            error=effect.get("error"),
        )


def execute(
    api: Api,
    agent: Agent,
    lease: dict[str, Any],
    *,
    shutdown: threading.Event,
    control: RemoteControl | None = None,
    heartbeats: HeartbeatPool | None = None,
) -> Outcome:
    """Run the claimed attempt ``lease`` of ``agent`` over HTTP, renewing its lease: with
    ``heartbeats``, in its worker process's one batch; else with a watch of its own."""
    control = control or RemoteControl(api, lease, shutdown)
    beater = Heartbeater(control) if heartbeats is None else None
    if beater is not None:
        beater.start()
    else:
        assert heartbeats is not None
        heartbeats.add(control)
    try:
        outcome = run_attempt(agent, HttpBackend(agent, control), gone=(Problem, ServerAway))
    finally:
        if beater is not None:
            beater.stop()
        else:
            assert heartbeats is not None
            heartbeats.remove(control)
    logger.info(
        "attempt %s (run %s, %s #%s): %s",
        lease["attempt_id"],
        lease["run_id"],
        lease["agent"],
        lease["number"],
        outcome,
    )
    return outcome
