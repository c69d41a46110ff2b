"""Rules that used to be written in several places, judged at their boundary by every caller.

A lease is live strictly before its expiry instant (``runs/leases.py``); a run is claimable
in the states the transition table lets claim (``runs/states.py`` ``CLAIMABLE``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from ledger.models import SideEffect
from ledger.services import stale_pending_q
from ledger.services._common import attempt_is_live
from runs import services
from runs.db import db_now
from runs.errors import HoldpointError
from runs.leases import lease_ran_out, lease_ran_out_q
from runs.models import Attempt, Run, claimable_q
from runs.states import CLAIMABLE, TRANSITIONS, RunStatus
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db

T = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def test_it_calls_a_lease_over_at_its_exact_expiry_instant() -> None:
    assert lease_ran_out(T, T)
    assert lease_ran_out(T - dt.timedelta(microseconds=1), T)
    assert not lease_ran_out(T + dt.timedelta(microseconds=1), T)
    assert lease_ran_out(None, T)


def _running_attempt_expiring_at(expires_at: dt.datetime) -> tuple[Run, Attempt]:
    run = start()
    lease = claim()
    Attempt.objects.filter(pk=lease.attempt_id).update(lease_expires_at=expires_at)
    run.refresh_from_db()
    return run, Attempt.objects.get(pk=lease.attempt_id)


def test_the_sweep_and_the_ledger_agree_with_the_fence_at_the_instant() -> None:
    run, attempt = _running_attempt_expiring_at(T)
    SideEffect.objects.create(
        run=run,
        attempt=attempt,
        step_id="s",
        tool="webhook",
        idempotency_key="k-boundary",
        target="t",
        request={},
        reversibility="irreversible",
    )
    # The sweep's query, the ledger's "no live worker will settle it" and its "is the
    # attempt live" all say: over, at exactly T.
    assert Attempt.objects.filter(lease_ran_out_q(T), pk=attempt.pk).exists()
    assert SideEffect.objects.filter(stale_pending_q(lease_now=T), run=run).exists()
    assert not attempt_is_live(run, attempt, lease_now=T)
    # One microsecond before T, all of them still call it live.
    before = T - dt.timedelta(microseconds=1)
    assert not Attempt.objects.filter(lease_ran_out_q(before), pk=attempt.pk).exists()
    assert attempt_is_live(run, attempt, lease_now=before)


def test_it_refuses_the_write_and_sweeps_the_attempt_once_the_lease_is_over() -> None:
    # Against the real clock: the database's "now" is past the expiry, so the fence refuses
    # and the sweep takes the attempt back, in the same run of the rule.
    run = start()
    lease = claim()
    Attempt.objects.filter(pk=lease.attempt_id).update(lease_expires_at=db_now())
    with pytest.raises(HoldpointError) as refused:
        services.checkpoint_save(**epochs(lease), step="next", state={})
    assert refused.value.code == "stale_worker"
    assert services.leases_expire() == 1
    assert Attempt.objects.get(pk=lease.attempt_id).status == "lost"
    run.refresh_from_db()
    assert run.status in {RunStatus.QUEUED, RunStatus.FAILED}


def test_claimable_states_are_read_off_the_transition_table() -> None:
    assert {s for (s, op) in TRANSITIONS if op == "claim"} == CLAIMABLE
    queued = start()
    assert Run.objects.filter(claimable_q(), pk=queued.pk).exists()
    assert Run.objects.filter(claimable_q(db_now()), pk=queued.pk).exists()
    lease = claim()
    assert lease.run_id == queued.id
    assert not Run.objects.filter(claimable_q(), pk=queued.pk).exists()


def test_a_question_closed_by_the_sweep_writes_the_same_event_as_any_other_close() -> None:
    import time_machine

    from runs.models import InputRequest, RunEvent
    from tests.runs.factory import interrupted

    run, _lease, _cp, request = interrupted(expires_in=60)
    # The run no longer holds this question (it moved on); the question is still pending.
    Run.objects.filter(pk=run.pk).update(pending_request=None, status=RunStatus.QUEUED)
    with time_machine.travel(request.expires_at + dt.timedelta(seconds=1)):
        services.requests_expire()
    request.refresh_from_db()
    assert request.status == "cancelled"
    closed = RunEvent.objects.filter(run=run, type="request.closed").get()
    assert closed.payload["request_id"] == request.id
    assert closed.payload["reason"] == "Closed: the run moved on"
    assert InputRequest.objects.filter(run=run, status="pending").count() == 0


# --- Issue 26: each rule written once -----------------------------------------------------------


def test_what_a_person_may_do_to_a_run_is_read_off_the_transition_table() -> None:
    """Cancel, pause and retry are offered (``CANCELLABLE``, ``PAUSABLE``, ``RETRYABLE``)
    exactly where the table has the transition: no hand-written list to drift."""
    from runs.states import CANCELLABLE, PAUSABLE, RETRYABLE

    def where(*operations: str) -> set[str]:
        return {status for (status, op) in TRANSITIONS if op in operations}

    assert set(CANCELLABLE) == where("cancel", "cancel_live")
    assert set(PAUSABLE) == where("pause", "pause_live")
    assert set(RETRYABLE) == where("retry")
    assert RunStatus.CANCEL_REQUESTED not in CANCELLABLE  # nothing more to offer
    assert {RunStatus.FAILED, RunStatus.CANCELLED} == RETRYABLE


def _accepted(call: Callable[[], object]) -> bool:
    """Whether ``call`` was accepted; a refusal must be ``invalid_state``."""
    refused: list[str] = []
    try:
        call()
    except HoldpointError as exc:
        refused.append(exc.code)
    assert refused in ([], ["invalid_state"]), refused
    return not refused


@pytest.mark.parametrize("status", list(RunStatus))
def test_the_services_refuse_what_the_table_does_not_offer(status: str) -> None:
    """Every status against the retry and pause services: refused ``invalid_state`` where
    the table has no such transition, accepted where it has (the run page offers the
    buttons from the same sets, ``dashboard/pages/runs.py``)."""
    from runs.states import PAUSABLE, RETRYABLE

    def at(status: str) -> Run:
        run = start()
        # The run as if it had come to ``status`` with its attempt over (retry queues one).
        if status in RETRYABLE:
            Attempt.objects.filter(run=run).update(status="failed")
        Run.objects.filter(pk=run.pk).update(status=status)
        return run

    run = at(status)
    assert _accepted(lambda: services.run_retry(run_id=run.id, reason="again")) == (
        status in RETRYABLE
    )
    run = at(status)
    assert _accepted(lambda: services.run_pause(run_id=run.id, reason="look")) == (
        status in PAUSABLE
    )


def test_cancel_pause_and_the_ledger_agree_whether_a_worker_holds_the_run() -> None:
    """At the lease's expiry instant every judge says the worker is gone: cancel is final
    at once, a pause takes effect at once, the ledger calls the attempt not live. One rule:
    ``runs.leases.worker_holds``."""
    from runs.leases import worker_holds

    run, attempt = _running_attempt_expiring_at(T)
    assert not worker_holds(run, attempt, T)
    assert worker_holds(run, attempt, T - dt.timedelta(microseconds=1))
    assert not attempt_is_live(run, attempt, lease_now=T)
    # A lease already over when cancel or pause takes the lock: final at once.
    run, _attempt = _running_attempt_expiring_at(db_now() - dt.timedelta(seconds=1))
    assert services.run_cancel(run_id=run.id, reason="gone").status == RunStatus.CANCELLED
    run, _attempt = _running_attempt_expiring_at(db_now() - dt.timedelta(seconds=1))
    assert services.run_pause(run_id=run.id, reason="look").status == RunStatus.PAUSED
    # A live lease: the worker must acknowledge.
    run, _attempt = _running_attempt_expiring_at(db_now() + dt.timedelta(minutes=5))
    assert services.run_cancel(run_id=run.id, reason="stop").status == RunStatus.CANCEL_REQUESTED


def test_every_reader_of_an_approval_counts_only_standing_decisions() -> None:
    """A changed decision is superseded for the service, the API's representation, the
    card's who-may-approve and the notifications alike (``runs.approvals.standing_votes``)."""
    from api.serializers import approval_facts
    from runs.approvals import approvals_so_far, eligible_approvers, standing_votes
    from tests.conftest import _user
    from tests.runs.factory import interrupted

    alice, bob = _user("alice", "approver"), _user("bob", "approver")
    from runs.approvals import parse_policy
    from runs.models import AgentApprovalPolicy, InputRequest

    AgentApprovalPolicy.objects.create(
        agent="test-agent", policy=parse_policy({"required": 2, "any_deny_closes": False})
    )
    run, _lease, cp, request = interrupted(kind="auth_required")

    def decide(user: object, value: dict[str, object]) -> None:
        services.run_resume(
            run_id=run.id, request_id=request.id, checkpoint_id=cp.id, value=value, user=user
        )

    decide(alice, {"decision": "approve"})
    decide(alice, {"decision": "deny", "comment": "on second thought"})
    request = InputRequest.objects.get(pk=request.id)
    assert [v.decision for v in standing_votes(request)] == ["deny"]
    assert approvals_so_far(request) == []
    facts = approval_facts(request)
    assert [(a["by"], a["decision"], a["counts"]) for a in facts["approvals"]] == [
        ("alice", "approve", False),
        ("alice", "deny", True),
    ]
    assert facts["approvals_needed"] == 2
    # alice no longer counts as having approved: she may approve again, as may bob.
    assert {u.username for u in eligible_approvers(request)} >= {"alice", "bob"}
    decide(bob, {"decision": "approve"})
    assert InputRequest.objects.get(pk=request.id).status == "pending"


