from __future__ import annotations

from django.apps import AppConfig


class HoldpointConfig(AppConfig):
    """The project's own wiring as an app, so that its system checks are registered."""

    name = "config"
    verbose_name = "Holdpoint configuration"

    def ready(self) -> None:
        from config import checks  # noqa: F401 - registers the deploy checks
