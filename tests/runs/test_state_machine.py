"""A property-based walk over the run lifecycle (hypothesis ``RuleBasedStateMachine``).

Rules call the real services in any order, with current and stale leases, right
and wrong ids. Refusals are fine; what must hold after every step is listed in the
invariants.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import time_machine
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runs import services
from runs.errors import HoldpointError
from runs.models import Attempt, InputRequest, Run, RunEvent
from runs.services import Lease
from runs.states import TERMINAL


class RunLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.leases: list[Lease] = []
        self.max_epochs = (0, 0)
        self.last_status = ""
        self.retried = False

    @initialize()
    def start_run(self) -> None:
        self.run_id = services.run_start(agent="test-agent", input={"n": 1}).id
        self.last_status = "queued"

    def teardown(self) -> None:
        # Leave nothing claimable for the next example (they share the test transaction).
        run = Run.objects.get(pk=self.run_id)
        if run.status not in TERMINAL and run.status != "cancel_requested":
            services.run_cancel(run_id=self.run_id)

    def call(self, func: Any, **kwargs: Any) -> Any:
        try:
            return func(**kwargs)
        except HoldpointError:
            return None

    def epochs(self, lease: Lease) -> dict[str, Any]:
        return {
            "attempt_id": lease.attempt_id,
            "lease_epoch": lease.lease_epoch,
            "cancel_epoch": lease.cancel_epoch,
        }

    @rule()
    def claim(self) -> None:
        lease = self.call(services.attempt_claim, worker_id="w", agents=["test-agent"])
        if lease is not None:
            assert lease.run_id == self.run_id
            self.leases.append(lease)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def checkpoint(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        self.call(services.checkpoint_save, **self.epochs(lease), step="s", state={"i": 1})

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), kind=st.sampled_from(["input_required", "auth_required"]))
    def interrupt(self, data: st.DataObject, kind: str) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        run = Run.objects.get(pk=self.run_id)
        if run.latest_checkpoint_id is None:
            return
        self.call(
            services.attempt_interrupt,
            **self.epochs(lease),
            checkpoint_id=run.latest_checkpoint_id,
            kind=kind,
            prompt="Which versions?",
            accepted_schema={"versions": "string[]"},
            action={"tool": "config_store", "target": "x"},
            expires_in=3600,
        )

    @rule(right_checkpoint=st.booleans(), valid=st.booleans())
    def resume(self, right_checkpoint: bool, valid: bool) -> None:
        request = InputRequest.objects.filter(run_id=self.run_id).order_by("-created_at").first()
        if request is None:
            return
        value = (
            ({"decision": "approve"} if request.kind == "auth_required" else {"versions": ["v1"]})
            if valid
            else {"nope": 1}
        )
        self.call(
            services.run_resume,
            run_id=self.run_id,
            request_id=request.id,
            checkpoint_id=request.checkpoint_id if right_checkpoint else "cp_wrong",
            value=value,
        )

    @rule()
    def cancel(self) -> None:
        self.call(services.run_cancel, run_id=self.run_id, reason="hypothesis")

    @rule(from_first=st.booleans())
    def retry(self, from_first: bool) -> None:
        first = Run.objects.get(pk=self.run_id).checkpoints.order_by("number").first()
        run = self.call(
            services.run_retry,
            run_id=self.run_id,
            reason="again",
            from_checkpoint_id=first.id if (first and from_first) else None,
        )
        if run is not None:
            self.retried = True

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        self.call(services.attempt_complete, **self.epochs(lease), result={"ok": True})

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), error_type=st.sampled_from(["Timeout", "ValueError"]))
    def fail(self, data: st.DataObject, error_type: str) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        self.call(
            services.attempt_fail, **self.epochs(lease), error={"type": error_type, "message": "m"}
        )

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), reason=st.sampled_from(["cancelled", "shutdown"]))
    def release(self, data: st.DataObject, reason: str) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        self.call(
            services.attempt_release,
            attempt_id=lease.attempt_id,
            lease_epoch=lease.lease_epoch,
            reason=reason,
        )

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))
        self.call(
            services.attempt_heartbeat, attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch
        )

    @rule()
    def lease_runs_out(self) -> None:
        Attempt.objects.filter(run_id=self.run_id, status="running").update(
            lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
        )
        services.leases_expire()

    @rule()
    def time_passes_past_the_question(self) -> None:
        with time_machine.travel(timezone.now() + dt.timedelta(hours=2)):
            services.requests_expire()

    @rule()
    def sweep_backoffs(self) -> None:
        services.backoffs_due()

    @invariant()
    def at_most_one_live_attempt_and_lease(self) -> None:
        if not hasattr(self, "run_id"):
            return
        live = Attempt.objects.filter(run_id=self.run_id, status__in=["queued", "running"])
        assert live.count() <= 1
        now = timezone.now()
        assert (
            Attempt.objects.filter(
                run_id=self.run_id, status="running", lease_expires_at__gt=now
            ).count()
            <= 1
        )

    @invariant()
    def epochs_never_decrease(self) -> None:
        if not hasattr(self, "run_id"):
            return
        run = Run.objects.get(pk=self.run_id)
        assert run.cancel_epoch >= self.max_epochs[0]
        assert run.lease_epoch >= self.max_epochs[1]
        self.max_epochs = (run.cancel_epoch, run.lease_epoch)

    @invariant()
    def event_seq_has_no_gaps(self) -> None:
        if not hasattr(self, "run_id"):
            return
        seqs = list(
            RunEvent.objects.filter(run_id=self.run_id)
            .order_by("seq")
            .values_list("seq", flat=True)
        )
        assert seqs == list(range(1, len(seqs) + 1))
        assert Run.objects.get(pk=self.run_id).last_event_seq == len(seqs)

    @invariant()
    def terminal_stays_terminal_unless_retried(self) -> None:
        if not hasattr(self, "run_id"):
            return
        status = Run.objects.get(pk=self.run_id).status
        if self.last_status in TERMINAL and not self.retried:
            assert status == self.last_status
        self.last_status = status
        self.retried = False

    @invariant()
    def every_attempt_but_the_newest_is_finished(self) -> None:
        if not hasattr(self, "run_id"):
            return
        statuses = list(
            Attempt.objects.filter(run_id=self.run_id)
            .order_by("number")
            .values_list("status", flat=True)
        )
        assert all(s not in ("queued", "running") for s in statuses[:-1])

    @invariant()
    def the_current_attempt_is_the_newest(self) -> None:
        if not hasattr(self, "run_id"):
            return
        run = Run.objects.get(pk=self.run_id)
        newest = Attempt.objects.filter(run_id=self.run_id).order_by("-number").first()
        assert run.current_attempt_id == (newest.id if newest else None)


@pytest.mark.slow
@pytest.mark.django_db
def test_it_keeps_the_run_lifecycle_invariants() -> None:
    RunLifecycle.TestCase.settings = settings(
        max_examples=60,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    RunLifecycle.TestCase().runTest()
