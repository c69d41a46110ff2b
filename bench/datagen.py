"""Bulk-generate consistent runs in SQL (``INSERT … SELECT generate_series``), fast enough for 1M.

The rows are what the services would have left behind: a run with its current
attempt (ended, with an error and one of 40 fingerprints when it failed; finished runs
have a small cost, for the operations page's figures) and its events (``last_event_seq`` matching), a waiting run with its
checkpoint and its pending ``InputRequest``. Ids carry the usual prefixes; their
26-character tail is a zero-padded serial with a batch tag instead of a ULID, which
keeps them unique and in creation order. The run <-> attempt foreign keys point both
ways; Django creates them ``DEFERRABLE INITIALLY DEFERRED``, so one transaction
inserts both sides.
"""

from __future__ import annotations

from typing import Any

# Shares of a "history" population (finished work, the common case of a big table).
MIXED_STATUS_SQL = """
CASE
  WHEN g %% 100 < 80 THEN 'succeeded'
  WHEN g %% 100 < 90 THEN 'failed'
  WHEN g %% 100 < 97 THEN 'cancelled'
  ELSE 'queued'
END
"""


def _ids(prefix: str, tag: str) -> str:
    # "run_" + tag (1 char) + 25-digit serial = 30 characters; sorts like creation order.
    return f"'{prefix}_{tag}' || lpad(g::text, 25, '0')"


