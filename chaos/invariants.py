"""The invariants the chaos run checks, read from the database (plain SQL, no ORM).

Each check returns how many things it looked at and the violations it found, with a
few examples. The harness prints them all and exits non-zero on any violation.
"""

from __future__ import annotations

import email
import itertools
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Worker writes that are fenced by (lease_epoch, cancel_epoch): intentions, never facts.
FENCED_EVENTS = {"checkpoint.saved", "run.succeeded", "run.interrupted", "attempt.failed"}


@dataclass
class Check:
    name: str
    checked: int = 0
    violations: int = 0
    examples: list[str] = field(default_factory=list)

    def bad(self, example: str) -> None:
        self.violations += 1
        if len(self.examples) < 5:
            self.examples.append(example)


def _rows(conn: Any, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    return list(conn.execute(sql, params or []).fetchall())


def live_leases(conn: Any) -> Check:
    check = Check("no run has two live leases")
    check.checked = _rows(conn, "SELECT count(*) FROM runs_run")[0][0]
    for run_id, count in _rows(
        conn,
        "SELECT run_id, count(*) FROM runs_attempt WHERE status = 'running' "
        "GROUP BY run_id HAVING count(*) > 1",
    ):
        check.bad(f"{run_id}: {count} running attempts")
    return check


def epochs(conn: Any, samples: dict[str, list[tuple[int, int]]] | None = None) -> Check:
    """Lease epochs grow with every attempt and every claim; cancel epochs with every cancel;
    a run's epochs sampled during the run never went down."""
    check = Check("epochs never decrease")
    for run_id, number, epoch, previous in _rows(
        conn,
        "SELECT run_id, number, lease_epoch, prev FROM (SELECT run_id, number, lease_epoch, "
        "lag(lease_epoch) OVER (PARTITION BY run_id ORDER BY number) AS prev "
        "FROM runs_attempt WHERE lease_epoch IS NOT NULL) a",
    ):
        check.checked += 1
        if previous is not None and epoch <= previous:
            check.bad(f"{run_id} attempt {number}: lease_epoch {epoch} after {previous}")
    for kind, key in (("attempt.claimed", "lease_epoch"), ("run.cancel_requested", "cancel_epoch")):
        for run_id, seq, value, previous in _rows(
            conn,
            "SELECT run_id, seq, v, lag(v) OVER (PARTITION BY run_id ORDER BY seq) FROM ("
            "SELECT run_id, seq, (payload ->> %s)::int AS v FROM runs_runevent WHERE type = %s) e",
            [key, kind],
        ):
            check.checked += 1
            if previous is not None and value <= previous:
                check.bad(f"{run_id} #{seq} {kind}: {key} {value} after {previous}")
    for run_id, seen in (samples or {}).items():
        for (lease_a, cancel_a), (lease_b, cancel_b) in itertools.pairwise(seen):
            check.checked += 1
            if lease_b < lease_a or cancel_b < cancel_a:
                check.bad(f"{run_id}: sampled ({lease_a},{cancel_a}) then ({lease_b},{cancel_b})")
    return check


def event_seq(conn: Any) -> Check:
    check = Check("event seq gap-free per run")
    for run_id, count, low, high, last in _rows(
        conn,
        "SELECT r.id, count(e.id), min(e.seq), max(e.seq), r.last_event_seq FROM runs_run r "
        "LEFT JOIN runs_runevent e ON e.run_id = r.id GROUP BY r.id, r.last_event_seq",
    ):
        check.checked += 1
        if count != high or low != 1 or high != last:
            check.bad(f"{run_id}: {count} events, seq {low}..{high}, last_event_seq {last}")
    return check


def fenced_writes(conn: Any) -> tuple[Check, Check]:
    """Walk every run's events in order: a worker write must carry the epochs in force.

    After a cancel was accepted (``run.cancel_requested``) and before a retry, no
    fenced write of a worker may appear at all ("no result after cancel").
    """
    after_cancel = Check("no result committed after a cancel was accepted")
    stale = Check("no write accepted from a stale epoch")
    attempts = {
        a: (lease, cancel)
        for a, lease, cancel in _rows(
            conn, "SELECT id, lease_epoch, cancel_epoch FROM runs_attempt"
        )
    }
    request_attempt = dict(_rows(conn, "SELECT id, attempt_id FROM runs_inputrequest"))
    state: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"lease": 0, "cancel": 0, "cancelled": False}
    )
    for run_id, seq, type_, actor, payload in _rows(
        conn,
        "SELECT run_id, seq, type, actor, payload FROM runs_runevent ORDER BY run_id, seq",
    ):
        payload = payload if isinstance(payload, dict) else json.loads(payload or "{}")
        run = state[run_id]
        if type_ == "attempt.claimed":
            run["lease"] = int(payload.get("lease_epoch", run["lease"]))
        elif type_ == "run.cancel_requested":
            run["cancel"] = int(payload.get("cancel_epoch", run["cancel"]))
            run["cancelled"] = True
        elif type_ == "run.retried":
            run["cancelled"] = False
        if type_ not in FENCED_EVENTS or not str(actor).startswith("worker:"):
            continue
        stale.checked += 1
        after_cancel.checked += 1
        if run["cancelled"]:
            after_cancel.bad(f"{run_id} #{seq} {type_} after the cancel was accepted")
        attempt_id = payload.get("attempt_id") or request_attempt.get(payload.get("request_id"))
        epochs_at_claim = attempts.get(attempt_id)
        if epochs_at_claim is None:
            stale.bad(f"{run_id} #{seq} {type_}: no attempt to check")
            continue
        lease, cancel = epochs_at_claim
        if lease != run["lease"] or cancel != run["cancel"]:
            stale.bad(
                f"{run_id} #{seq} {type_} by {attempt_id} with epochs ({lease},{cancel}); "
                f"in force ({run['lease']},{run['cancel']})"
            )
    return after_cancel, stale


