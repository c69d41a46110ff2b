from __future__ import annotations

from django.apps import AppConfig


class LiveConfig(AppConfig):
    name = "live"
    verbose_name = "Live dashboard"

    def ready(self) -> None:
        from live import broadcast

        # One push per committed transaction that changed runs: the run store knows
        # nothing of the sockets, it only saves events (a post_save signal).
        broadcast.connect_signals()
