"""The event types the side-effect ledger writes on a run's timeline, with their words.

They are ``side_effect.<what>``; the ``<what>`` of an outcome is the effect's new status
(``side_effect.confirmed``, ``.failed``, ``.unknown``, ``.compensated``, …).
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class SideEffectEvent(models.TextChoices):
    BEGUN = "side_effect.begun", _("Side effect started")
    CONFIRMED = "side_effect.confirmed", _("Side effect happened")
    FAILED = "side_effect.failed", _("Side effect did not happen")
    UNKNOWN = "side_effect.unknown", _("Side effect outcome unknown")
    REUSED = "side_effect.reused", _("Side effect already done; reused")
    LOOK_UP = "side_effect.look_up", _("Side effect looked up by key")
    RECONCILED = "side_effect.reconciled", _("Side effect reconciled")
    COMPENSATION_STARTED = "side_effect.compensation_started", _("Compensation started")
    COMPENSATED = "side_effect.compensated", _("Side effect compensated")
    COMPENSATION_FAILED = "side_effect.compensation_failed", _("Compensation failed")
    LATE_OUTCOME = "side_effect.late_outcome", _("Late outcome recorded")
    OUTCOME_IGNORED = "side_effect.outcome_ignored", _("Outcome ignored")


def outcome_event(status: str) -> SideEffectEvent:
    """The event that records an effect reaching ``status``."""
    return SideEffectEvent(f"side_effect.{status}")