# A run backing off (``waiting``) is parked until ``not_before``; it counts as waiting
# while that time is ahead (or only just passed), and as stuck once it is well past.
UNSETTLED_SQL = (
    "SELECT id, status, not_before FROM runs_run WHERE status NOT IN "
    "('succeeded', 'failed', 'cancelled', 'input_required', 'auth_required') "
    "AND NOT (status = 'waiting' AND not_before > now() - interval '10 seconds')"
)


def end_states(conn: Any) -> Check:
    check = Check("every run ends in a final or waiting state")
    check.checked = _rows(conn, "SELECT count(*) FROM runs_run")[0][0]
    for run_id, status, not_before in _rows(conn, UNSETTLED_SQL):
        check.bad(f"{run_id}: {status}" + (f" (due {not_before})" if not_before else ""))
    return check


def idempotency_orphans(conn: Any) -> Check:
    check = Check("no orphaned in-progress idempotency record")
    check.checked = _rows(conn, "SELECT count(*) FROM runs_idempotencyrecord")[0][0]
    for principal, key, locked in _rows(
        conn,
        "SELECT principal, key, locked_until FROM runs_idempotencyrecord "
        "WHERE state = 'in_progress' AND locked_until < now()",
    ):
        check.bad(f"{principal} {key!r} in progress, lease ran out at {locked}")
    return check


def _has_table(conn: Any, name: str) -> bool:
    return bool(_rows(conn, "SELECT to_regclass(%s) IS NOT NULL", [name])[0][0])


# A notification's key (runs/services/notifications.py): request + recipient + kind. Its
# webhook POSTs reach the same receiver as the ledger's and are counted by ``notifications``.
_NOTIFICATION_KEY = re.compile(r"^req_[^:]+:(user|group):[^:]+:(pending|reminder|escalation)$")


def is_notification_key(key: str) -> bool:
    return bool(_NOTIFICATION_KEY.match(key))


def deliveries(conn: Any, posts: dict[str, list[float]], without_key: int) -> list[Check]:
    """The receiver's count against the ledger's record."""
    posts = {key: times for key, times in posts.items() if not is_notification_key(key)}
    once = Check("every webhook delivery happened at most once per idempotency key")
    in_ledger = Check("every side effect that happened is in the ledger")
    once.checked = in_ledger.checked = len(posts) + without_key
    for _ in range(without_key):
        in_ledger.bad("a POST without an Idempotency-Key")
    if not _has_table(conn, "ledger_sideeffect"):
        if posts:
            in_ledger.bad(f"{len(posts)} keys delivered but there is no ledger table")
        return [once, in_ledger]
    ledger = {
        key: (status, outcome_at)
        for key, status, outcome_at in _rows(
            conn,
            "SELECT idempotency_key, status, extract(epoch FROM outcome_at) FROM ledger_sideeffect",
        )
    }
    for key, times in posts.items():
        if key not in ledger:
            in_ledger.bad(f"key {key!r} was delivered but the ledger has no side effect for it")
            continue
        status, outcome_at = ledger[key]
        # The receiver performs the effect once per key (it is idempotent); what the ledger
        # must never do is send a key again after it recorded that the effect happened.
        if len(times) > 1 and outcome_at is not None and status == "confirmed":
            later = [t for t in times[1:] if t > float(outcome_at) + 0.001]
            if later:
                once.bad(f"key {key!r} sent again {len(later)}x after it was confirmed")
    return [once, in_ledger]


