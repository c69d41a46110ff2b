"""The chaos run's invariant checks find what they are meant to find.

A check that cannot fail proves nothing: each test builds a real history with the run
services, confirms the check passes on it, then breaks the history the way a bug would
(with raw SQL, since the services refuse to) and expects the check to name it.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from chaos import invariants
from runs import services
from runs.models import Run
from tests.conftest import TEST_AGENT

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _conn() -> Any:
    connection.ensure_connection()
    return connection.connection


def _claimed_run() -> tuple[Run, Any]:
    run = services.run_start(agent=TEST_AGENT, input={"n": 1})
    lease = services.attempt_claim(worker_id="w1")
    assert lease is not None and lease.run_id == run.id
    services.checkpoint_save(
        attempt_id=lease.attempt_id,
        lease_epoch=lease.lease_epoch,
        cancel_epoch=lease.cancel_epoch,
        step="next",
        state={},
    )
    return run, lease


def _names(checks: list[invariants.Check]) -> dict[str, int]:
    return {c.name: c.violations for c in checks}


def test_it_finds_nothing_wrong_in_a_clean_history() -> None:
    _run, lease = _claimed_run()
    services.attempt_complete(
        attempt_id=lease.attempt_id,
        lease_epoch=lease.lease_epoch,
        cancel_epoch=lease.cancel_epoch,
        result={"ok": True},
    )
    checks = invariants.all_checks(
        _conn(),
        posts={},
        without_key=0,
        log=[],
        samples={},
        config_root=Path("/nonexistent"),
        mail_dir=Path("/nonexistent"),
    )
    assert all(c.violations == 0 for c in checks), [(c.name, c.examples) for c in checks]
    assert _names(checks)["event seq gap-free per run"] == 0
    assert next(c for c in checks if c.name.startswith("no write accepted")).checked == 2


def test_it_finds_a_gap_in_the_event_seq() -> None:
    run, _ = _claimed_run()
    assert invariants.event_seq(_conn()).violations == 0
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM runs_runevent WHERE run_id = %s AND seq = 2", [run.id])
    check = invariants.event_seq(_conn())
    assert check.violations == 1
    assert run.id in check.examples[0]


def test_it_finds_a_result_written_after_the_cancel_with_the_old_epoch() -> None:
    run, lease = _claimed_run()
    services.run_cancel(run_id=run.id, reason="stop")
    after_cancel, stale = invariants.fenced_writes(_conn())
    assert (after_cancel.violations, stale.violations) == (0, 0)
    # What a missing fence would let through: the worker's result, after the cancel.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_runevent (run_id, seq, type, actor, payload, created_at) "
            "VALUES (%s, 99, 'run.succeeded', 'worker:w1', %s::jsonb, now())",
            [run.id, f'{{"attempt_id": "{lease.attempt_id}"}}'],
        )
    after_cancel, stale = invariants.fenced_writes(_conn())
    assert after_cancel.violations == 1
    assert stale.violations == 1
    assert "(1,0)" in stale.examples[0] and "in force (1,1)" in stale.examples[0]


def test_it_finds_a_lease_epoch_that_went_down() -> None:
    run, _ = _claimed_run()
    assert invariants.epochs(_conn(), {run.id: [(1, 0), (2, 0)]}).violations == 0
    check = invariants.epochs(_conn(), {run.id: [(2, 0), (1, 0)]})
    assert check.violations == 1


def test_it_finds_a_run_left_in_flight_and_an_orphaned_key() -> None:
    run, _ = _claimed_run()
    assert invariants.end_states(_conn()).violations == 1  # running
    # Backing off until later is a waiting state; long past its time, it is stuck.
    Run.objects.filter(pk=run.pk).update(
        status="waiting", not_before=timezone.now() + timedelta(minutes=5)
    )
    assert invariants.end_states(_conn()).violations == 0
    Run.objects.filter(pk=run.pk).update(not_before=timezone.now() - timedelta(minutes=5))
    assert invariants.end_states(_conn()).violations == 1
    assert invariants.idempotency_orphans(_conn()).violations == 0
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_idempotencyrecord (principal, key, fingerprint, method, path, "
            "state, owner, locked_until, response_content_type, created_at, expires_at) VALUES "
            "('user:1', 'k', 'f', 'POST', '/x', 'in_progress', 'o', now() - interval '1 s', '', "
            "now(), now() + interval '1 day')"
        )
    assert invariants.idempotency_orphans(_conn()).violations == 1


def test_it_finds_deliveries_the_ledger_does_not_know() -> None:
    once, in_ledger = invariants.deliveries(_conn(), {"op-unknown": [1.0]}, without_key=1)
    assert once.violations == 0
    assert in_ledger.violations == 2


def test_it_finds_a_key_that_changed_state_twice() -> None:
    run, _ = _claimed_run()
    fresh = {"principal": "user:chaos-a", "key": "k1", "op": "cancel", "run_id": run.id}
    log = [{**fresh, "status": 202, "replayed": False}, {**fresh, "status": 202, "replayed": True}]
    assert invariants.control_keys(_conn(), log).violations == 0
    log.append({**fresh, "status": 202, "replayed": False})
    assert invariants.control_keys(_conn(), log).violations == 1


def test_it_finds_a_state_change_nobody_was_answered_for() -> None:
    run, _ = _claimed_run()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_runevent (run_id, seq, type, actor, payload, created_at) "
            "VALUES (%s, 98, 'run.cancel_requested', 'user:chaos-b', '{}'::jsonb, now())",
            [run.id],
        )
    check = invariants.control_keys(_conn(), [])
    assert check.violations == 1
    assert "0 keys that may have changed it" in check.examples[0]
    # A request that got a 5xx may have committed before its answer was lost: it counts.
    lost = {"principal": "user:chaos-b", "key": "k2", "op": "cancel", "run_id": run.id}
    log = [{**lost, "status": 500, "replayed": False}, {**lost, "status": 409, "replayed": False}]
    assert invariants.control_keys(_conn(), log).violations == 0


def test_it_counts_config_store_writes_and_mails_against_the_ledger(tmp_path) -> None:
    from django.test import override_settings

    from ledger import services as ledger
    from ledger.tools.config_store import ConfigStore
    from ledger.tools.mail import EmailTool

    _run, lease = _claimed_run()
    begun = ledger.side_effect_begin(
        attempt_id=lease.attempt_id,
        lease_epoch=lease.lease_epoch,
        cancel_epoch=lease.cancel_epoch,
        step_id="write",
        tool="config_store",
        target="auth/config.json",
        request={"document": "auth/config.json", "content": {"v": 1}},
    )
    root, mail_dir = tmp_path / "store", tmp_path / "mail"
    store = ConfigStore(root)
    store.write("auth/config.json", {"v": 1}, idempotency_key=begun.idempotency_key)
    message = {"to": "ops@example.com", "subject": "done", "body": "."}
    with override_settings(
        EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        EMAIL_FILE_PATH=str(mail_dir),
    ):
        EmailTool().execute(message, begun.idempotency_key)

    def check() -> tuple[invariants.Check, invariants.Check]:
        once, in_ledger = invariants.outside_effects(_conn(), config_root=root, mail_dir=mail_dir)
        return once, in_ledger

    once, in_ledger = check()
    assert (once.checked, once.violations, in_ledger.violations) == (2, 0, 0)

    # A write nobody recorded, and a mail sent twice with one key.
    store.write("auth/other.json", {"v": 2}, idempotency_key="stray-key")
    with override_settings(
        EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        EMAIL_FILE_PATH=str(mail_dir),
    ):
        EmailTool().execute(message, begun.idempotency_key)
    once, in_ledger = check()
    assert once.violations == 1 and "e-mail" in once.examples[0]
    assert in_ledger.violations == 1 and "stray-key" in in_ledger.examples[0]


def test_it_counts_notifications_sent_twice_and_lost(tmp_path, settings) -> None:
    from django.contrib.auth.models import User

    from ledger.notifications import _send_email, notifications_send
    from runs.models import Notification
    from tests.conftest import _user
    from tests.runs.factory import interrupted

    mail_dir = tmp_path / "mail"
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(mail_dir)
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {}
    alice: User = _user("alice", "approver")
    alice.email = "alice@example.com"
    alice.save()
    _run, _lease, _cp, req = interrupted(kind="auth_required")
    assert notifications_send() == 1

    def check() -> tuple[invariants.Check, invariants.Check]:
        once, kept = invariants.notifications(_conn(), {}, mail_dir)
        return once, kept

    once, kept = check()
    assert (once.checked, once.violations) == (1, 0)
    assert kept.checked == 2 and kept.violations == 0  # the reminder is not due yet
    # Notification e-mails are not side effects: the ledger's mail check leaves them out.
    assert invariants.mailed_keys(mail_dir) == ([], 0)

    # A sender that sent and then died before recording it, and its successor sending again.
    row = Notification.objects.select_related("request", "request__run", "user").get(
        request=req, kind="pending"
    )
    from django.utils import timezone

    _send_email([row], timezone.now())
    once, kept = check()
    assert once.violations == 1 and "sent 2 times" in once.examples[0]

    # A row recorded sent that nobody received, and one that failed for good.
    Notification.objects.filter(request=req, kind="reminder").update(
        status="sent", message_key="never-sent"
    )
    once, kept = check()
    assert kept.violations == 1 and "never received" in kept.examples[0]
    Notification.objects.filter(request=req, kind="reminder").update(status="failed")
    once, kept = check()
    assert kept.violations == 1 and "failed for good" in kept.examples[0]


def test_it_finds_a_due_notification_never_sent_and_leaves_webhook_keys_to_it() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Notification
    from tests.runs.factory import interrupted

    _run, _lease, _cp, req = interrupted(kind="auth_required")
    Notification.objects.create(
        key=f"{req.id}:group:admin:pending",
        request=req,
        kind="pending",
        channel="webhook",
        group="admin",
        due_at=timezone.now() - timedelta(minutes=5),
    )
    _once, kept = invariants.notifications(_conn(), {}, Path("/nonexistent"))
    assert kept.violations == 1 and "due and never sent" in kept.examples[0]
    posts = {f"{req.id}:group:admin:pending": [1.0]}
    _once, kept = invariants.notifications(_conn(), posts, Path("/nonexistent"))
    assert kept.violations == 0
    # The ledger's delivery check does not take a notification key for a side effect.
    assert all(c.violations == 0 for c in invariants.deliveries(_conn(), posts, 0))


def test_a_notification_a_sweeper_holds_is_in_flight_not_lost() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Notification
    from tests.runs.factory import interrupted

    _run, _lease, _cp, req = interrupted(kind="auth_required")
    row = Notification.objects.create(
        key=f"{req.id}:group:admin:pending",
        request=req,
        kind="pending",
        channel="webhook",
        group="admin",
        due_at=timezone.now() - timedelta(minutes=5),
        status="sending",
        attempts=1,
        locked_until=timezone.now() + timedelta(seconds=60),
    )
    _once, kept = invariants.notifications(_conn(), {}, Path("/nonexistent"))
    assert kept.violations == 0
    Notification.objects.filter(pk=row.pk).update(
        locked_until=timezone.now() - timedelta(seconds=1)
    )
    _once, kept = invariants.notifications(_conn(), {}, Path("/nonexistent"))
    assert kept.violations == 1 and "(sending, 1 attempts)" in kept.examples[0]
