"""The only writers of side effects. See docs/ledger.md.

- ``side_effect_begin``: the intention, fenced; answers act / look_up / reuse.
- ``side_effect_record_outcome``: a fact, never fenced; late reports are flagged.
- ``side_effect_look_up``: ask the tool about a pending key and record the answer.
- ``side_effect_perform``: begin, look up or act, record — the whole rule in one call.
- ``side_effect_reconcile``: a person settles an unknown or stale pending effect.
- ``side_effect_compensate``: undo a confirmed effect under its own key.
- ``side_effects_look_up_stale``: the reconciler sweep.
"""

from __future__ import annotations

from ledger.services._common import (
    compensation_key_for,
    idempotency_key_for,
    needs_reconciliation_q,
    stale_pending_q,
)
from ledger.services.intents import (
    Begin,
    action_hash,
    approval_for,
    approved_action_hash,
    decision_for,
    edited_idempotency_key,
    side_effect_begin,
)
from ledger.services.outcomes import (
    LookUp,
    Performed,
    side_effect_look_up,
    side_effect_perform,
    side_effect_record_outcome,
)
from ledger.services.people import (
    compensation_preview,
    side_effect_compensate,
    side_effect_reconcile,
)
from ledger.services.reconciler import side_effects_look_up_stale

__all__ = [
    "Begin",
    "LookUp",
    "Performed",
    "action_hash",
    "approval_for",
    "approved_action_hash",
    "compensation_key_for",
    "compensation_preview",
    "decision_for",
    "edited_idempotency_key",
    "idempotency_key_for",
    "needs_reconciliation_q",
    "side_effect_begin",
    "side_effect_compensate",
    "side_effect_look_up",
    "side_effect_perform",
    "side_effect_reconcile",
    "side_effect_record_outcome",
    "side_effects_look_up_stale",
    "stale_pending_q",
]