# Django's file mail backend appends each message to the connection's file, then this line.
_MAIL_SEPARATOR = b"\n" + b"-" * 79 + b"\n"


def config_store_keys(root: Path) -> list[str]:
    """The idempotency key of every version the config store holds (one per write)."""
    keys = []
    for path in sorted((root / "docs").glob("**/@v/*.json")):
        keys.append(json.loads(path.read_text(encoding="utf-8"))["idempotency_key"])
    return keys


def mailed_keys(directory: Path) -> tuple[list[str], int]:
    """The ``X-Idempotency-Key`` of every message the file mail backend wrote, and how
    many messages had none."""
    keys, without = [], 0
    for path in sorted(directory.glob("*.log")) if directory.is_dir() else []:
        for chunk in path.read_bytes().split(_MAIL_SEPARATOR):
            if not chunk.strip():
                continue
            message = email.message_from_bytes(chunk)
            if message.get("X-Holdpoint-Key"):
                continue  # a notification, not a side effect: counted by ``notifications``
            key = message.get("X-Idempotency-Key")
            if key:
                keys.append(str(key))
            else:
                without += 1
    return keys, without


def notification_mail_keys(directory: Path) -> list[str]:
    """The ``X-Holdpoint-Key`` of every notification e-mail written (a row's key, or a
    digest's ``digest:…`` key)."""
    keys = []
    for path in sorted(directory.glob("*.log")) if directory.is_dir() else []:
        for chunk in path.read_bytes().split(_MAIL_SEPARATOR):
            key = email.message_from_bytes(chunk).get("X-Holdpoint-Key") if chunk.strip() else None
            if key:
                # A long header is folded over lines; the key itself has no whitespace.
                keys.append("".join(str(key).split()))
    return keys


# A notification due this long before the check and not sent counts as lost: the sweeper
# (every second) has had its chance, even behind a person's digest interval.
NOTIFICATION_GRACE_SECONDS = 30


def notifications(conn: Any, posts: dict[str, list[float]], mail_dir: Path) -> list[Check]:
    """The notification outbox against what was received (issue 18).

    At most once per key: an e-mail (no mail server dedupes) at most once per key, strictly;
    a webhook key never POSTed again after the outbox recorded it sent (the receiver, like
    a real one, honours the ``Idempotency-Key``). None lost: every row recorded sent was
    received; none failed for good; none due (with a grace) for a request still pending
    was left unsent.
    """
    once = Check("every notification was sent at most once per key")
    kept = Check("no notification was lost")
    # Rows a sweeper holds when the check runs ("sending", lease running) are in flight,
    # not lost; the crash test of tests/ledger/test_notifications.py shows they go later.
    if not _has_table(conn, "runs_notification"):
        return [once, kept]
    mails = Counter(notification_mail_keys(mail_dir))
    hooks = {key: times for key, times in posts.items() if is_notification_key(key)}
    for key, count in mails.items():
        once.checked += 1
        if count > 1:
            once.bad(f"e-mail {key!r} sent {count} times")
    for (
        key,
        channel,
        status,
        message_key,
        sent_at,
        overdue,
        still_pending,
        in_flight,
        tries,
    ) in _rows(
        conn,
        "SELECT n.key, n.channel, n.status, n.message_key, extract(epoch FROM n.sent_at), "
        "n.due_at <= now() - make_interval(secs => %s), r.status = 'pending', "
        "n.status = 'sending' AND n.locked_until > now(), n.attempts "
        "FROM runs_notification n JOIN runs_inputrequest r ON r.id = n.request_id",
        [NOTIFICATION_GRACE_SECONDS],
    ):
        kept.checked += 1
        if channel == "webhook":
            times = hooks.get(key, [])
            once.checked += 1
            if sent_at is not None and any(t > float(sent_at) + 0.001 for t in times[1:]):
                once.bad(f"webhook {key!r} POSTed again after it was recorded sent")
            delivered = bool(times)
        else:
            delivered = (message_key or key) in mails
        if status == "failed":
            kept.bad(f"{key}: failed for good")
        elif status == "sent" and not delivered:
            kept.bad(f"{key}: recorded sent, never received")
        elif in_flight:
            # Claimed by a sweeper (one the run killed, maybe): the next sweep sends it when
            # the claim's lease runs out (ledger/notifications.py), after the run's end.
            continue
        elif status in ("pending", "sending") and overdue and still_pending and not delivered:
            kept.bad(f"{key}: due and never sent ({status}, {tries} attempts)")
    return [once, kept]


