from __future__ import annotations

from django.apps import AppConfig


class LiveConfig(AppConfig):
    name = "live"
    verbose_name = "Live dashboard"

    def ready(self) -> None:
        from live import broadcast

        # One push per committed transaction that changed runs: the run store knows
        # nothing of the sockets, it hands each commit's events to its publishers
        # (runs.events.on_commit_publish).
        broadcast.connect_signals()