def test_every_path_that_makes_work_due_ends_with_an_event_workers_wake_on() -> None:
    """The events after which work may be due are one set (``runs.events.WORK_EVENTS``),
    which the in-process workers and the long-polling claims both wake on: each service
    that queues an attempt appends one of them, so no path leaves workers asleep."""
    from runs.events import WORK_EVENTS
    from runs.models import RunEvent

    def woke(run_id: str) -> bool:
        last = (
            RunEvent.objects.filter(run_id=run_id).order_by("-seq").values_list("type", flat=True)
        )
        return any(t in WORK_EVENTS for t in list(last)[:3])

    run = start()
    assert woke(run.id)  # created
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="s", state={})
    services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="input_required",
        prompt="?",
        accepted_schema={"x": "string"},
    )
    request = Run.objects.get(pk=run.id).pending_request
    services.run_resume(run_id=run.id, request_id=request.id, checkpoint_id=cp.id, value={"x": "y"})
    assert woke(run.id)  # resumed
    lease = claim()
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="shutdown"
    )
    assert woke(run.id)  # handed over
    lease = claim()
    services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "x"})
    services.run_retry(run_id=run.id, reason="again")
    assert woke(run.id)  # retried
    lease = claim()
    Attempt.objects.filter(pk=lease.attempt_id).update(
        lease_expires_at=db_now() - dt.timedelta(seconds=1)
    )
    services.leases_expire()
    assert woke(run.id)  # requeued after a lost lease
    services.run_pause(run_id=run.id, reason="look")
    request = Run.objects.get(pk=run.id).pending_request
    services.run_resume(
        run_id=run.id, request_id=request.id, checkpoint_id=request.checkpoint_id, value=None
    )
    assert woke(run.id)  # continued