def outside_effects(conn: Any, *, config_root: Path, mail_dir: Path) -> list[Check]:
    """The config store's versions and the mails sent, against the ledger.

    Neither is an idempotent API like the webhook receiver: the config store dedupes by
    key itself (``find`` before ``write``), a mail server does not at all. So here "at
    most once" is strict: one version, one message per key.
    """
    once = Check("every config-store write and every e-mail happened at most once per key")
    in_ledger = Check("every config-store write and every e-mail is in the ledger")
    ledger: set[str] = set()
    for key, compensation_key in _rows(
        conn, "SELECT idempotency_key, compensation_idempotency_key FROM ledger_sideeffect"
    ):
        ledger.add(key)
        if compensation_key:
            ledger.add(compensation_key)
    mail, without = mailed_keys(mail_dir)
    for kind, keys in (("config-store version", config_store_keys(config_root)), ("e-mail", mail)):
        counts = Counter(keys)
        once.checked += len(counts)
        in_ledger.checked += len(counts)
        for key, count in counts.items():
            if count > 1:
                once.bad(f"{kind}: key {key!r} took effect {count} times")
            if key not in ledger:
                in_ledger.bad(f"{kind}: key {key!r} has no side effect in the ledger")
    in_ledger.checked += without
    for _ in range(without):
        in_ledger.bad("an e-mail without an X-Idempotency-Key")
    return [once, in_ledger]


def control_keys(conn: Any, log: list[dict[str, Any]]) -> Check:
    """Each control request with one key changed state at most once.

    From the client side: per (principal, key), at most one fresh (not replayed) 2xx.
    From the database: per run and operation, no more state changes by the chaos
    clients than keys that may have changed it: a key with a fresh 2xx, or a key
    whose request got a 5xx or no answer at all. (A request can commit its change and
    then lose its answer, here to the PostgreSQL restart; 5xx answers are not stored,
    so the client's retry with the same key runs the service again, which refuses with
    the 409 that says what happened. The key still changed the state once.)
    """
    check = Check("each control request with one key changed state at most once")
    fresh: dict[tuple[str, str], int] = defaultdict(int)
    may_have_applied: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
    for entry in log:
        check.checked += 1
        key = (entry["principal"], entry["key"])
        if 200 <= entry["status"] < 300 and not entry["replayed"]:
            fresh[key] += 1
            may_have_applied[(entry["run_id"], entry["op"])].add(key)
        elif entry["status"] >= 500:
            may_have_applied[(entry["run_id"], entry["op"])].add(key)
    accepted = {target: len(keys) for target, keys in may_have_applied.items()}
    for (principal, key), count in fresh.items():
        if count > 1:
            check.bad(f"{principal} key {key!r} applied {count} times")
    event_for = {
        "cancel": "run.cancel_requested",
        "retry": "run.retried",
        "resume": "request.answered",
    }
    for run_id, type_, count in _rows(
        conn,
        "SELECT run_id, type, count(*) FROM runs_runevent WHERE actor LIKE 'user:chaos-%%' "
        "AND type = ANY(%s) GROUP BY run_id, type",
        [list(event_for.values())],
    ):
        op = next(o for o, t in event_for.items() if t == type_)
        if count > accepted.get((run_id, op), 0):
            check.bad(
                f"{run_id}: {count} {type_} events by the chaos clients, "
                f"{accepted.get((run_id, op), 0)} keys that may have changed it"
            )
    return check


def answered_once(conn: Any) -> Check:
    check = Check("a question is answered at most once")
    for request_id, count in _rows(
        conn,
        "SELECT payload ->> 'request_id', count(*) FROM runs_runevent "
        "WHERE type = 'request.answered' GROUP BY 1",
    ):
        check.checked += 1
        if count > 1:
            check.bad(f"{request_id} answered {count} times")
    return check


def all_checks(
    conn: Any,
    *,
    posts: dict[str, list[float]],
    without_key: int,
    log: list[dict[str, Any]],
    samples: dict[str, list[tuple[int, int]]],
    config_root: Path,
    mail_dir: Path,
) -> list[Check]:
    after_cancel, stale = fenced_writes(conn)
    return [
        live_leases(conn),
        epochs(conn, samples),
        event_seq(conn),
        after_cancel,
        stale,
        *deliveries(conn, posts, without_key),
        *outside_effects(conn, config_root=config_root, mail_dir=mail_dir),
        end_states(conn),
        idempotency_orphans(conn),
        control_keys(conn, log),
        answered_once(conn),
        *notifications(conn, posts, mail_dir),
    ]