def generate(conn: Any, *, kind: str, start: int, count: int, agent: str, tag: str = "B") -> None:
    """Insert ``count`` runs numbered ``start …`` of ``kind``: ``queued`` (claimable now),
    ``mixed`` (mostly finished history) or ``waiting`` (at a hold point, request pending)."""
    end = start + count - 1
    run_id = _ids("run", tag)
    att_id = _ids("att", tag)
    cp_id = _ids("cp", tag)
    req_id = _ids("req", tag)
    if kind == "queued":
        status = "'queued'"
        att_status = "'queued'"
    elif kind == "mixed":
        status = MIXED_STATUS_SQL
        att_status = f"""CASE ({MIXED_STATUS_SQL}) WHEN 'queued' THEN 'queued'
            WHEN 'cancelled' THEN 'aborted' ELSE ({MIXED_STATUS_SQL}) END"""
    elif kind == "waiting":
        status = "'input_required'"
        att_status = "'interrupted'"
    else:
        raise ValueError(kind)
    events = 3 if kind == "waiting" else 1
    # created_at spreads the runs over the past, one per 10 ms, newest last.
    created = "now() - ((%(end)s::bigint - g) * interval '10 milliseconds')"
    with conn.transaction():
        conn.execute(
            f"""
            INSERT INTO runs_run (id, agent, status, failure_class, failure_detail, input, result,
                approvals, cancel_epoch, lease_epoch, last_event_seq, not_before, cancel_reason,
                cost, created_at, updated_at, finished_at, created_by_id, current_attempt_id,
                latest_checkpoint_id, pending_request_id, pause_before, pause_reason,
                pause_actor)
            SELECT {run_id}, %(agent)s, s.status,
                CASE s.status WHEN 'failed' THEN 'transient' WHEN 'cancelled' THEN 'cancelled'
                    ELSE '' END,
                '', jsonb_build_object('n', g), NULL, '[]'::jsonb, 0,
                CASE WHEN s.status = 'queued' THEN 0 ELSE 1 END, {events},
                CASE WHEN s.status = 'queued' THEN {created} END, '',
                CASE WHEN s.status IN ('succeeded','failed') THEN (g %% 10) * 0.001 ELSE 0 END,
                {created}, {created},
                CASE WHEN s.status IN ('succeeded','failed','cancelled') THEN {created} END,
                NULL, {att_id},
                CASE WHEN %(waiting)s THEN {cp_id} END,
                CASE WHEN %(waiting)s THEN {req_id} END,
                '[]'::jsonb, '', ''
            FROM generate_series(%(start)s::bigint, %(end)s::bigint) g, LATERAL (SELECT {status} AS status) s
            """,
            {"agent": agent, "start": start, "end": end, "waiting": kind == "waiting"},
        )
        conn.execute(
            f"""
            INSERT INTO runs_attempt (id, number, status, reason, worker_id, lease_epoch,
                cancel_epoch, lease_expires_at, last_heartbeat_at, started_at, ended_at,
                error_class, error_type, error_message, error_step, error_fingerprint, cost,
                created_at, resume_from_id, resume_request_id, run_id)
            SELECT {att_id}, 1, {att_status}, 'initial',
                CASE WHEN {att_status} = 'queued' THEN '' ELSE 'gen' END,
                CASE WHEN {att_status} = 'queued' THEN NULL ELSE 1 END,
                CASE WHEN {att_status} = 'queued' THEN NULL ELSE 0 END,
                NULL, NULL, NULL,
                CASE WHEN {att_status} IN ('succeeded','failed','aborted') THEN {created} END,
                CASE WHEN {att_status} = 'failed' THEN 'transient' ELSE '' END,
                CASE WHEN {att_status} = 'failed' THEN 'TimeoutError' ELSE '' END,
                CASE WHEN {att_status} = 'failed' THEN 'upstream timed out' ELSE '' END,
                CASE WHEN {att_status} = 'failed' THEN 'call' ELSE '' END,
                CASE WHEN {att_status} = 'failed' THEN 'fp' || lpad((g %% 40)::text, 3, '0')
                    ELSE '' END,
                0, {created}, NULL, NULL, {run_id}
            FROM generate_series(%(start)s::bigint, %(end)s::bigint) g
            """,
            {"start": start, "end": end},
        )
        conn.execute(
            f"""
            INSERT INTO runs_runevent (seq, type, actor, payload, created_at, run_id)
            SELECT 1, 'run.created', 'system:datagen', '{{}}'::jsonb, {created}, {run_id}
            FROM generate_series(%(start)s::bigint, %(end)s::bigint) g
            """,
            {"start": start, "end": end},
        )
        if kind == "waiting":
            conn.execute(
                f"""
                INSERT INTO runs_checkpoint (id, number, step, state, created_at, attempt_id,
                    run_id)
                SELECT {cp_id}, 1, 'ask', jsonb_build_object('n', g), {created}, {att_id}, {run_id}
                FROM generate_series(%(start)s::bigint, %(end)s::bigint) g
                """,
                {"start": start, "end": end},
            )
            conn.execute(
                f"""
                INSERT INTO runs_inputrequest (id, kind, step_id, reason, prompt, accepted_schema,
                    context, action, expires_at, status, answer, answered_at, closed_reason,
                    closed_at, created_at, answered_by_id, attempt_id, checkpoint_id, run_id,
                    policy, edit_round, decisions)
                SELECT {req_id},
                    CASE WHEN g %% 5 = 0 THEN 'auth_required' ELSE 'input_required' END,
                    'ask', '', 'Which version?', '{{"type": "object"}}'::jsonb, '{{}}'::jsonb,
                    CASE WHEN g %% 5 = 0 THEN '{{"tool": "webhook"}}'::jsonb ELSE '{{}}'::jsonb END,
                    now() + ((g %% 1440) * interval '1 minute') + interval '1 hour', 'pending',
                    NULL, NULL, '', NULL, {created}, NULL, {att_id}, {cp_id}, {run_id},
                    '{{}}'::jsonb, 0, 0
                FROM generate_series(%(start)s::bigint, %(end)s::bigint) g
                """,
                {"start": start, "end": end},
            )
            conn.execute(
                f"""
                INSERT INTO runs_runevent (seq, type, actor, payload, created_at, run_id)
                SELECT e.seq, e.type, 'system:datagen', '{{}}'::jsonb, {created}, {run_id}
                FROM generate_series(%(start)s::bigint, %(end)s::bigint) g,
                     (VALUES (2, 'attempt.claimed'), (3, 'run.interrupted')) AS e(seq, type)
                """,
                {"start": start, "end": end},
            )