def test_the_in_process_runtime_and_a_lease_over_http_get_the_same_answers() -> None:
    """Which answers a resumed step receives is one function
    (``runs.selectors.answers_for_lease``): the runtime in process and the worker API's
    lease read it, so a step sees the same answers wherever it runs."""
    from api.worker_protocol import full_lease
    from runtime.selectors import answers_for

    run = start()
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="s", state={})
    services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="input_required",
        prompt="?",
        accepted_schema={"x": "string"},
        step_id="s.ask",
    )
    request = Run.objects.get(pk=run.id).pending_request
    services.run_resume(run_id=run.id, request_id=request.id, checkpoint_id=cp.id, value={"x": "y"})
    lease = claim()
    in_process = answers_for(lease)
    over_http = full_lease(lease)["answers"]
    assert [a["request_id"] for a in over_http] == [a.request_id for a in in_process.values()]
    assert in_process["s.ask"].value == over_http[0]["answer"] == {"x": "y"}


def test_one_after_commit_path_publishes_a_transactions_events(
    django_capture_on_commit_callbacks: object,
) -> None:
    """``runs.events`` publishes each committed transaction once (Zulip's
    ``send_event_on_commit``): one on-commit callback hands every event to every publisher,
    the live broadcast and the in-process listeners alike; no model signal is involved."""
    from django.db.models.signals import post_save

    from runs.events import Changes, on_run_changed, remove_run_changed
    from runs.models import RunEvent

    assert not post_save.has_listeners(RunEvent)
    heard: list[tuple[str, str]] = []

    def listener(run_id: str, event_type: str) -> None:
        heard.append((run_id, event_type))

    on_run_changed(listener)
    try:
        with django_capture_on_commit_callbacks(execute=True):  # type: ignore[operator]
            run = start()
        heard.clear()
        with django_capture_on_commit_callbacks(execute=True) as callbacks:  # type: ignore[operator]
            services.run_cancel(run_id=run.id, reason="not needed")
    finally:
        remove_run_changed(listener)
    [changes] = [c for c in callbacks if isinstance(c, Changes)]
    assert len(callbacks) == 1  # one callback for the transaction, whatever listens
    assert changes.run_ids == {run.id} and changes.sent
    assert heard == changes.events
    assert (run.id, "run.cancelled") in heard


def test_only_the_backend_module_asks_which_database_this_is() -> None:
    """The PostgreSQL/SQLite forks are found in one search: every one asks
    ``runs.db.postgresql()`` (or ``sqlite()``), whose docstring lists them and why."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    asking = []
    for app in ("config", "runs", "ledger", "runtime", "api", "dashboard", "live"):
        for path in (root / app).rglob("*.py"):
            if "migrations" in path.parts or path.name == "db.py":
                continue
            if re.search(r"\.vendor\b", path.read_text(encoding="utf-8")):
                asking.append(str(path.relative_to(root)))
    assert asking == []


def test_the_live_sockets_render_the_page_builders_never_a_view() -> None:
    """``live`` re-renders what the dashboard's pages show from ``dashboard.pages``; a chain
    of imports from ``live`` to ``dashboard.views`` (a view's request handling, its forms'
    replies) is the boundary broken, even through a builder that imports a view."""
    import grimp

    graph = grimp.build_graph("live", "dashboard", "runs", "ledger", cache_dir=None)
    assert graph.find_shortest_chains(importer="live", imported="dashboard.views") == set()
    assert (
        graph.find_shortest_chains(importer="dashboard.pages", imported="dashboard.views") == set()
    )
    # What live renders does come from the builders (the test would pass vacuously if
    # the consumers stopped importing them).
    used = {chain[-1] for chain in graph.find_shortest_chains("live", "dashboard.pages")}
    pages = {"cards", "inbox", "runs", "workers"}
    assert {f"dashboard.pages.{name}" for name in pages} <= used
