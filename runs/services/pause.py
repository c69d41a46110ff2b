"""Pause: the third kind of interrupt, for one run and for a whole agent (the kill switch).

A pause waits for the step boundary and is not a fence: the step that is running
finishes and commits normally, the checkpoint for the next step is saved, then the
worker releases with reason ``paused`` (``attempt_release``). Cancel always wins over a
pause. A paused run holds an ``InputRequest`` of kind ``pause``; continuing it is
``run_resume`` with that request and its checkpoint (docs/agents.md (pause) and docs/architecture.md (the run model)).

The agent gate (``AgentGate``) stops every run of an agent at its next boundary and
keeps the agent's runs from being claimed until it reopens; held runs wait ``queued``.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils.translation import gettext

from runs.agents import agent_spec
from runs.db import db_now
from runs.errors import HoldpointError
from runs.events import (
    EventType,
    append_event,
    how,
    note_agent_gate_changed,
    notify_pause,
    notify_work,
)
from runs.leases import worker_holds
from runs.models import AgentGate, Attempt, Run
from runs.services._base import (
    UserLike,
    actor_for,
    lock_run,
    measured,
    pause_locked,
    user_or_none,
)
from runs.states import HOLDING, PAUSABLE, AttemptReason, AttemptStatus, RunStatus, next_status

MAX_REASON = 2000
MAX_PAUSE_EXPIRES = 90 * 86400


def _reason(reason: Any) -> str:
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
        raise HoldpointError(
            "invalid_input",
            "A pause needs a reason (1 to 2,000 characters).",
            errors=[{"pointer": "/reason", "message": "1 to 2,000 characters"}],
        )
    return reason.strip()


def _paused_detail(run: Run) -> dict[str, Any]:
    request = run.pending_request
    context = (request.context or {}) if request is not None else {}
    return {
        "run_status": run.status,
        "paused_by": context.get("paused_by") or run.pause_actor or None,
        "since": context.get("paused_at")
        or (run.pause_requested_at.isoformat() if run.pause_requested_at else None),
        "pause_reason": (request.prompt if request is not None else run.pause_reason) or None,
        "pending_request_id": run.pending_request_id,
    }


@measured("pause")
@transaction.atomic(durable=True)
def run_pause(
    *,
    run_id: str,
    reason: str,
    user: UserLike = None,
    actor: str | None = None,
    expires_in: float | None = None,
    via: str = "",
    identity: str = "",
) -> Run:
    """Ask the run to stop for a while. A durable command, like cancel.

    ``queued`` or ``waiting``: paused at once. ``running`` with a live lease:
    ``pause_requested``, and the worker is told at once (NOTIFY, the in-process signal,
    then every heartbeat and checkpoint answer); it stops at its next step boundary.
    A run waiting for a person, cancelling or finished is refused ``invalid_state``.
    ``via`` and ``identity``: how it was asked (``runs/audit.py``), on ``run.pause_requested``.
    """
    door = how(via=via, identity=identity)
    reason = _reason(reason)
    if expires_in is not None and (
        isinstance(expires_in, bool)
        or not isinstance(expires_in, int | float)
        or not 1 <= expires_in <= MAX_PAUSE_EXPIRES
    ):
        raise HoldpointError("invalid_input", "expires_in must be 1 second to 90 days.")
    # The run lock orders this pause against the worker's writes, a cancel and the sweep.
    run = lock_run(run_id)
    if run.status in (RunStatus.PAUSED, RunStatus.PAUSE_REQUESTED):
        detail = _paused_detail(run)
        raise HoldpointError(
            "invalid_state",
            gettext("Already paused by %(who)s since %(since)s: nothing changed.")
            % {"who": detail["paused_by"] or "someone", "since": detail["since"] or "earlier"},
            already_paused=True,
            **detail,
        )
    if run.status in HOLDING:
        raise HoldpointError(
            "invalid_state",
            gettext("The run is already waiting for a person: answer or cancel it."),
            run_status=run.status,
        )
    if run.status == RunStatus.CANCEL_REQUESTED:
        raise HoldpointError(
            "invalid_state",
            gettext("The run is being cancelled; a cancel always wins over a pause."),
            run_status=run.status,
        )
    if run.status not in PAUSABLE:
        raise HoldpointError(
            "invalid_state",
            gettext("The run already %(status)s; there is nothing to pause.")
            % {"status": run.status},
            run_status=run.status,
        )
    actor = actor or actor_for(user)
    now = db_now()
    attempt = Attempt.objects.get(pk=run.current_attempt_id) if run.current_attempt_id else None
    lease_live = worker_holds(run, attempt, now)
    append_event(
        run,
        EventType.RUN_PAUSE_REQUESTED,
        actor,
        {"reason": reason, "lease_live": lease_live, "from_status": run.status, **door},
    )
    if lease_live:
        assert attempt is not None
        run.status = next_status(run.status, "pause_live")
        run.pause_reason = reason
        run.pause_actor = actor
        run.pause_requested_at = now
        run.pause_expires_in = expires_in
        notify_pause(attempt.id)
        run.save()
        return run
    assert attempt is not None, "a live run always has a current attempt"
    # No worker holds the run: its queued attempt (or the one whose lease ran out) ends.
    attempt.status = (
        AttemptStatus.ABORTED if attempt.status == AttemptStatus.QUEUED else AttemptStatus.LOST
    )
    attempt.ended_at = now
    attempt.lease_expires_at = None
    attempt.error_message = "paused before it ran" if attempt.started_at is None else ""
    attempt.save()
    pause_locked(
        run,
        attempt=attempt,
        transition="pause",
        now=now,
        actor=actor,
        reason=reason,
        paused_by=actor,
        expires_in=expires_in,
    )
    run.save()
    return run


def _agent_name(agent: str) -> str:
    if not isinstance(agent, str) or not agent or len(agent) > 100:
        raise HoldpointError("not_found", "There is no such agent.")
    try:
        return agent_spec(agent).name
    except HoldpointError:
        raise HoldpointError(
            "not_found", f"There is no agent named {agent!r}.", agent=agent
        ) from None


def _ensure_gate_row(agent: str) -> None:
    # The row must exist before the gate closes: claims take it FOR SHARE, and a row that
    # a concurrent transaction inserts is not there for them to wait on. Committed alone.
    with transaction.atomic(durable=True):
        AgentGate.objects.bulk_create([AgentGate(agent=agent)], ignore_conflicts=True)


@measured("agent_pause")
def agent_pause(
    *,
    agent: str,
    reason: str,
    user: UserLike = None,
    actor: str | None = None,
    via: str = "",
    identity: str = "",
) -> AgentGate:
    """Close the agent's gate: nothing of it is claimed; every running attempt is told at
    once and stops at its next step boundary (its run waits ``queued``, held). ``via``
    and ``identity``: how (``runs/audit.py``), on each run's ``agent.paused``."""
    door = how(via=via, identity=identity)
    name = _agent_name(agent)
    reason = _reason(reason)
    actor = actor or actor_for(user)
    _ensure_gate_row(name)
    gate = _agent_pause(name, reason, user=user, actor=actor)
    _tell_runs(name, EventType.AGENT_PAUSED, actor, {"agent": name, "reason": reason, **door})
    return gate


