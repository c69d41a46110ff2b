from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs"

    def ready(self) -> None:
        from runs.idempotency import idempotency_records_purge
        from runs.services import history_purge, register_sweep, workers_sweep
        from runs.stats import stats_rollup

        # Expired Idempotency-Key records, and in-progress ones whose caller died.
        register_sweep("idempotency_records", idempotency_records_purge)
        # Events and checkpoints of runs finished longer ago than the retention setting.
        register_sweep("history", history_purge)
        # Workers that stopped calling: stale, then gone (pushed to the Workers page).
        register_sweep("workers", workers_sweep)
        # The operations page's hourly rollups (runs/stats.py), at most once a minute.
        register_sweep("stats", stats_rollup)