@transaction.atomic(durable=True)
def _agent_pause(name: str, reason: str, *, user: UserLike, actor: str) -> AgentGate:
    # FOR UPDATE waits for claims that hold the row FOR SHARE: once we have it, every claim
    # that passed the gate has committed, and its attempt is among the running ones told
    # below; every later claim sees the gate closed.
    gate = AgentGate.objects.select_for_update().get(pk=name)
    if gate.paused:
        raise HoldpointError(
            "invalid_state",
            gettext("The agent %(agent)s is already paused by %(who)s since %(since)s.")
            % {
                "agent": name,
                "who": gate.actor or "someone",
                "since": gate.paused_at.isoformat() if gate.paused_at else "earlier",
            },
            already_paused=True,
            paused_by=gate.actor,
            paused_at=gate.paused_at.isoformat() if gate.paused_at else None,
        )
    gate.paused = True
    gate.reason = reason
    gate.actor = actor
    gate.paused_by = user_or_none(user)
    gate.paused_at = db_now()  # read after the lock: later than every claim that got through
    gate.save()
    return gate


@measured("agent_unpause")
def agent_unpause(
    *,
    agent: str,
    reason: str = "",
    user: UserLike = None,
    actor: str | None = None,
    via: str = "",
    identity: str = "",
) -> AgentGate:
    """Reopen the agent's gate: its held and queued runs go on by themselves, soonest first.
    ``via`` and ``identity``: how (``runs/audit.py``), on each run's ``agent.unpaused``."""
    door = how(via=via, identity=identity)
    name = _agent_name(agent)
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise HoldpointError("invalid_input", "reason must be text of at most 2,000 characters.")
    actor = actor or actor_for(user)
    _ensure_gate_row(name)
    gate = _agent_unpause(name, actor=actor)
    _tell_runs(
        name,
        EventType.AGENT_UNPAUSED,
        actor,
        {"agent": name, "reason": reason.strip(), **door},
    )
    return gate


@transaction.atomic(durable=True)
def _agent_unpause(name: str, *, actor: str) -> AgentGate:
    gate = AgentGate.objects.select_for_update().get(pk=name)
    if not gate.paused:
        raise HoldpointError(
            "invalid_state",
            gettext("The agent %(agent)s is not paused.") % {"agent": name},
            already_open=True,
        )
    gate.paused = False
    gate.unpaused_at = db_now()
    gate.unpaused_by = actor
    gate.save()
    notify_work(name)  # delivered at commit: idle workers claim the held runs at once
    return gate


def _tell_runs(agent: str, type: str, actor: str, payload: dict[str, Any]) -> None:
    """After the gate changed: write ``type`` on the timeline of each run it concerns (the
    running ones on pause, the held ones on unpause), so their pages are pushed and the
    in-process workers hear it, and tell each running attempt's worker over NOTIFY.

    In a transaction of its own, after the gate's commit: a claim holds its run and then
    waits for the gate row, so locking runs while holding the gate could deadlock. The
    runs are locked in id order (one lock order). A worker that misses this (a crash
    in between) hears it from its next heartbeat or checkpoint answer.
    """
    if type == EventType.AGENT_PAUSED:
        runs = Run.objects.filter(agent=agent, status=RunStatus.RUNNING)
    else:
        runs = Run.objects.filter(
            agent=agent,
            status=RunStatus.QUEUED,
            current_attempt__reason=AttemptReason.HELD,
        )
    with transaction.atomic(durable=True):
        # Queued runs of the agent append nothing, but their reason to wait changed.
        note_agent_gate_changed(agent)
        for run in runs.select_for_update(of=("self",)).order_by("id"):
            append_event(run, type, actor, payload)
            run.save(update_fields=["last_event_seq", "updated_at"])
            if type == EventType.AGENT_PAUSED and run.current_attempt_id:
                notify_pause(str(run.current_attempt_id))
